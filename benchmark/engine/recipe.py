"""The recipe a stage trains with, whatever the method: its updates, learning-rate schedule (one of the registered
schedules of :mod:`benchmark.schedules`) and replay."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from benchmark.config import DapConfig, RunConfig, ScheduleConfig, spelled_config
from benchmark.data.sampling import ReplayPlan
from benchmark.schedules import SCHEDULES, Span, schedule_settings


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
    """The stage's learning-rate schedule on ``optimizer``: the registered schedule ``schedule.name``
    (:mod:`benchmark.schedules`), positioned at the stage's first update, every group's rate first multiplied by
    ``schedule.lr_scale`` (a schedule reads each group's starting rate when it is built)."""
    if plan.schedule.lr_scale != 1.0:
        for group in optimizer.param_groups:
            group["lr"] *= plan.schedule.lr_scale
    return SCHEDULES[plan.schedule.name](optimizer, schedule_settings(plan.schedule), plan_span(plan))


def plan_span(plan: StagePlan) -> Span:
    """Where the stage's updates sit in the sequence, as a schedule sees it."""
    return Span(plan.steps, plan.step_offset, plan.total_steps, plan.warmup_ratio)


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


def recorded_learning_rates(record: Mapping) -> list[float]:
    """The DAP learning rate of every update of a recorded run, as its configuration and method schedule it: one
    schedule per domain in sequence, one over the joint corpus (``joint_training``), one run of its own per stage from
    the base model (``retrains_on_seen``), none for a method that does not pre-train."""
    config = RunConfig.from_dict(spelled_config(record["config"]))
    caps, domains, steps = record["capabilities"], len(record["sequence"]), config.dap.steps
    if not caps.get("pretrains", True):
        return []
    if caps.get("retrains_on_seen"):  # every stage a run of its own from the base model
        return [
            lr for t in range(domains) for lr in learning_rate_curve(config.dap, config.schedule, [steps * (t + 1)])
        ]
    stages = [steps * domains] if caps.get("joint_training") else [steps] * domains
    return learning_rate_curve(config.dap, config.schedule, stages)
