"""The recipe a stage trains with, whatever the method: its updates, learning-rate schedule and replay.

Schedules (``schedule.name``), each built from transformers' schedule functions, as a factor of ``dap.lr`` at
every update of a stage (w = warmup updates, n = the stage's updates, f = ``schedule.min_lr_ratio``):

* ``per_domain_linear`` (default, the paper): per domain, w = ``int(warmup_ratio x n)``; ``s / w`` while
  s < w, then ``(n - s) / (n - w)``.
* ``rewarm_cosine``: per domain, the same warmup, then ``f + (1 - f) x (1 + cos(pi x (s - w) / (n - w))) / 2``.
* ``global``: one schedule over the whole sequence (N = domains x n updates, W = ``int(warmup_ratio x N)``),
  ``rewarm_cosine``'s formula at the global step ``t x n + s``: no re-warming between domains.
* ``wsd``: per domain, warmup ``f + (1 - f) x s / w``, constant 1, then over the last d = ``int(decay_fraction x
  n)`` updates a linear cooldown ``f + (1 - f) x (1 - (s - n + d) / d)`` (transformers' ``get_wsd_schedule``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from benchmark.config import DapConfig, ScheduleConfig
from benchmark.data.sampling import ReplayPlan


@dataclass(frozen=True)
class StagePlan:
    """One stage's updates, its place in the whole sequence, its schedule and its replay pools."""

    steps: int
    step_offset: int
    """Updates of the sequence before this stage (the global step of its first update)."""
    total_steps: int
    """Updates of the whole sequence (the ``global`` schedule spans them)."""
    warmup_ratio: float
    schedule: ScheduleConfig
    replay: tuple[tuple[float, Dataset], ...] = ()
    """``(share, pool)`` per replay pool (general training text, earlier domains' training chunks)."""

    def replay_plan(self, micro: int, micro_per_update: int) -> tuple[ReplayPlan, tuple[Dataset, ...]] | None:
        """The sampler's plan and its pools, None when nothing is replayed."""
        if not any(share > 0 and len(pool) for share, pool in self.replay):
            return None
        shares = tuple(share for share, _ in self.replay)
        pools = tuple(pool for _, pool in self.replay)
        return ReplayPlan(shares, tuple(len(pool) for pool in pools), micro, micro_per_update), pools


def stage_plan(dap: DapConfig, schedule: ScheduleConfig, steps: int, step_offset: int, total: int, replay=()):
    """The :class:`StagePlan` of a stage of ``steps`` updates after ``step_offset`` of ``total``."""
    return StagePlan(steps, step_offset, total, dap.warmup_ratio, schedule, tuple(replay))


def stage_scheduler(optimizer: torch.optim.Optimizer, plan: StagePlan):
    """The stage's learning-rate schedule on ``optimizer`` (module docstring), positioned at the stage's first
    update."""
    from transformers import (
        get_cosine_with_min_lr_schedule_with_warmup,
        get_linear_schedule_with_warmup,
        get_wsd_schedule,
    )

    cfg, n = plan.schedule, plan.steps
    warmup = int(plan.warmup_ratio * n)
    if cfg.name == "per_domain_linear":
        return get_linear_schedule_with_warmup(optimizer, warmup, n)
    if cfg.name == "rewarm_cosine":
        return get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, n, min_lr_rate=cfg.min_lr_ratio)
    if cfg.name == "wsd":
        decay = int(cfg.decay_fraction * n)
        return get_wsd_schedule(
            optimizer, warmup, decay, num_stable_steps=n - warmup - decay, decay_type="linear",
            min_lr_ratio=cfg.min_lr_ratio,
        )  # fmt: skip
    total = plan.total_steps
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, int(plan.warmup_ratio * total), total, min_lr_rate=cfg.min_lr_ratio
    )
    with warnings.catch_warnings():  # moving the schedule to the stage's place before any update is the point
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
        for _ in range(plan.step_offset):
            scheduler.step()
    return scheduler


def learning_rate_curve(dap: DapConfig, schedule: ScheduleConfig, stage_steps: list[int]) -> list[float]:
    """The learning rate of every update of a sequence whose stages have ``stage_steps`` updates, as the runner
    schedules it (one scheduler per stage, on a throwaway optimizer)."""
    out, offset, total = [], 0, sum(stage_steps)
    for steps in stage_steps:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=dap.lr)
        scheduler = stage_scheduler(optimizer, stage_plan(dap, schedule, steps, offset, total))
        for _ in range(steps):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        offset += steps
    return out
