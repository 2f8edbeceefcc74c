"""Unit gates (attention heads, FFN intermediate and output neurons) on stock transformers modules.

Gates are forward hooks found through :func:`benchmark.modeling.layer_modules`; no model code is
copied. A head gate scales head h's slice of the input of the attention output projection, which
equals scaling that head's attention probabilities (context = probs @ V is linear in probs) and
works with SDPA attention. The intermediate gate scales the pre-activation (the output of the first
FFN projection, before GELU); the output gate scales the second FFN projection's output (before
dropout, residual and LayerNorm), as in the DAS reference (section 3.1 of ``docs/das.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from benchmark.engine.recompute import forward_state
from benchmark.modeling import LayerModules, layer_modules

UNIT_TYPES = ("head", "intermediate", "output")


@dataclass(frozen=True)
class UnitShapes:
    """Number of layers and units per layer of each unit type."""

    layers: int
    heads: int
    head_dim: int
    intermediate: int
    hidden: int
    kv_heads: int = 0
    """Key/value heads (grouped-query attention: fewer than ``heads``; 0 read as ``heads``)."""

    def shape(self, unit: str) -> tuple[int, int]:
        """(layers, units per layer) of a unit type."""
        return self.layers, {"head": self.heads, "intermediate": self.intermediate, "output": self.hidden}[unit]


def unit_shapes(model: nn.Module) -> UnitShapes:
    """Read the unit counts from the model config."""
    cfg = model.config
    intermediate = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * cfg.hidden_size
    return UnitShapes(
        layers=cfg.num_hidden_layers,
        heads=cfg.num_attention_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        intermediate=intermediate,
        hidden=cfg.hidden_size,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
    )


def ones_gates(
    model: nn.Module, units: tuple[str, ...], requires_grad: bool = True, batch_size: int | None = None
) -> dict[str, torch.Tensor]:
    """Leaf gate tensors of ones (layers x units) for the given unit types, on the model's device.

    With ``batch_size`` B every example gets its own gates (layers x B x units): one backward pass then
    gives each example's gradient with respect to its gates, since example b's loss reaches only gate b.
    """
    shapes, param = unit_shapes(model), next(model.parameters())

    def shape(unit: str) -> tuple[int, ...]:
        layers, count = shapes.shape(unit)
        return (layers, count) if batch_size is None else (layers, batch_size, count)

    return {u: torch.ones(shape(u), device=param.device, dtype=param.dtype, requires_grad=requires_grad) for u in units}


GateOf = Callable[[str, int], "torch.Tensor | None"]
"""Maps (unit type, layer index) to that layer's gate vector, or None for no gate."""


@contextlib.contextmanager
def gated(model: nn.Module, gates: dict[str, torch.Tensor]) -> Iterator[None]:
    """Within the block every forward pass of ``model`` is multiplied by ``gates`` (per unit type), and so is a
    block that activation checkpointing recomputes in the backward pass (:mod:`benchmark.engine.recompute`)."""
    with forward_state(lambda: _hooked(model, gates)):
        yield


@contextlib.contextmanager
def _hooked(model: nn.Module, gates: dict[str, torch.Tensor]) -> Iterator[None]:
    handles = attach_gates(model, tuple(gates), lambda unit, index: gates[unit][index])
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def attach_gates(model: nn.Module, units: tuple[str, ...], gate_of: GateOf) -> list:
    """Persistent gates: from now on every forward multiplies each unit of the given types by
    ``gate_of(unit, layer)``, read at forward time (so it may change between steps, or be None to
    pass through). Returns the hook handles."""
    shapes = unit_shapes(model)
    handles = []
    for index, layer in enumerate(layer_modules(model)):
        handles += _register_layer_gates(layer, index, units, gate_of, shapes)
    return handles


def _register_layer_gates(layer: LayerModules, index: int, units: tuple[str, ...], gate_of: GateOf, shapes: UnitShapes):
    handles = []
    if "head" in units:

        def scale_heads(module, args):
            head_gate = gate_of("head", index)
            if head_gate is None:
                return None
            (context, *rest) = args
            split = context.view(*context.shape[:-1], shapes.heads, shapes.head_dim)
            gate = head_gate.to(context.dtype)
            # (heads,) for the whole batch, or (batch, heads): one gate per example.
            gate = gate[:, None] if gate.dim() == 1 else gate[:, None, :, None]
            return ((split * gate).reshape(context.shape), *rest)

        handles.append(layer.attn_out.register_forward_pre_hook(scale_heads))
    if "intermediate" in units and layer.gate is not None:
        # A gated MLP's unit j is act(gate_j) * up_j, the j-th input of the down projection: gate it there.
        handles.append(layer.output.register_forward_pre_hook(_input_gate(gate_of, index)))
    elif "intermediate" in units:
        handles.append(layer.intermediate.register_forward_hook(_output_gate(gate_of, index, "intermediate")))
    if "output" in units:
        handles.append(layer.output.register_forward_hook(_output_gate(gate_of, index, "output")))
    return handles


def _scaled(values: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``values`` (..., units) times a gate of (units,) for the batch or (batch, units), one per example."""
    return values * (gate if gate.dim() == 1 else gate[:, None, :]).to(values.dtype)


def _output_gate(gate_of: GateOf, index: int, unit: str):
    def scale_units(module, args, out):
        gate = gate_of(unit, index)
        return out if gate is None else _scaled(out, gate)

    return scale_units


def _input_gate(gate_of: GateOf, index: int):
    def scale_inputs(module, args):
        gate = gate_of("intermediate", index)
        if gate is None:
            return None
        (values, *rest) = args
        return (_scaled(values, gate), *rest)

    return scale_inputs
