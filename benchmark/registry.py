"""Method registry: built-in plugins from ``methods/`` plus third-party entry points."""

from __future__ import annotations

import difflib
import importlib
from functools import cache
from importlib.metadata import entry_points

from benchmark.errors import DapbenchError

ENTRY_POINT_GROUP = "dapbench.methods"


class Registry:
    """Maps method names to ``module:Class`` targets, imported lazily on first use."""

    def __init__(self, builtins: dict[str, str]):
        self._targets = dict(builtins)
        self._plugins_loaded = False

    def names(self) -> list[str]:
        """Every registered method name, sorted."""
        self._load_entry_points()
        return sorted(self._targets)

    def register(self, name: str, target: str) -> None:
        """Register ``target`` (``"module:Class"``) under ``name``; a clash is an error."""
        if name in self._targets and self._targets[name] != target:
            raise DapbenchError(
                f"method name {name!r} is registered twice ({self._targets[name]} and {target})",
                "rename one of the plugins",
            )
        self._targets[name] = target

    def canonical_name(self, name: str) -> str:
        """The registered spelling of ``name``, whatever its case (``DAS`` -> ``das``); unknown names unchanged
        (:meth:`get` names them with suggestions)."""
        self._load_entry_points()
        if name in self._targets:
            return name
        matches = [known for known in self._targets if known.lower() == name.strip().lower()]
        return matches[0] if len(matches) == 1 else name

    def get(self, name: str) -> type:
        """The method class registered as ``name``; unknown names get a did-you-mean error."""
        self._load_entry_points()
        if name not in self._targets:
            lowered = {known.lower(): known for known in self._targets}
            close = [lowered[m] for m in difflib.get_close_matches(name.lower(), lowered, n=3)]
            hint = f"did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise DapbenchError(
                f"unknown method {name!r}. {hint}".strip(),
                f"registered methods: {', '.join(sorted(self._targets))} (see `dapbench list`)",
            )
        target = self._targets[name]
        module_name, _, attr = target.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:  # a broken plugin is named; every other method keeps working
            raise DapbenchError(
                f"method {name!r} is registered as {target}, which cannot be loaded ({type(exc).__name__}: {exc})",
                "fix the plugin's entry point (module:Class, in its pyproject's"
                ' [project.entry-points."dapbench.methods"]) and reinstall it, or uninstall the plugin',
            ) from exc
        if getattr(cls, "name", None) != name:
            raise DapbenchError(f"plugin {self._targets[name]} declares name {cls.name!r}, registered as {name!r}")
        return cls

    def _load_entry_points(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            self.register(ep.name, ep.value)


@cache
def default_registry() -> Registry:
    """The process-wide registry: the built-in ``methods/`` plugins plus installed entry points."""
    from methods import BUILTIN_METHODS

    return Registry(BUILTIN_METHODS)


def installed_method(name: str) -> type | None:
    """The plugin class registered here as ``name``, or None where no such plugin is installed or loads."""
    try:
        return default_registry().get(name)
    except DapbenchError:
        return None
