"""Calling a method's hooks: whatever a plugin raises or returns that the runner cannot use is a named
:class:`PluginError` (the method, the hook, the domain and step, what came back), at the moment it happens, never a
raw traceback from deep in the runner or a record that fails its checks later."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from benchmark.errors import DapbenchError

PLAIN_TYPES = (bool, int, float, str, type(None), torch.Tensor, torch.Size, torch.dtype)
"""What a method's ``state_dict`` may hold (inside lists, tuples and dicts): what ``torch.load(weights_only=True)``
reads back, so a checkpoint never needs to run code to be resumed."""


class PluginError(DapbenchError):
    """A method's hook raised, or returned something the runner cannot use."""


def _who(method, hook: str, where: str) -> str:
    """``method 'x', hook training_loss, step 3``: the caller's error context names the run and the domain."""
    return f"method {method.name!r}, hook {hook}" + (f", {where}" if where else "")


def _fix(method) -> str:
    where = type(method).__module__
    return f"fix the method {method.name!r} ({where}): its hooks are described in docs/plugins.md"


@contextlib.contextmanager
def hook_call(method, hook: str, where: str = "") -> Iterator[None]:
    """Name an exception a method's ``hook`` raises (a :class:`DapbenchError` keeps its own words; running out of
    memory is not the plugin's fault and passes unchanged)."""
    try:
        yield
    except (DapbenchError, torch.OutOfMemoryError):
        raise
    except Exception as exc:
        message = f"{_who(method, hook, where)}: raised {type(exc).__name__}: {exc}"
        raise PluginError(message, _fix(method)) from exc


def checked_loss_terms(method, terms: Any, where: str = "") -> Mapping[str, torch.Tensor]:
    """``terms`` (what ``training_loss`` returned) if it is a mapping of names to scalar tensors."""
    if not isinstance(terms, Mapping):
        raise PluginError(
            f"{_who(method, 'training_loss', where)}: returned {type(terms).__name__}, not a dict of named loss terms",
            _fix(method),
        )
    for name, value in terms.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor) or value.numel() != 1:
            what = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise PluginError(
                f"{_who(method, 'training_loss', where)}: loss term {name!r} is a {what}: every loss"
                " term must be a scalar tensor (reduce it, e.g. with .mean())",
                _fix(method),
            )
    return terms


def checked_report(method, report: Any, where: str = "") -> dict[str, Any]:
    """``report`` (what ``domain_report`` returned) if it is a JSON object of finite numbers and plain values."""
    try:
        text = json.dumps(report, allow_nan=False, default=_plain)
    except (TypeError, ValueError) as exc:
        raise PluginError(
            f"{_who(method, 'domain_report', where)}: returned {_short(report)}, which a record cannot"
            f" hold ({exc}): numbers must be finite, values plain (numbers, strings, lists, dicts)",
            _fix(method),
        ) from exc
    if not isinstance(report, dict):
        raise PluginError(
            f"{_who(method, 'domain_report', where)}: returned {type(report).__name__}, not a dict",
            _fix(method),
        )
    return json.loads(text)


def checked_state(method, state: Any, where: str = "") -> Any:
    """``state`` (what ``state_dict`` returned) if a checkpoint can hold it safely (:data:`PLAIN_TYPES`)."""
    if found := _unsafe(state, "state_dict()"):
        raise PluginError(
            f"{_who(method, 'state_dict', where)}: {found}: a checkpoint holds tensors and plain values"
            " only (it is read back with torch.load(weights_only=True), so resuming never runs code)",
            _fix(method) + "; keep tensors, numbers, strings, lists and dicts in the state",
        )
    return state


def _unsafe(value: Any, where: str) -> str:
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    elif isinstance(value, PLAIN_TYPES):
        return ""
    else:
        return f"{where} is a {type(value).__module__}.{type(value).__qualname__}"
    for key, item in items:
        if not isinstance(key, PLAIN_TYPES):
            return f"{where} has a key of type {type(key).__name__}"
        if found := _unsafe(item, f"{where}[{key!r}]"):
            return found
    return ""


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):  # tensors and numpy values, as records have always stored them
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not a plain value")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
