"""The optimisers of a DAP stage and the update that steps them.

The DAP AdamW trains every parameter the method trains (weight decay on matrices only) at ``dap.lr``; a method's
declared :class:`~benchmark.method.ParameterGroup` s train at their own rate (an ``adamw`` group inside that AdamW,
an ``sgd`` group with a plain SGD of its own, an ``adafactor`` group with the Adafactor of the prompt-tuning paper:
fixed rate, no parameter scaling, weight decay 1e-5), all with the stage's schedule shape. Where a method declares no
group, this is the one AdamW every record before groups existed was trained with, stepped identically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from benchmark.acceleration.fused import fused_adamw
from benchmark.acceleration.sharding import average_replicated
from benchmark.config import DapConfig
from benchmark.engine.recipe import StagePlan, plan_span, stage_scheduler
from benchmark.method import ContinualMethod, ParameterGroup, StepContext
from benchmark.schedules import OPTIMIZERS


def stage_optimizers(method: ContinualMethod, model, dap: DapConfig, plan: StagePlan, acc) -> tuple[list, list, list]:
    """The stage's optimizers (the DAP AdamW first), their schedules, and the parameters the clipping counts."""
    groups = method.parameter_groups(model)
    fused = fused_adamw(acc.device, acc.mixed_precision)
    optimizers = build_optimizers(method.trainable_parameters(model), groups, dap, fused, plan)
    return optimizers, [stage_scheduler(o, plan) for o in optimizers], clipped_parameters(model, groups)


def build_optimizer(
    params: list[tuple[str, torch.nn.Parameter]], dap: DapConfig, fused: bool = False, plan: StagePlan | None = None
):
    """AdamW over ``params`` (one fused kernel if ``fused``); its schedule is :func:`stage_scheduler`'s. A schedule
    that brings its own optimizer (``benchmark.schedules.OPTIMIZERS``: schedule-free) gets that one instead."""
    groups = param_groups(params, dap.weight_decay)
    own = OPTIMIZERS.get(plan.schedule.name) if plan is not None else None
    if own is not None:
        return own(groups, dap.lr, dap.adam_eps, plan_span(plan))
    return torch.optim.AdamW(groups, lr=dap.lr, eps=dap.adam_eps, fused=fused or None)


def build_optimizers(
    params: list[tuple[str, torch.nn.Parameter]],
    groups: list[ParameterGroup],
    dap: DapConfig,
    fused: bool = False,
    plan: StagePlan | None = None,
) -> list[torch.optim.Optimizer]:
    """The DAP AdamW over ``params`` at ``dap.lr``, less the parameters of the method's declared ``groups``: an
    ``adamw`` group joins it at its own rate (after the DAP groups, so theirs are stepped exactly as without it), an
    ``sgd`` group gets a plain SGD of its own. Without groups: the one AdamW of :func:`build_optimizer`."""
    own = {id(p) for group in groups for _, p in group.parameters}
    adamw = build_optimizer([(n, p) for n, p in params if id(p) not in own], dap, fused, plan)
    optimizers = [adamw]
    for group in groups:
        tensors, lr = [p for _, p in group.parameters], dap.lr if group.lr is None else group.lr
        if group.optimizer == "adamw":
            for part in param_groups(group.parameters, dap.weight_decay):
                if part["params"]:
                    adamw.add_param_group({**part, "lr": lr})
        elif group.optimizer == "adafactor":
            from transformers.optimization import Adafactor

            # Lester et al. 2021: Adafactor at a fixed rate, parameter scaling off, weight decay 1e-5, beta2 decay 0.8
            optimizers.append(Adafactor(tensors, lr=lr, scale_parameter=False, relative_step=False, weight_decay=1e-5))
        else:
            optimizers.append(torch.optim.SGD(tensors, lr=lr))
    return optimizers


def param_groups(params: list[tuple[str, torch.nn.Parameter]], weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on weight matrices, none on biases and LayerNorms."""

    def no_decay(name: str) -> bool:
        return name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name

    return [
        {"params": [p for n, p in params if not no_decay(n)], "weight_decay": weight_decay},
        {"params": [p for n, p in params if no_decay(n)], "weight_decay": 0.0},
    ]


def clipped_parameters(model: torch.nn.Module, groups: list[ParameterGroup]) -> list[torch.nn.Parameter]:
    """The parameters whose gradients the update's norm clipping counts: all of the model's but those of groups
    declared unclipped (every parameter where a method declares no group, as before groups existed)."""
    unclipped = {id(p) for group in groups if not group.clip for _, p in group.parameters}
    return [p for p in model.parameters() if id(p) not in unclipped]


@dataclass
class StageUpdate:
    """What ends an update after its micro-batches: the method's gradient hooks, clipping, the optimizers' and
    schedules' steps, the method's after-step hook.

    Only the DAP AdamW (``optimizer``) is prepared by accelerate; a method group's own optimizer (``extra``: SGD,
    Adafactor) is stepped before it, through the fp16 gradient scaler where there is one, so the scaler's
    once-per-update ``update`` (inside the prepared optimizer's step) comes after every optimizer has been checked for
    overflow."""

    optimizer: Any
    extra: list
    schedules: list
    clipped: list[torch.nn.Parameter]
    method: ContinualMethod
    max_grad_norm: float | None
    replicated: list | None = None
    """Under FSDP2 sharding, the parameters outside the sharded blocks, whose gradients are averaged here."""

    def apply(self, ctx: StepContext) -> None:
        """Take the update of ``ctx``'s accumulated gradients."""
        acc = ctx.accelerator
        scaler = getattr(acc, "scaler", None)
        sharded = self.replicated is not None
        if sharded:
            average_replicated(self.replicated)
        self.method.after_backward(ctx)
        for extra in self.extra if scaler is not None else ():
            scaler.unscale_(extra)  # accelerate unscales only the optimizer it prepared
        if self.max_grad_norm is not None:
            clip = torch.nn.utils.clip_grad_norm_ if sharded else acc.clip_grad_norm_
            clip(self.clipped, self.max_grad_norm)
        for extra in self.extra:
            scaler.step(extra) if scaler is not None else extra.step()
        self.optimizer.step()
        if not acc.optimizer_step_was_skipped:  # fp16 overflow: the schedule waits, as accelerate's would
            for schedule in self.schedules:
                schedule.step()
        self.method.after_optimizer_step(ctx)
        for optimizer in (self.optimizer, *self.extra):
            optimizer.zero_grad(set_to_none=True)
