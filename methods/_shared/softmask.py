"""DAS importance arithmetic and gradient soft-masking (pure functions on tensors).

Normalisation follows the reference (``softmask.py:35-42``): per layer, z-score, tanh, abs, so
every score lies in [0, 1). We add an epsilon to the standard deviation, which the reference lacks
(a constant layer would give NaN there). Note the order: units whose raw score is far *below*
the layer mean also count as important after the abs.

AdamW and soft-masking: for a constant per-element scale c of the gradient, Adam's update equals
the unscaled update with eps replaced by eps / c (m -> c m, sqrt(v) -> c sqrt(v)). With the
reference's eps = 1e-6, soft-masking therefore damps only elements whose c * sqrt(v) approaches
1e-6: units of importance very close to 1 or with tiny gradients. A different eps or optimizer
changes how strong the soft-mask effectively is (``DAS_REFERENCE.md`` section 3.8).
"""

from __future__ import annotations

import torch

from benchmark.modeling import LayerModules


def normalize_importance(raw: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Per-layer (row) z-score with unbiased std, then tanh, then abs: values in [0, 1)."""
    mean = raw.mean(dim=1, keepdim=True)
    std = raw.std(dim=1, keepdim=True) if raw.shape[1] > 1 else torch.zeros_like(mean)
    return torch.tanh((raw - mean) / (std + eps)).abs()


def accumulate_importance(
    previous: dict[str, torch.Tensor] | None, new: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Element-wise max of the accumulated and the new normalised importance, per unit type."""
    if previous is None:
        return {unit: value.clone() for unit, value in new.items()}
    return {unit: torch.maximum(previous[unit], new[unit]) for unit in new}


def soft_mask_gradients(
    layers: list[LayerModules],
    importance: dict[str, torch.Tensor],
    head_dim: int,
    qkv_axis: str = "output",
    mask_attn_out_bias: bool = False,
) -> None:
    """Multiply gradients in place by (1 - importance) of the units they belong to.

    Heads: the rows (``qkv_axis="output"``, the paper's intent) or, as the reference code does, the
    input columns (``"input"``) of the query/key/value weights, their biases, and the input columns
    of the attention output projection that read the head; ``mask_attn_out_bias`` reproduces the
    reference's masking of that projection's bias by the head vector. Intermediate and output
    neurons: the rows and bias of their dense layer. Embeddings, LayerNorms and the LM head are
    never masked.
    """
    for index, layer in enumerate(layers):
        if "head" in importance:
            keep = (1 - importance["head"][index]).repeat_interleave(head_dim)
            for linear in (layer.query, layer.key, layer.value):
                _scale(linear.weight, keep[:, None] if qkv_axis == "output" else keep[None, :])
                _scale(linear.bias, keep)
            _scale(layer.attn_out.weight, keep[None, :])
            if mask_attn_out_bias:
                _scale(layer.attn_out.bias, keep)
        for unit, linear in (("intermediate", layer.intermediate), ("output", layer.output)):
            if unit in importance:
                keep = 1 - importance[unit][index]
                _scale(linear.weight, keep[:, None])
                _scale(linear.bias, keep)


def _scale(param: torch.nn.Parameter | None, factor: torch.Tensor) -> None:
    if param is not None and param.grad is not None:
        param.grad.mul_(factor.to(param.grad.dtype))
