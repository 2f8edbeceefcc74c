"""Dropout for the views DAS/DGA compare, in models built without any.

The DAS paper's general-knowledge proxy (KL between two passes of one input under different dropout masks) and its
contrastive views (the same input under two dropout masks) need dropout. Encoders and GPT-2 have it; Llama-style
decoders (Llama, Qwen, Mistral) are built with ``attention_dropout = 0`` and no other dropout, so both passes would
be identical: the proxy would be zero and the positive view a copy. Inside :func:`dropout_views` such a model's
attention dropout is raised to ``p`` (0.1, the BERT/GPT-2 value) for the views only; its training passes and every
evaluation stay as the model defines them. A model that already drops out is left exactly as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from benchmark.engine.recompute import forward_state

VIEW_DROPOUT = 0.1


def has_dropout(model: nn.Module) -> bool:
    """Whether any dropout of ``model`` is active (a module ``nn.Dropout`` with p > 0, or attention dropout)."""
    return any(
        (isinstance(m, nn.Dropout) and m.p > 0)
        or (isinstance(getattr(m, "attention_dropout", None), float) and m.attention_dropout > 0)
        for m in model.modules()
    )


@contextlib.contextmanager
def dropout_views(model: nn.Module, p: float = VIEW_DROPOUT) -> Iterator[None]:
    """Inside the block a model without any dropout has attention dropout ``p`` (and so has a block that activation
    checkpointing recomputes in the backward pass, :mod:`benchmark.engine.recompute`); others are unchanged."""
    if has_dropout(model):
        yield
        return
    with forward_state(lambda: _raised(model, p)):
        yield


@contextlib.contextmanager
def _raised(model: nn.Module, p: float) -> Iterator[None]:
    changed = [m for m in model.modules() if isinstance(getattr(m, "attention_dropout", None), float)]
    for module in changed:
        module.attention_dropout = p
    try:
        yield
    finally:
        for module in changed:
            module.attention_dropout = 0.0
