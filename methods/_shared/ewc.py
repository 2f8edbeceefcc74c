"""Elastic weight consolidation (Kirkpatrick et al. 2017): diagonal Fisher, merge, penalty."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import nn


def diagonal_fisher(
    named_params: list[tuple[str, nn.Parameter]],
    batches: Iterable[Mapping[str, torch.Tensor]],
    loss_fn: Callable[[Mapping[str, torch.Tensor]], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Mean over batches of ``batch_size * grad**2`` of ``loss_fn`` (the reference's scaling,
    ``networks/baselines/ewc.py``), for every named parameter; gradients are zeroed per batch."""
    fisher = {name: torch.zeros_like(p, device="cpu") for name, p in named_params}
    params = [p for _, p in named_params]
    count = 0
    for batch in batches:
        grads = torch.autograd.grad(loss_fn(batch), params, allow_unused=True)
        size = batch["input_ids"].shape[0]
        for (name, _), grad in zip(named_params, grads, strict=True):
            if grad is not None:
                fisher[name] += size * grad.detach().float().cpu() ** 2
        count += 1
    return {name: value / max(count, 1) for name, value in fisher.items()}


def merge_fisher(old: dict[str, torch.Tensor] | None, new: dict[str, torch.Tensor], domain_index: int):
    """Running average over domains: ``(F_new + t * F_old) / (t + 1)`` after domain t (0-based)."""
    if old is None or domain_index == 0:
        return new
    return {name: (new[name] + domain_index * old[name]) / (domain_index + 1) for name in new}


def ewc_penalty(
    named_params: list[tuple[str, nn.Parameter]],
    fisher: Mapping[str, torch.Tensor],
    anchor: Mapping[str, torch.Tensor],
    strength: float,
) -> torch.Tensor:
    """``strength / 2 * sum_i F_i (theta_i - theta*_i)^2`` over the parameters that have a Fisher entry."""
    total = None
    for name, param in named_params:
        if name in fisher:
            term = (fisher[name] * (param - anchor[name]) ** 2).sum()
            total = term if total is None else total + term
    if total is None:
        raise ValueError("no parameter has a Fisher entry")
    return strength / 2 * total
