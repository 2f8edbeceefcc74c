"""Forward-time state that activation checkpointing must see again when it recomputes a block.

With ``dap.activation_checkpointing`` a block's activations are recomputed in the backward pass, after the code
that ran the forward has left its ``with`` blocks: a method that gates units with hooks for one pass (DAS's
importance-gated view, :func:`methods._shared.units.gated`) would otherwise be recomputed ungated, and torch's
checkpoint either refuses (a different number of saved tensors) or, worse, differentiates another function. A
method declares such state with :func:`restored_on_recompute`; :func:`checkpoint_contexts` is the ``context_fn``
torch's non-reentrant checkpoint calls at every block's forward, which re-enters that state around the recompute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar

Restore = Callable[[], AbstractContextManager]
"""Makes a context that re-establishes a piece of forward-time state (e.g. attaches unit gates)."""

_ACTIVE: ContextVar[tuple[Restore, ...]] = ContextVar("dapbench_forward_state", default=())


@contextlib.contextmanager
def restored_on_recompute(restore: Restore) -> Iterator[None]:
    """Within the block, forward passes depend on state that ``restore()`` re-establishes: a block checkpointed in
    this block is recomputed inside ``restore()``."""
    token = _ACTIVE.set((*_ACTIVE.get(), restore))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def forward_state(restore: Restore) -> Iterator[None]:
    """``restore()`` entered around the block's forward passes, and again around any recompute of them."""
    with restored_on_recompute(restore), restore():
        yield


def checkpoint_contexts() -> tuple[AbstractContextManager, AbstractContextManager]:
    """``context_fn`` of ``torch.utils.checkpoint``: nothing around the forward; around the recompute, every
    restore active at forward time, entered in order."""
    return contextlib.nullcontext(), _entered(_ACTIVE.get())


@contextlib.contextmanager
def _entered(restores: tuple[Restore, ...]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for restore in restores:
            stack.enter_context(restore())
        yield


def enable_activation_checkpointing(model, compiled: bool = False) -> None:
    """Recompute every transformer block of ``model`` in the backward pass (transformers' activation checkpointing,
    torch's non-reentrant checkpoint), with the forward-time state of :func:`restored_on_recompute` restored.

    Where the checkpoint sits decides whether compiled blocks (``dap.compile``) need that restore:
    :func:`recompute_restores` says."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    restore = recompute_restores(compiled)
    enable({"use_reentrant": False, "context_fn": checkpoint_contexts} if restore else {"use_reentrant": False})


def recompute_restores(compiled: bool) -> bool:
    """Whether a checkpointed block's recompute must re-enter the forward-time state (and can: torch.compile accepts
    no ``context_fn`` inside a compiled region).

    Eager blocks: always. Compiled blocks: where transformers checkpoints around a layer's module call (its
    ``GradientCheckpointingLayer`` defines ``__call__``, as in transformers 5.17), the recompute calls the compiled
    block again, whose guards then read the state after the forward's ``with`` blocks have left (hooks gone, dropout
    rates restored) and pick another compiled variant: torch's CheckpointError ("a different number of tensors was
    saved"), seen on a lent H200 with DAS. Where it checkpoints ``forward`` inside the module call (later versions),
    the checkpoint is traced into the compiled block, which replays the state of its forward."""
    if not compiled:
        return True
    from transformers.modeling_layers import GradientCheckpointingLayer

    return "__call__" in vars(GradientCheckpointingLayer)


@contextlib.contextmanager
def activation_checkpointing(model, enabled: bool, compiled: bool = False) -> Iterator[None]:
    """Within the block, ``model``'s blocks are recomputed in the backward pass if ``enabled`` (a no-op otherwise)."""
    if not enabled:
        yield
        return
    enable_activation_checkpointing(model, compiled=compiled)
    try:
        yield
    finally:
        disable_activation_checkpointing(model)


def disable_activation_checkpointing(model) -> None:
    """Undo :func:`enable_activation_checkpointing`."""
    disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
    disable()
