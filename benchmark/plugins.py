"""One registry pattern for every variation point (issue #87): methods, model families, end-task protocols, learning-
rate schedules and loss metrics are each a :class:`Registry` of named entries.

An entry is registered in code (an object, or a lazy ``"module:attr"`` target imported on first use, as the built-in
methods are), or by an installed package under the kind's entry-point group (``[project.entry-points."dapbench.
protocols"]``), read once on the first lookup. A name registered twice with different entries is a named error, an
unknown name gets did-you-mean, and a target that cannot be loaded names itself and leaves every other entry working.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from benchmark.errors import DapbenchError, did_you_mean

T = TypeVar("T")


class RegistrationError(DapbenchError, ValueError):
    """A name registered twice with different entries (a ``ValueError`` too: a plugin's programming error)."""


def _as_is(name: str, loaded: Any) -> Any:
    return loaded


def named_entry(kind: str, expected: type, instantiate: bool = False) -> Callable[[str, Any], Any]:
    """A registry's ``load`` for entries that are ``expected`` objects with a ``name``: what a target or entry point
    names (a class instantiated where ``instantiate``), refused unless it is one whose name is the entry's."""

    def load(name: str, loaded: Any) -> Any:
        entry = loaded() if instantiate and isinstance(loaded, type) and issubclass(loaded, expected) else loaded
        if not isinstance(entry, expected) or getattr(entry, "name", None) != name:
            raise DapbenchError(
                f"{kind} {name!r} loads {loaded!r}, which is no {expected.__name__} named {name!r}",
                "point the entry point at it (or its class), whose `name` is the entry's name",
            )
        return entry

    return load


class Registry(Generic[T]):
    """Named entries of one kind. ``kind`` names it in messages (``end-task protocol``), ``group`` is its entry-point
    group (None: code registrations only), ``how`` says how to register one (a fix in messages), ``setting`` is the
    option that names an entry (its unknown names read ``invalid finetune.protocol='x'``), and ``load`` turns what a
    lazy target or entry point names into the entry (a protocol class into its instance; it may also check it,
    raising :class:`DapbenchError`: :func:`named_entry`)."""

    def __init__(
        self,
        kind: str,
        group: str | None,
        how: str,
        load: Callable[[str, Any], T] = _as_is,
        targets: dict[str, str] | None = None,
        setting: str | None = None,
    ):
        self.kind, self.group, self.how, self._load, self.setting = kind, group, how, load, setting
        self._entries: dict[str, T | str] = dict(targets or {})  # as registered: a str is a lazy "module:attr" target
        self._loaded: dict[str, T] = {}  # lazy targets once imported (a registration compares what was registered)
        self._entry_points_read = group is None

    def add(self, name: str, entry: T | str) -> None:
        """Register ``entry`` (an object, or a ``"module:attr"`` target) under ``name``; the same entry again is a
        no-op, another one under a taken name a :class:`RegistrationError`."""
        known = self._entries.get(name)
        if known is not None and known is not entry and known != entry:
            raise RegistrationError(
                f"{self.kind} name {name!r} is registered twice: already registered as {_describe(known)}, now as"
                f" {_describe(entry)}",
                "give the new one its own name",
            )
        self._entries[name] = entry
        self._loaded.pop(name, None)

    def remove(self, name: str) -> None:
        """Forget ``name`` (a test's or a plugin's own registration); absent names are ignored."""
        self._entries.pop(name, None)
        self._loaded.pop(name, None)

    def names(self) -> list[str]:
        """Every registered name, in registration order (built-ins first, then entry points)."""
        self._read_entry_points()
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        self._read_entry_points()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __getitem__(self, name: str) -> T:
        """The entry ``name``, loaded (a ``KeyError`` where none is registered; :meth:`get` names it instead)."""
        self._read_entry_points()
        entry = self._entries[name]
        if not isinstance(entry, str):
            return entry
        if name not in self._loaded:
            self._loaded[name] = self._resolve(name, entry)
        return self._loaded[name]

    def items(self) -> list[tuple[str, T]]:
        """``(name, entry)`` pairs, every entry loaded."""
        return [(name, self[name]) for name in self.names()]

    def values(self) -> list[T]:
        """Every entry, loaded."""
        return [self[name] for name in self.names()]

    def find(self, name: str) -> T | None:
        """The entry ``name``, or None where none is registered."""
        return self[name] if name in self else None

    def get(self, name: str) -> T:
        """The entry ``name``; an unknown name is a named error with the closest registered names."""
        if name not in self:
            hint = did_you_mean(name, self._entries, ignore_case=True, form=" {}")
            unknown = f"unknown {self.kind} {name!r}."
            if self.setting:
                unknown = f"invalid {self.setting}={name!r}: no {self.kind} of that name is registered."
            raise DapbenchError(
                (unknown + hint).rstrip("."),
                f"use one of {', '.join(sorted(self._entries))} ({self.how})",
            )
        return self[name]

    def _resolve(self, name: str, target: str) -> T:
        module_name, _, attribute = target.partition(":")
        try:
            loaded = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:  # a broken plugin is named; every other entry keeps working
            where = f'[project.entry-points."{self.group}"]' if self.group else "its registration"
            raise DapbenchError(
                f"{self.kind} {name!r} is registered as {target}, which cannot be loaded ({type(exc).__name__}: {exc})",
                f"fix the plugin's target (module:attr, in its pyproject's {where}) and reinstall it, or uninstall it",
            ) from exc
        return self._load(name, loaded)

    def _read_entry_points(self) -> None:
        if self._entry_points_read:
            return
        self._entry_points_read = True
        for point in entry_points(group=self.group):
            self.add(point.name, point.value)


def _describe(entry: Any) -> str:
    if isinstance(entry, str):
        return entry
    owner = entry if isinstance(entry, type) or callable(entry) else type(entry)
    return f"{getattr(owner, '__module__', '?')}.{getattr(owner, '__qualname__', type(entry).__name__)}"
