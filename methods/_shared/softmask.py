"""DAS importance arithmetic, soft-masking of gradients or updates, and its measured damping (pure
functions on tensors).

Normalisation (per layer): ``positive_tanh`` (the default) keeps the order of the raw scores:
tanh of the z-score, with units below their layer's mean at 0. ``abs_tanh`` is the reference's
(``softmask.py:35-42``): z-score, tanh, abs, so units far *below* the layer mean also count as
important, which scrambles the ranking. ``positive_tanh`` adds an epsilon to the standard deviation;
``abs_tanh`` does not, as the reference (a constant layer is a named error there, where the reference gets NaN).

AdamW and soft-masking: for a constant per-element scale c of the gradient, Adam's update equals
the unscaled update with eps replaced by eps / c (m -> c m, sqrt(v) -> c sqrt(v)). With the
reference's eps = 1e-6, gradient soft-masking therefore damps only elements whose c * sqrt(v)
approaches 1e-6: units of importance very close to 1 or with tiny gradients
(``docs/das.md`` section 3.8). Masking the optimizer's *update* instead scales the step by
exactly c. :func:`damping_by_importance` measures which of the two a run is in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmark.errors import NonFiniteError
from benchmark.modeling import LayerModules, out_axis

NORMALISATIONS = ("positive_tanh", "abs_tanh")
IMPORTANCE_BINS = 10
"""Importance histograms and damping are reported in ten equal-width bins of [0, 1]."""


def normalize_importance(raw: torch.Tensor, kind: str = "positive_tanh", eps: float = 1e-12) -> torch.Tensor:
    """Per-layer (row) z-score with unbiased std, then ``tanh`` of it clipped at 0 (``positive_tanh``:
    order-preserving, with ``eps`` added to the std) or ``abs(tanh)`` (``abs_tanh``: the reference's ``impt_norm``,
    exactly, without an epsilon). Values in [0, 1); a layer whose units are all equal has no z-score under
    ``abs_tanh`` (the reference divides by zero) and is a named error rather than a NaN mask."""
    if kind not in NORMALISATIONS:
        raise ValueError(f"unknown importance normalisation {kind!r}; choose one of {NORMALISATIONS}")
    mean = raw.mean(dim=1, keepdim=True)
    std = raw.std(dim=1, keepdim=True) if raw.shape[1] > 1 else torch.zeros_like(mean)
    if kind == "abs_tanh":
        normalised = torch.tanh((raw - mean) / std).abs()
        if not bool(torch.isfinite(normalised).all()):
            raise NonFiniteError(
                "the reference's importance normalisation (abs_tanh) divides by a zero standard deviation: a layer's"
                " units all have the same importance",
                "use importance_norm=positive_tanh (the paper's default), which adds an epsilon",
            )
        return normalised
    return torch.tanh(((raw - mean) / (std + eps)).clamp_min(0))


def shuffle_within_layers(importance: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each layer's (row's) values in a random order: the same mask strength, no information about units."""
    order = torch.stack([torch.randperm(importance.shape[1], generator=generator) for _ in range(len(importance))])
    return importance.gather(1, order)


