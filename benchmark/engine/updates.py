"""How far a stage moved what a method trains: per parameter group, ||theta_end - theta_start|| / ||theta_start||.

A row whose method's own parameters did not move measures the method's initialisation, not the method; the record
keeps these sizes per domain (``domains[t].update_sizes``) so the report can say so
(:func:`benchmark.metrics.untrained_groups`).
The groups are the method's declared :class:`~benchmark.method.ParameterGroup` s and ``weights``: every other
parameter the DAP optimizer trains.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmark.method import ContinualMethod

WEIGHTS = "weights"
"""The group of every trained parameter that no declared group holds (trained at ``dap.lr`` with AdamW)."""


def _key(name: str) -> str:
    """A parameter's name whatever wraps its block (compiled blocks add ``_orig_mod.``)."""
    return name.replace("_orig_mod.", "")


class UpdateSizes:
    """The start of a stage's trained parameters (a float32 copy on the CPU), to measure their update against."""

    def __init__(self, model: nn.Module, method: ContinualMethod):
        params = {_key(n): p for n, p in model.named_parameters()}
        names = {id(p): key for key, p in params.items()}
        groups = method.parameter_groups(model)
        own = {id(p) for group in groups for _, p in group.parameters}
        self.members = {group.name: [names[id(p)] for _, p in group.parameters] for group in groups}
        weights = [names[id(p)] for _, p in method.trainable_parameters(model) if id(p) not in own]
        if weights:
            self.members = {WEIGHTS: weights, **self.members}
        self.start = {n: _cpu(params[n]) for members in self.members.values() for n in members}

    def measure(self, model: nn.Module) -> dict[str, dict[str, float | int | None]]:
        """Per group: its size (``parameters``), ``start_norm``, ``change_norm`` and ``relative`` (None where the
        group started at zero, as LoRA's B matrices do: its change norm then says how far it moved)."""
        params = {_key(n): p for n, p in model.named_parameters()}
        out = {}
        for group, members in self.members.items():
            start = math.sqrt(sum(float(self.start[n].pow(2).sum()) for n in members))
            change = math.sqrt(sum(float((_cpu(params[n]) - self.start[n]).pow(2).sum()) for n in members))
            out[group] = {
                "parameters": sum(self.start[n].numel() for n in members),
                "start_norm": round(start, 6),
                "change_norm": round(change, 6),
                "relative": round(change / start, 6) if start > 0 else None,
            }
        return out


def _cpu(param: torch.Tensor) -> torch.Tensor:
    return param.detach().to("cpu", torch.float32, copy=True)
