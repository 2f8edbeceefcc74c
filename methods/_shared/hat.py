"""HAT: hard attention to the task (Serra et al., ICML 2018), on the DAS units (pure functions).

A domain t owns a task embedding e_t per unit; its gate is m = sigmoid(s * e_t). ``s`` is annealed
from 1/smax to smax over training, so gates become near-binary. After domain t the cumulative mask
m_<t is the element-wise max of every earlier domain's gate at s = smax. Training then (1) adds the
attention regulariser, which charges the use of units that earlier domains did not take, (2) scales
every weight gradient by 1 - min(m_<t of its output unit, m_<t of its input unit) (units without a
gate count as 1), (3) compensates the embedding gradient for the annealing, and (4) clamps the
embeddings. Constants from the HAT paper and the reference (``docs/das.md`` section 4.6):
smax 400, lambda 0.75, cosh clamp 50, embedding clamp 6.
"""

from __future__ import annotations

import torch

from benchmark.modeling import LayerModules, out_axis
from methods._shared.softmask import scale_gradient, soft_mask_gradients

FREE_FLOOR = 1e-6
"""The regulariser's smallest denominator: far below one free unit, so it changes nothing until none is free."""


def anneal_s(step: int, total_steps: int, smax: float) -> float:
    """HAT's linear annealing: 1/smax at the first step, smax at the last."""
    if total_steps <= 1:
        return smax
    return 1 / smax + (smax - 1 / smax) * step / (total_steps - 1)


def hat_gates(embeddings: dict[str, torch.Tensor], s: float) -> dict[str, torch.Tensor]:
    """sigmoid(s * e) per unit type (embeddings: layers x units)."""
    return {unit: torch.sigmoid(s * e) for unit, e in embeddings.items()}


def attention_regularizer(gates: dict[str, torch.Tensor], previous: dict[str, torch.Tensor] | None) -> torch.Tensor:
    """sum m * (1 - m_<t) / sum (1 - m_<t) over every unit; the mean gate when there is no m_<t. Where earlier
    domains hold every unit (sum (1 - m_<t) = 0, so every term of the numerator is 0 too) it is 0, not 0/0."""
    used = sum((g * (1 - previous[u])).sum() if previous else g.sum() for u, g in gates.items())
    free = sum((1 - previous[u]).sum() if previous else torch.tensor(float(g.numel())) for u, g in gates.items())
    return used / torch.clamp(free, min=FREE_FLOOR)


def compensate_embedding_gradient(
    grad: torch.Tensor, embedding: torch.Tensor, s: float, smax: float, thres_cosh: float = 50.0
) -> torch.Tensor:
    """HAT's annealing compensation: grad * smax/s * (cosh(clamp(s e)) + 1) / (cosh(e) + 1)."""
    numerator = torch.cosh(torch.clamp(s * embedding, -thres_cosh, thres_cosh)) + 1
    denominator = torch.cosh(embedding) + 1
    return grad * (smax / s) * numerator / denominator


def mask_hat_gradients(layers: list[LayerModules], previous: dict[str, torch.Tensor], head_dim: int) -> None:
    """Scale weight gradients in place by 1 - min(m_<t(out unit), m_<t(in unit)).

    Query/key/value rows of head h and the attention output columns that read it: 1 - m_head (their
    other end, the residual stream, has no gate). Intermediate rows and bias (and a gated MLP's gate rows): 1 - m_int.
    The FFN output projection connects intermediate (in) to output units (out): 1 - min(m_out, m_int) per
    weight, 1 - m_out for its bias. Embeddings, norms and the LM head have no gate.
    """
    inner = {u: previous[u] for u in ("head", "intermediate") if u in previous}
    soft_mask_gradients(layers, inner, head_dim, down_columns="output" not in previous)
    if "output" not in previous:
        return
    for index, layer in enumerate(layers):
        out_mask = previous["output"][index]
        in_mask = previous["intermediate"][index] if "intermediate" in previous else torch.ones_like(out_mask[:1])
        weight, bias = layer.output.weight, layer.output.bias
        keep = 1 - torch.minimum(out_mask[:, None], in_mask[None, :])  # out x in
        scale_gradient(weight, keep if out_axis(layer.output) == 0 else keep.T)
        if bias is not None:
            scale_gradient(bias, 1 - out_mask)
