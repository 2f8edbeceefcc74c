"""Unit importance from the gradients of virtual gates (DAS / DGA), and the losses it is taken of."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from benchmark.engine.recompute import forward_state
from benchmark.errors import NonFiniteError
from benchmark.modeling import encoder_of, mlm_loss, model_mode
from methods._shared.dropout import dropout_views
from methods._shared.units import gated, ones_gates, unit_shapes

LossFn = Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]


def gate_importance(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    loss_fn: LossFn,
    units: tuple[str, ...],
    *,
    absolute: bool = True,
    cumulative: bool = False,
    per_example: bool = False,
    per_token: bool = False,
) -> dict[str, torch.Tensor]:
    """Mean over batches of |dL/dg| for every gate g (layers x units per unit type).

    ``per_example=True`` is the paper's formula, I = 1/N sum_n |dL_n/dg| over the N examples: every
    example gets its own gates (one backward pass still), and L_n is example n's share of the batch loss
    times the batch size (its own mean loss when examples carry equally many loss tokens).
    ``absolute=False`` sums signed gradients and ``cumulative=True`` adds the running total of the
    gradients at every batch, as the reference does by never zeroing the gates' ``.grad``
    (a linearly decaying weighting of batches). ``per_token=True`` divides by the number of input tokens instead
    of the number of batches, as the reference does (a constant, which the per-layer z-score cancels up to
    rounding). Gradients are taken with ``torch.autograd.grad``, so nothing leaks into the parameters' ``.grad``.
    """
    if per_example and (cumulative or not absolute):
        raise ValueError("per-example importance is |gradient| per example: use absolute=True, cumulative=False")
    shapes = unit_shapes(model)
    totals = {u: torch.zeros(shapes.shape(u), device=next(model.parameters()).device) for u in units}
    running = {u: torch.zeros_like(t) for u, t in totals.items()}
    count, tokens = 0, 0
    for batch in batches:
        size = int(batch["original_ids"].shape[0]) if per_example else None
        gates = ones_gates(model, units, batch_size=size)
        with gated(model, gates):
            loss = loss_fn(model, batch) * (size or 1)
        grads = torch.autograd.grad(loss, [gates[u] for u in units], allow_unused=True)
        for unit, grad in zip(units, grads, strict=True):
            grad = torch.zeros_like(gates[unit]) if grad is None else grad.detach().float()
            if per_example:
                totals[unit] += grad.abs().sum(dim=1)
                continue
            if cumulative:
                running[unit] += grad
                grad = running[unit]
            totals[unit] += grad.abs() if absolute else grad
        count += size or 1
        tokens += int(batch["input_ids"].numel())
    if count == 0:
        raise ValueError("importance needs at least one batch")
    if not all(bool(torch.isfinite(t).all()) for t in totals.values()):
        raise NonFiniteError(
            "unit importance is not finite (a gate gradient overflowed or the model holds NaN weights)",
            "lower dap.lr, or compute importance in float32",
        )
    return {u: (t / (tokens if per_token else count)).cpu() for u, t in totals.items()}


def kl_proxy_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The paper's general-knowledge proxy: the same unmasked input run twice in train mode with
    different dropout masks; KL between the two MLM output distributions at every non-padding token."""
    ids, mask = batch["original_ids"], batch.get("attention_mask")
    # Train mode for the two passes, and for their recompute under activation checkpointing, which runs in the
    # backward pass after the mode is restored (a block recomputed without dropout saves other tensors).
    with forward_state(lambda: model_mode(model, training=True)):
        with dropout_views(model):  # a decoder built without dropout gets attention dropout for the two passes
            first = model(input_ids=ids, attention_mask=mask).logits
            second = model(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool() if mask is not None else torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    log_p, log_q = F.log_softmax(first[keep].float(), -1), F.log_softmax(second[keep].float(), -1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")  # KL(p || q) per token


def reference_kl_proxy_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The reference code's proxy, computed as it computes it (``docs/das.md`` 3.3): eval mode, masked input,
    two passes of the same weights (the reference's student and teacher copies), and its ``DistillKL(T=1)`` of the
    teacher's and the student's final hidden states: ``kl_div(log_softmax(teacher), softmax(student))`` over the
    *token* axis, summed, divided by the batch size. The passes are equal, so the loss is zero up to rounding, but
    ``kl_div`` takes the log of the softmax, which rounds differently from ``log_softmax``: the gate gradients
    are rounding noise, as in the reference."""
    was_training = model.training
    model.eval()
    encoder = encoder_of(model)
    student = encoder(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).last_hidden_state
    teacher = encoder(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).last_hidden_state
    model.train(was_training)
    log_teacher, p_student = F.log_softmax(teacher, dim=1), F.softmax(student, dim=1)
    return F.kl_div(log_teacher, p_student, reduction="sum") / student.shape[0]


def mlm_importance_loss(unmasked: bool = False) -> LossFn:
    """MLM loss on the masked input (paper); ``unmasked`` predicts the selected tokens from the
    original, visible input, as the reference does (``docs/das.md`` 3.4)."""

    def loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if unmasked:
            batch = {**batch, "input_ids": batch["original_ids"]}
        return mlm_loss(model, batch)

    return loss
