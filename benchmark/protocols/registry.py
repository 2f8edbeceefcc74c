"""The end-task protocol registry: every registered :class:`~benchmark.protocols.base.EndTaskProtocol` by name, and
the phrases a record's protocol is described with. The package (:mod:`benchmark.protocols`) re-exports it and
imports the built-in protocols, which register themselves here."""

from __future__ import annotations

from benchmark.errors import DapbenchError
from benchmark.plugins import Registry, named_entry
from benchmark.protocols.base import EndTaskProtocol, test_sizes

PROTOCOLS: Registry[EndTaskProtocol] = Registry(
    "end-task protocol",
    "dapbench.protocols",
    "a plugin registers its own with benchmark.protocols.register_protocol or the entry-point group dapbench.protocols",
    load=named_entry("end-task protocol", EndTaskProtocol, instantiate=True),
    setting="finetune.protocol",
)
"""Every registered end-task protocol by name (``finetune.protocol`` accepts exactly these)."""


def register_protocol(cls: type[EndTaskProtocol]) -> type[EndTaskProtocol]:
    """Register the decorated :class:`EndTaskProtocol` subclass under its ``name`` (a second class under one name is
    a :class:`~benchmark.plugins.RegistrationError`)."""
    PROTOCOLS.add(cls.name, cls())
    return cls


def get_protocol(name: str) -> EndTaskProtocol:
    """The registered protocol ``name``; a named error listing the registered ones otherwise."""
    return PROTOCOLS.get(name)


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


def protocol_caveat(ft: dict) -> str:
    """What a reader of a protocol's end-task table should keep in mind (:attr:`EndTaskProtocol.caveat`); empty for a
    protocol with none, or not installed here."""
    name = ft.get("protocol", "finetune")
    return PROTOCOLS[name].caveat if name in PROTOCOLS else ""


def protocol_words(ft: dict) -> str:
    """A protocol in words (``linear probe``, ``fine-tune``); its name where it is not installed here."""
    name = ft.get("protocol", "finetune")
    return PROTOCOLS[name].words if name in PROTOCOLS else name
