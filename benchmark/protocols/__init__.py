"""End-task protocols: how a stage's model is scored on an end task (issue #48: one place defines each variation
point). One registered object per protocol, one module each: ``finetune`` (the paper's: train the whole classifier),
``linear_probe`` (a logistic regression on frozen features) and ``lm_eval`` (lm-evaluation-harness log-likelihood
scoring of a decoder, zero-shot, over the end task's label words).

A protocol is an :class:`EndTaskProtocol`: what it scores (a classifier the method builds, or the stage's language
model as the method serves the task's domain), the checks a run must pass before it trains, and ``evaluate``, which
returns the cell's scores and test predictions. Adding one is a module with a subclass and :func:`register_protocol`
(a plugin's own module may do it), its test and a line of docs: ``finetune.protocol`` accepts every registered name.
"""

from __future__ import annotations

from benchmark.errors import DapbenchError
from benchmark.method import CLASSIFIER, LANGUAGE_MODEL
from benchmark.protocols.base import EndTaskProtocol, test_sizes

PROTOCOLS: dict[str, EndTaskProtocol] = {}
"""Every registered end-task protocol by name (``finetune.protocol`` accepts exactly these)."""


def register_protocol(cls: type[EndTaskProtocol]) -> type[EndTaskProtocol]:
    """Register the decorated :class:`EndTaskProtocol` subclass under its ``name`` (a second class under one name is
    an error)."""
    if cls.name in PROTOCOLS:
        raise ValueError(f"an end-task protocol named {cls.name!r} is already registered ({type(PROTOCOLS[cls.name])})")
    PROTOCOLS[cls.name] = cls()
    return cls


def get_protocol(name: str) -> EndTaskProtocol:
    """The registered protocol ``name``; a named error listing the registered ones otherwise."""
    if name not in PROTOCOLS:
        raise DapbenchError(
            f"invalid finetune.protocol={name!r}: no end-task protocol of that name is registered",
            f"use one of {sorted(PROTOCOLS)} (a plugin registers its own with benchmark.protocols.register_protocol)",
        )
    return PROTOCOLS[name]


def protocols_of(settings) -> list[EndTaskProtocol]:
    """The protocols a run scores its cells with: ``finetune.protocol``, then ``finetune.beside`` if set (named
    errors for unregistered names or a protocol beside itself); ``settings``: a run's ``FinetuneConfig``."""
    first = get_protocol(settings.protocol)
    if settings.beside is None:
        return [first]
    if settings.beside == settings.protocol:
        raise DapbenchError(
            f"finetune.beside={settings.beside!r} is the run's protocol already",
            "set finetune.beside to another protocol (e.g. finetune beside linear_probe), or leave it unset",
        )
    try:
        second = get_protocol(settings.beside)
    except DapbenchError as exc:
        raise DapbenchError(exc.problem.replace("finetune.protocol", "finetune.beside"), exc.fix) from None
    return [first, second]


def protocol_phrase(ft: dict) -> str:
    """How a record's end tasks were scored, in one phrase (its ``config.finetune``; a protocol not installed here
    reads as its name and sample sizes)."""
    name = ft.get("protocol", "finetune")
    return PROTOCOLS[name].describe(ft) if name in PROTOCOLS else f"{name}, {test_sizes(ft)}"


def protocol_short(ft: dict) -> str:
    """A few words for a group heading on how its end tasks were scored (``probe``, ``fine-tuned``)."""
    name = ft.get("protocol", "finetune")
    return PROTOCOLS[name].short if name in PROTOCOLS else name


def protocol_words(ft: dict) -> str:
    """A protocol in words (``linear probe``, ``fine-tune``); its name where it is not installed here."""
    name = ft.get("protocol", "finetune")
    return PROTOCOLS[name].words if name in PROTOCOLS else name


__all__ = [
    "CLASSIFIER",
    "LANGUAGE_MODEL",
    "PROTOCOLS",
    "EndTaskProtocol",
    "get_protocol",
    "protocols_of",
    "register_protocol",
]

# The built-in protocols register themselves on import (below the registry they fill).
from benchmark.protocols import finetune, linear_probe, lm_eval  # noqa: E402, F401
