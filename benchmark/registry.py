"""Method registry: built-in plugins from ``methods/`` plus third-party entry points (group ``dapbench.methods``), a
:class:`benchmark.plugins.Registry` like every other variation point's."""

from __future__ import annotations

from functools import cache

from benchmark.errors import DapbenchError
from benchmark.plugins import Registry as PluginRegistry

ENTRY_POINT_GROUP = "dapbench.methods"


def _checked_method(name: str, cls: type) -> type:
    """A loaded method class, refused where it declares another name than the one it is registered under."""
    if getattr(cls, "name", None) != name:
        raise DapbenchError(f"plugin {cls!r} declares name {getattr(cls, 'name', None)!r}, registered as {name!r}")
    return cls


class Registry(PluginRegistry[type]):
    """Maps method names to ``module:Class`` targets, imported lazily on first use."""

    def __init__(self, builtins: dict[str, str]):
        super().__init__(
            "method",
            ENTRY_POINT_GROUP,
            "see `dapbench list`; a plugin registers its class under the entry-point group dapbench.methods",
            load=_checked_method,
            targets=builtins,
        )

    def register(self, name: str, target: str) -> None:
        """Register ``target`` (``"module:Class"``) under ``name``; a clash is an error."""
        self.add(name, target)

    def names(self) -> list[str]:
        """Every registered method name, sorted."""
        return sorted(super().names())

    def canonical_name(self, name: str) -> str:
        """The registered spelling of ``name``, whatever its case (``DAS`` -> ``das``); unknown names unchanged
        (:meth:`get` names them with suggestions)."""
        names = self.names()
        if name in names:
            return name
        matches = [known for known in names if known.lower() == name.strip().lower()]
        return matches[0] if len(matches) == 1 else name


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
