"""Declared settings: every field of a configuration dataclass states its type and its range where it is defined,
and one function checks a whole dataclass against those declarations.

A field is declared with :func:`setting` (a number with bounds, a choice among names, a flag, a map keyed by
known names) instead of a bare default, so validation never depends on a hand-written list that a new field
could be missing from: :func:`check_settings` reads the declarations, and ``tests/test_settings.py`` fails for
a numeric or text field that declares no range or choices. Values are also coerced to one spelling here
(``1`` -> ``1.0`` for a float field, a list -> a tuple), so two spellings of one value are one configuration.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from benchmark.errors import DapbenchError, did_you_mean

TEXT_LIMIT = 1024
"""Characters a text setting may hold: longer than any path or hub id, short enough that no label or chart built from
it grows without bound."""
SETTING = "dapbench_setting"
"""The ``dataclasses.field`` metadata key of a declared setting."""


@dataclass(frozen=True)
class Declared:
    """What a field accepts: bounds for numbers (inclusive unless marked open), choices for names, and for a map
    the names its keys may take (checked by the owner, who knows them) and the bounds of its values."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: Collection | None = None
    """The accepted names; a registry (a dict) is read at every check, so a name registered later is accepted."""
    keys: str | None = None
    """For a map: what its keys name (``end task``, ``domain``); the owner checks them against the run's."""
    checked_by: str | None = None
    """For a value only the run's inputs can check (a method name, a path, a sequence): who checks it."""

    def describe(self) -> str:
        """The accepted values in words: ``a number > 0``, ``one of: a, b``."""
        if self.choices is not None:
            return "one of: " + ", ".join(map(str, self.choices))
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return "a finite number" + (" " + " and ".join(parts) if parts else "")

    def admits(self, value: float) -> bool:
        """Whether the number ``value`` lies inside the declared bounds."""
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))


def setting(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **declared) -> Any:
    """A dataclass field with its declaration (:class:`Declared` keyword arguments): ``setting(0.1, low=0,
    high=1, high_open=True)``, ``setting("fp16", choices=("no", "fp16", "bf16"))``."""
    metadata = {SETTING: Declared(**declared)}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declaration(field: dataclasses.Field) -> Declared | None:
    """A field's declaration, None for an undeclared field (flags and nested sections need none)."""
    return field.metadata.get(SETTING)


@functools.cache
def field_types(cls: type) -> Mapping[str, Any]:
    """The resolved annotation of every field of the dataclass ``cls`` (``typing.get_type_hints``), kept per class:
    resolving string annotations is slow, and a committed record's configuration is re-spelled on every load."""
    return types.MappingProxyType(typing.get_type_hints(cls))  # shared between callers: read-only


def check_settings(section: str, obj: Any) -> None:
    """Coerce every declared field of the frozen dataclass ``obj`` to its annotated type and check it against its
    declaration; the first bad value is a named error that says what is accepted."""
    hints = field_types(type(obj))
    for field in dataclasses.fields(obj):
        key = f"{section}.{field.name}" if section else field.name
        value = coerce_value(key, hints[field.name], getattr(obj, field.name))
        declared = declaration(field)
        if declared is not None:
            check_declared(key, value, declared)
        object.__setattr__(obj, field.name, value)  # frozen: the coerced spelling replaces the given one


def settings_view(cls: type, section: Any) -> Any:
    """An instance of the frozen dataclass ``cls`` with each of its fields read by name from ``section`` (a config
    section holding the union of several variants' fields): the settings one variant (a schedule, an end-task
    protocol) owns."""
    return cls(**{field.name: getattr(section, field.name) for field in dataclasses.fields(cls)})


def check_declared(key: str, value: Any, declared: Declared) -> None:
    """``value`` (already of the field's type) against ``declared``; None passes (the type allowed it)."""
    if isinstance(value, Mapping):
        items = [(f"{key}.{name}", item) for name, item in value.items()]
    else:
        items = [(key, item) for item in (value if isinstance(value, tuple) else [value])]
    for key, item in items:
        if item is None:
            continue
        if declared.choices is not None and item not in declared.choices:
            raise DapbenchError(f"invalid {key}={item!r}", declared.describe())
        if isinstance(item, int | float) and not isinstance(item, bool) and not declared.admits(item):
            raise DapbenchError(
                f"{key}={item!r} is out of range: it must be {declared.describe()}",
                f"set {key} to {declared.describe()}",
            )