def accumulate_importance(
    previous: dict[str, torch.Tensor] | None, new: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Element-wise max of the accumulated and the new normalised importance, per unit type."""
    if previous is None:
        return {unit: value.clone() for unit, value in new.items()}
    return {unit: torch.maximum(previous[unit], new[unit]) for unit in new}


@dataclass(frozen=True)
class MaskedTensor:
    """A parameter whose slices along ``axis`` belong to the units of one type in one layer: ``group`` consecutive
    slices per unit (a head's ``head_dim`` rows or columns; 1 for neurons), the units laid out ``copies`` times
    (GPT-2's fused q/k/v: three thirds), and, under grouped-query attention, each slice group shared by ``kv_group``
    consecutive query heads (a key/value head: its keep factor is the smallest of its query heads')."""

    param: torch.nn.Parameter
    unit: str
    layer: int
    axis: int
    group: int = 1
    copies: int = 1
    kv_group: int = 1

    def factor(self, per_unit: torch.Tensor) -> torch.Tensor:
        """A per-unit keep vector expanded to broadcast against the parameter."""
        values = per_unit.view(-1, self.kv_group).min(dim=1).values if self.kv_group > 1 else per_unit
        values = values.repeat_interleave(self.group) if self.group > 1 else values
        values = values.repeat(self.copies) if self.copies > 1 else values
        if self.param.dim() == 1:
            return values
        return values[:, None] if self.axis == 0 else values[None, :]

    def per_unit_sum(self, values: torch.Tensor) -> torch.Tensor | None:
        """Sum an element-wise tensor shaped like the parameter over each unit's elements (None where units share
        slices: a key/value head serves several query heads)."""
        if self.kv_group > 1:
            return None
        if values.dim() == 2:
            values = values.sum(dim=1 - self.axis)
        if self.copies > 1:
            values = values.view(self.copies, -1).sum(dim=0)
        return values.view(-1, self.group).sum(dim=1)


def masked_tensors(
    layers: list[LayerModules],
    units: tuple[str, ...],
    head_dim: int,
    qkv_axis: str = "output",
    mask_attn_out_bias: bool = False,
    down_columns: bool = True,
) -> list[MaskedTensor]:
    """Every parameter soft-masking acts on, with the unit each slice belongs to (the per-architecture unit map of
    :mod:`benchmark.modeling`).

    Heads: the rows (``qkv_axis="output"``, the paper's intent) or, as the reference code does, the
    input columns (``"input"``) of the query/key/value weights, their biases, and the input columns
    of the attention output projection that read the head; ``mask_attn_out_bias`` reproduces the
    reference's masking of that projection's bias by the head vector. Intermediate and output
    neurons: the rows and bias of their projection (and, in a gated MLP, the gate projection's rows and, unless
    ``down_columns`` is False, the down projection's columns). Embeddings, norms and the LM head are not in the list.
    """
    out = []
    for index, layer in enumerate(layers):
        if "head" in units:
            out += _head_tensors(layer, index, head_dim, qkv_axis, mask_attn_out_bias)
        if "intermediate" in units:
            for module in (m for m in (layer.intermediate, layer.gate) if m is not None):
                out += _rows(module, "intermediate", index)
            if layer.gate is not None and down_columns:
                out.append(MaskedTensor(layer.output.weight, "intermediate", index, 1 - out_axis(layer.output)))
        if "output" in units:
            out += _rows(layer.output, "output", index)
    return out


def _rows(module, unit: str, index: int, group: int = 1, copies: int = 1, kv_group: int = 1) -> list[MaskedTensor]:
    """A projection's output slices (weight and bias) as the units' ones."""
    tensors = [MaskedTensor(module.weight, unit, index, out_axis(module), group, copies, kv_group)]
    if module.bias is not None:
        tensors.append(MaskedTensor(module.bias, unit, index, 0, group, copies, kv_group))
    return tensors


def _head_tensors(layer: LayerModules, index: int, head_dim: int, qkv_axis: str, attn_out_bias: bool):
    """The query/key/value slices and attention-output columns of every head (see :func:`masked_tensors`)."""
    out = []
    if layer.qkv is not None:  # fused thirds (GPT-2)
        if qkv_axis == "output":
            out += _rows(layer.qkv, "head", index, head_dim, copies=3)
        else:
            out.append(MaskedTensor(layer.qkv.weight, "head", index, 1 - out_axis(layer.qkv), head_dim))
            if layer.qkv.bias is not None:
                out.append(MaskedTensor(layer.qkv.bias, "head", index, 0, head_dim, copies=3))
    else:
        heads = layer.query.weight.shape[out_axis(layer.query)] // head_dim
        shared = heads // layer.kv_heads if layer.kv_heads else 1
        for module, kv_group in ((layer.query, 1), (layer.key, shared), (layer.value, shared)):
            if qkv_axis == "output":
                out += _rows(module, "head", index, head_dim, kv_group=kv_group)
            else:
                out.append(MaskedTensor(module.weight, "head", index, 1 - out_axis(module), head_dim))
                if module.bias is not None:
                    out.append(MaskedTensor(module.bias, "head", index, 0, head_dim, kv_group=kv_group))
    out.append(MaskedTensor(layer.attn_out.weight, "head", index, 1 - out_axis(layer.attn_out), head_dim))
    if attn_out_bias and layer.attn_out.bias is not None:
        out.append(MaskedTensor(layer.attn_out.bias, "head", index, 0, head_dim))
    return out


def keep_factor(tensor: MaskedTensor, importance: dict[str, torch.Tensor]) -> torch.Tensor:
    """(1 - importance) of the tensor's units, broadcastable to it, in its dtype and on its device."""
    keep = 1 - importance[tensor.unit][tensor.layer]
    return tensor.factor(keep).to(device=tensor.param.device, dtype=tensor.param.dtype)


def local(value: torch.Tensor) -> torch.Tensor:
    """What this process holds of ``value``: its shard under FSDP (a view: in-place changes reach the parameter),
    else ``value`` itself."""
    from benchmark.acceleration.sharding import is_sharded

    return value.to_local() if is_sharded(value) else value


def local_keep(tensor: MaskedTensor, importance: dict[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """:func:`keep_factor` for what this process holds of ``like`` (the parameter or its gradient): the broadcast
    factor, or under FSDP the part of the full factor that lies on this process's shard."""
    return local_factor(keep_factor(tensor, importance), like)


def local_factor(factor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``factor`` (broadcastable to the whole of ``like``) as it applies to what this process holds of ``like``: the
    factor itself, or under FSDP the part of the expanded factor that lies on this process's shard."""
    from benchmark.acceleration.sharding import is_sharded, local_part

    if not is_sharded(like):
        return factor
    return local_part(factor.expand(like.shape).contiguous(), like)


def mask_gradient(tensor: MaskedTensor, importance: dict[str, torch.Tensor]) -> None:
    """Multiply the tensor's gradient (this process's shard of it under FSDP) by (1 - importance) of its units."""
    scale_gradient(tensor.param, keep_factor(tensor, importance))


def scale_gradient(param: torch.nn.Parameter, factor: torch.Tensor) -> None:
    """Multiply ``param``'s gradient by ``factor`` (broadcastable to the whole parameter; under FSDP, the part of it
    on this process's shard)."""
    grad = param.grad
    if grad is not None:
        local(grad).mul_(local_factor(factor.to(device=grad.device, dtype=grad.dtype), grad))


def soft_mask_gradients(
    layers: list[LayerModules],
    importance: dict[str, torch.Tensor],
    head_dim: int,
    qkv_axis: str = "output",
    mask_attn_out_bias: bool = False,
    down_columns: bool = True,
) -> None:
    """Multiply gradients in place by (1 - importance) of the units they belong to (see
    :func:`masked_tensors` for which slices those are)."""
    for tensor in masked_tensors(layers, tuple(importance), head_dim, qkv_axis, mask_attn_out_bias, down_columns):
        mask_gradient(tensor, importance)


def soft_mask_updates(
    tensors: list[MaskedTensor], importance: dict[str, torch.Tensor], before: list[torch.Tensor]
) -> None:
    """Scale the step the optimizer just took by (1 - importance): theta = before + keep * (theta - before)."""
    with torch.no_grad():
        for tensor, old in zip(tensors, before, strict=True):
            param = local(tensor.param)
            param.copy_(torch.lerp(local(old), param, local_keep(tensor, importance, tensor.param)))


def adam_update_magnitudes(
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    beta2: float,
    eps: float,
    keep: torch.Tensor,
    target: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """|update taken| and |update without the mask| per element, from Adam(W)'s state after a step, up to
    their common factor lr / (1 - beta1^step).

    ``target="gradient"``: the moments were accumulated from gradients scaled by a constant ``keep`` = c
    (constant within a domain), so m = c m_u and sqrt(v) = c sqrt(v_u) and the unmasked step is
    m / (sqrt(v_hat) + c eps). ``target="update"``: the moments are unmasked and the step taken was
    ``keep`` times Adam's. Elements with c = 0 carry no information about their unmasked step under
    gradient masking and get 0 in both. AMSGrad and the decoupled weight decay (0 in every profile)
    are not modelled.
    """
    root = (exp_avg_sq / (1 - beta2**step)).sqrt()
    momentum = exp_avg.abs()
    keep = keep.expand_as(momentum)
    if target == "update":
        unmasked = momentum / (root + eps)
        return keep * unmasked, unmasked
    taken = momentum / (root + eps)
    unmasked = torch.where(keep > 0, momentum / (root + keep * eps), torch.zeros_like(momentum))
    return torch.where(keep > 0, taken, torch.zeros_like(taken)), unmasked


def _whole(value: torch.Tensor) -> torch.Tensor:
    """The full tensor of a sharded optimizer state (gathered from every process: all call this in one order)."""
    from benchmark.acceleration.sharding import is_sharded

    return value.full_tensor() if is_sharded(value) else value


def importance_histogram(importance: dict[str, torch.Tensor], bins: int = IMPORTANCE_BINS) -> dict[str, list[int]]:
    """Unit counts per equal-width importance bin of [0, 1], per unit type."""
    return {
        unit: torch.histc(values.float(), bins=bins, min=0.0, max=1.0).long().tolist()
        for unit, values in importance.items()
    }


def damping_by_importance(
    tensors: list[MaskedTensor],
    importance: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    target: str,
    bins: int = IMPORTANCE_BINS,
) -> list[float | None]:
    """Per equal-width importance bin: the summed |update| of the units in it divided by the summed |update|
    the same units would have taken unmasked, at the optimizer's current state (1 = no damping,
    0 = frozen; None for an empty bin). Units are weighted by their update size, as a mean over elements."""
    settings = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    taken_sum, unmasked_sum = torch.zeros(bins, dtype=torch.float64), torch.zeros(bins, dtype=torch.float64)
    for tensor in tensors:
        state = optimizer.state.get(tensor.param)
        if not state or not {"exp_avg", "exp_avg_sq"} <= state.keys():  # Adam's moments (schedule-free has none)
            continue
        group = settings[id(tensor.param)]
        taken, unmasked = adam_update_magnitudes(
            _whole(state["exp_avg"]).float(),
            _whole(state["exp_avg_sq"]).float(),
            int(state["step"]),
            group["betas"][1],
            group["eps"],
            keep_factor(tensor, importance).float(),
            target,
        )
        taken_units, unmasked_units = tensor.per_unit_sum(taken), tensor.per_unit_sum(unmasked)
        if taken_units is None:  # slices shared by several units (key/value heads) are not attributed to one
            continue
        unit_importance = importance[tensor.unit][tensor.layer]
        index = (unit_importance * bins).long().clamp(0, bins - 1).cpu()
        taken_sum.index_add_(0, index, taken_units.double().cpu())
        unmasked_sum.index_add_(0, index, unmasked_units.double().cpu())
    return [None if u == 0 else round(float(t / u), 5) for t, u in zip(taken_sum, unmasked_sum, strict=True)]
