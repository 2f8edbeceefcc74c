"""Model families: the one place that defines each kind of language model the benchmark runs (issue #48).

A family (:class:`~benchmark.families.base.ModelFamily`) says how its models are loaded, how its documents are
encoded and packed, what its batches predict (masked tokens, next tokens), how its held-out loss reads, and how a
small one is made from scratch. The run's family is chosen once, from the model's own configuration
(:func:`family_of`), and data, engine, records and report ask it instead of testing a flag. Two are built in:
:mod:`~benchmark.families.masked` and :mod:`~benchmark.families.causal`. A new kind (an encoder-decoder, a
state-space model) is one module that subclasses ``ModelFamily`` and calls :func:`register_family`; docs/plugins.md
walks through it.
"""

from __future__ import annotations

from benchmark.errors import DapbenchError
from benchmark.families.base import ModelFamily
from benchmark.families.causal import CausalLM
from benchmark.families.masked import MaskedLM
from benchmark.plugins import Registry, named_entry

FAMILIES: Registry[ModelFamily] = Registry(
    "model family",
    "dapbench.families",
    "a plugin registers its own with benchmark.families.register_family or the entry-point group dapbench.families",
    load=named_entry("model family", ModelFamily, instantiate=True),
)
"""Every registered family by name, in registration order."""
FALLBACK = "causal"
"""The family of a language model whose configuration no family claims (as transformers reads a decoder)."""


def register_family(family: ModelFamily) -> ModelFamily:
    """Add ``family`` (an instance) under its name; a name already taken is a named error."""
    FAMILIES.add(family.name, family)
    return family


def unregister_family(name: str) -> None:
    """Remove a family registered by a plugin or a test (never one of the built-in two)."""
    if name in (MASKED_LM.name, CAUSAL_LM.name):
        raise DapbenchError(f"the built-in model family {name!r} cannot be removed", "remove only families you added")
    FAMILIES.remove(name)


def get_family(name: str) -> ModelFamily:
    """The family registered as ``name`` (a record's ``model_kind``); an unknown one is a named error."""
    return FAMILIES.get(name)


def family_of(model_config) -> ModelFamily:
    """The family of a model, read from its configuration: the family one of whose architectures the configuration
    names, else the family of its model type, else the fallback (:data:`FALLBACK`). Later registrations are asked
    first, so a plugin's family can claim configurations a built-in one would read."""
    families = list(FAMILIES.values())[::-1]
    for answer in (True, None):
        for family in families:
            if family.claims(model_config) is answer:
                return family
    return FAMILIES[FALLBACK]


MASKED_LM = register_family(MaskedLM())
CAUSAL_LM = register_family(CausalLM())

__all__ = ["CAUSAL_LM", "FAMILIES", "MASKED_LM", "ModelFamily", "family_of", "get_family", "register_family"]