def coerce_value(key: str, hint: Any, value: Any) -> Any:
    """``value`` in the one spelling of the annotated type ``hint`` (``float | None``, ``tuple[str, ...]``,
    ``dict[str, float]``, ...), or a named error; numbers must be finite and booleans are not numbers."""
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise DapbenchError(f"{key} cannot be null", f"set {key} to {_type_name(hint)}")
    kinds = [kind for kind in options if kind is not type(None)]
    errors = []
    for kind in kinds:
        try:
            return _coerce_to(key, kind, value)
        except DapbenchError as exc:
            errors.append(exc)
    raise errors[0]


def _coerce_to(key: str, kind: Any, value: Any) -> Any:
    if kind is Any:  # checked by its owner (a method's options by the method's config class)
        return value
    origin = typing.get_origin(kind)
    if origin is tuple:
        (item,) = typing.get_args(kind)[:1]
        items = [_parsed(v) for v in value.split(",")] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise DapbenchError(f"{key}={value!r} is not a list", f"write {key}=a,b or a JSON list")
        return tuple(_coerce_to(key, item, v) for v in items)
    if origin is dict:
        _, item = typing.get_args(kind)
        if not isinstance(value, Mapping):
            raise DapbenchError(f"{key}={value!r} is not a map", f"write {key}.<name>=<value>")
        return {str(k): _coerce_to(f"{key}.{k}", item, v) for k, v in value.items()}
    if kind is bool:
        if not isinstance(value, bool):
            raise DapbenchError(f"{key} expects true or false, got {value!r}", f"write {key}=true or {key}=false")
        return value
    if kind in (int, float):
        return _number(key, kind, value)
    if kind is str:
        if not isinstance(value, str):
            raise DapbenchError(f"{key} expects a name, got {value!r}", f"write {key}=<name>")
        if len(value) > TEXT_LIMIT:  # it becomes part of a row label, a file name or a chart's axis
            raise DapbenchError(
                f"{key} is {len(value):,} characters long, over the {TEXT_LIMIT} a setting may hold",
                f"write {key} shorter (a name, a path or a hub id)",
            )
        return value
    if dataclasses.is_dataclass(kind) and isinstance(value, kind):
        return value
    raise DapbenchError(f"{key}={value!r} is not a {_type_name(kind)}", f"set {key} to a {_type_name(kind)}")


def _number(key: str, kind: type, value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DapbenchError(f"{key} expects a number, got {value!r}", f"write {key}=<{kind.__name__}>")
    if not math.isfinite(value):
        raise DapbenchError(f"{key}={value!r} is not a finite number", f"set {key} to a finite {kind.__name__}")
    if kind is int:
        if isinstance(value, float):
            raise DapbenchError(f"{key} expects a whole number, got {value!r}", f"write {key}={int(value)}")
        return value
    return float(value)


def _parsed(text: str) -> Any:
    """One item of a comma-separated list: a JSON value (``2021``, ``true``) where it is one, else the text."""
    try:
        return json.loads(text.strip())
    except json.JSONDecodeError:
        return text.strip()


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


def check_known_keys(key: str, given: Collection[str], known: Collection[str], what: str) -> None:
    """A map keyed by names (``finetune.epochs`` by end task) may only name known ones; the first unknown key is
    a named error with the closest known names."""
    for name in sorted(set(given) - set(known)):
        hint = did_you_mean(name, known, n=2, form=" ({})")
        raise DapbenchError(
            f"unknown {what} {key}.{name}{hint}", f"valid {what}s: {', '.join(sorted(known)) or '(none)'}"
        )


def undeclared_fields(cls: type) -> list[str]:
    """Fields of the dataclass ``cls`` whose values need a declaration (numbers, names, lists and maps of them)
    but have none: each is a setting that validation would let through unchecked."""
    hints = field_types(cls)
    missing = []
    for field in dataclasses.fields(cls):
        kinds = {k for k in _leaf_kinds(hints[field.name])}
        if kinds & {int, float, str} and declaration(field) is None:
            missing.append(f"{cls.__name__}.{field.name}")
    return missing


def _leaf_kinds(hint: Any) -> list:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is dict:
        return _leaf_kinds(args[1])  # keys are names the owner checks (``Declared.keys``)
    if _is_union(hint) or typing.get_origin(hint) is tuple:
        return [k for arg in args if arg is not Ellipsis for k in _leaf_kinds(arg)]
    return [hint]
