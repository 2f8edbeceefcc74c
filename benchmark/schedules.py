"""The DAP learning-rate schedules: one registry, one function per schedule (issue #48: one place defines each
variation point; issue #50: the infinite and cyclic schedules of 2024-2025 continual pre-training).

A schedule is a function ``(optimizer, settings, span) -> LR scheduler`` registered under its ``schedule.name`` with
:func:`register_schedule`; its docstring is what ``dapbench list`` and the docs say of it. ``settings`` are its own
typed settings (a frozen dataclass it declares when it registers: :class:`NoSettings`, :class:`FloorSettings`,
:class:`CooldownSettings`, :class:`RewarmSettings`, or a plugin's), read from the run's
:class:`~benchmark.config.ScheduleConfig` by field name (:func:`schedule_settings`); ``span`` is where the stage's
updates sit in the sequence (:class:`Span`). The run's config keeps one ``schedule`` section, the union of the
settings' fields, because a run's id is the digest of that section as records have always written it; a value a chosen
schedule does not read is refused before any work (:func:`check_schedule`), so every setting a run states is one
its schedule uses.
The scheduler gives a factor of ``dap.lr`` at every update of the stage. Notation: s = the update within the stage,
n = its updates, w = ``int(dap.warmup_ratio x n)``, t = the stage's index, f = ``schedule.min_lr_ratio``.

Adding a schedule is one function here (or in a plugin module that imports :func:`register_schedule`), its test and a
line of docs: ``schedule.name`` accepts every registered name, and the schedule's non-default options enter the run
id and label the row as every recipe option does.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from benchmark.errors import DapbenchError
from benchmark.plugins import RegistrationError, Registry
from benchmark.settings import settings_view


@dataclass(frozen=True)
class Span:
    """Where a stage's updates sit in the sequence."""

    steps: int
    offset: int
    """Updates of the sequence before this stage (the global step of its first update)."""
    total: int
    """Updates of the whole sequence."""
    warmup_ratio: float

    @property
    def warmup(self) -> int:
        """w: the stage's warmup updates."""
        return int(self.warmup_ratio * self.steps)

    @property
    def index(self) -> int:
        """t: the stage's place in the sequence (stages have equal updates)."""
        return self.offset // max(1, self.steps)


@dataclass(frozen=True)
class NoSettings:
    """A schedule that reads no setting of its own (its shape is fixed by the warmup and the stage's updates)."""


@dataclass(frozen=True)
class FloorSettings:
    """A schedule that decays to a floor."""

    min_lr_ratio: float
    """f: the floor, as a share of ``dap.lr``."""


@dataclass(frozen=True)
class CooldownSettings(FloorSettings):
    """A schedule that cools down to its floor over the last share of each domain's updates."""

    decay_fraction: float
    """The share of each domain's updates spent cooling down."""


@dataclass(frozen=True)
class RewarmSettings(FloorSettings):
    """A cyclic schedule whose later domains re-warm to a lower peak."""

    rewarm_ratio: float
    """p: the peak every domain after the first re-warms to, as a share of ``dap.lr``."""


Schedule = Callable[[torch.optim.Optimizer, object, Span], torch.optim.lr_scheduler.LRScheduler]
OptimizerFactory = Callable[[list[dict], float, float, Span], torch.optim.Optimizer]
SCHEDULES: Registry[Schedule] = Registry(
    "schedule",
    "dapbench.schedules",
    "a plugin registers its own with benchmark.schedules.register_schedule or the entry-point group dapbench.schedules",
)
"""Every registered schedule by name (``schedule.name`` accepts exactly these)."""
SETTINGS: dict[str, type] = {}
"""Each registered schedule's typed settings class (:func:`register_schedule`)."""
OPTIMIZERS: dict[str, OptimizerFactory] = {}
"""The schedules that bring their own DAP optimizer (schedule-free training): ``(param groups, lr, eps, span) ->
optimizer``, used instead of AdamW; every other schedule shapes the rate of the DAP AdamW."""


def register_schedule(
    name: str, settings: type = NoSettings, optimizer: OptimizerFactory | None = None
) -> Callable[[Schedule], Schedule]:
    """Register the decorated function as the schedule ``name`` (a second function under one name is an error),
    with its typed ``settings`` (a frozen dataclass whose fields are :class:`~benchmark.config.ScheduleConfig`
    fields, checked when a run names it: :func:`check_schedule`) and the DAP optimizer it needs instead of AdamW, if
    any."""

    def add(schedule: Schedule) -> Schedule:
        SCHEDULES.add(name, schedule)
        SETTINGS[name] = settings
        if optimizer is not None:
            OPTIMIZERS[name] = optimizer
        return schedule

    return add


SHARED_SETTINGS = ("name", "lr_scale")
"""``schedule.*`` fields every schedule reads: which schedule, and the multiplier of every starting rate (applied by
the stage's recipe, :func:`benchmark.engine.recipe.stage_scheduler`, before any schedule shapes the rate)."""


def schedule_settings(config) -> object:
    """The typed settings of ``config.name``'s schedule, read from the run's ``schedule`` section by field name."""
    SCHEDULES.get(config.name)  # loads a plugin's schedule (and its settings) on first use
    return settings_view(SETTINGS[config.name], config)


def check_schedule(config) -> None:
    """Refuse, before any work, a run's ``schedule`` section (:class:`~benchmark.config.ScheduleConfig`) whose schedule
    declares a setting the section lacks, or that sets a value away from its default which its schedule does not
    read (it would enter the run id and label the row while changing nothing)."""
    SCHEDULES.get(config.name)  # loads a plugin's schedule (and its settings) on first use
    declared = {f.name for f in fields(SETTINGS[config.name])}
    known = {f.name for f in fields(config)}
    if unknown := sorted(declared - known):
        raise RegistrationError(
            f"schedule {config.name!r} declares settings {', '.join(unknown)} that schedule.* does not have",
            f"read only these fields of ScheduleConfig: {', '.join(sorted(known))}",
        )
    read = declared | set(SHARED_SETTINGS)
    for f in fields(config):
        if f.name not in read and getattr(config, f.name) != f.default:
            readers = [n for n in SCHEDULES.names() if f.name in {g.name for g in fields(SETTINGS[n])}] or ["none"]
            raise DapbenchError(
                f"schedule.{f.name}={getattr(config, f.name)!r} is not read by schedule.name={config.name}"
                f" (it reads {', '.join(sorted(read - {'name'}))})",
                f"drop schedule.{f.name}, or choose a schedule that reads it: {', '.join(readers)}",
            )


def describe_schedules() -> dict[str, str]:
    """Name -> the first line of its docstring, for listings."""
    return {name: (schedule.__doc__ or "").strip().splitlines()[0] for name, schedule in SCHEDULES.items()}


@register_schedule("per_domain_linear")
def per_domain_linear(optimizer, settings: NoSettings, span: Span):
    """Per domain, linear warmup to lr and linear decay to 0 (the DAS paper): ``s / w`` while s < w, then ``(n - s) /
    (n - w)``."""
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, span.warmup, span.steps)


@register_schedule("rewarm_cosine", FloorSettings)
def rewarm_cosine(optimizer, settings: FloorSettings, span: Span):
    """Per domain, the same warmup, then cosine decay to the floor: ``f + (1 - f) x (1 + cos(pi x (s - w) / (n -
    w))) / 2``."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    return get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, span.warmup, span.steps, min_lr_rate=settings.min_lr_ratio
    )


@register_schedule("global", FloorSettings)
def global_cosine(optimizer, settings: FloorSettings, span: Span):
    """One schedule over the whole sequence (N updates, W = ``int(warmup_ratio x N)``): ``rewarm_cosine``'s formula
    at the global step ``t x n + s``, no re-warming between domains."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    total = span.total
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, int(span.warmup_ratio * total), total, min_lr_rate=settings.min_lr_ratio
    )
    return _advanced(scheduler, span.offset)


@register_schedule("wsd", CooldownSettings)
def warmup_stable_decay(optimizer, settings: CooldownSettings, span: Span):
    """Per domain, warmup ``f + (1 - f) x s / w``, constant 1, then over the last d = ``int(decay_fraction x n)``
    updates a linear cooldown ``f + (1 - f) x (1 - (s - n + d) / d)`` (transformers' ``get_wsd_schedule``)."""
    from transformers import get_wsd_schedule

    decay = int(settings.decay_fraction * span.steps)
    stable = span.steps - span.warmup - decay
    return get_wsd_schedule(
        optimizer, span.warmup, decay, num_stable_steps=stable, decay_type="linear", min_lr_ratio=settings.min_lr_ratio
    )


@register_schedule("cyclic_cosine", RewarmSettings)
def cyclic_cosine(optimizer, settings: RewarmSettings, span: Span):
    """Repeated cosine with a lower re-warming peak (Gupta et al. 2023's re-warming; TiC-LM's cyclic cosine): the
    first domain as ``rewarm_cosine``, every later one warms to p = ``rewarm_ratio`` instead of 1 and decays to the
    same floor: ``p x s / w``, then ``f + (p - f) x (1 + cos(pi x (s - w) / (n - w))) / 2`` (p = 1 is
    ``rewarm_cosine``)."""
    peak = 1.0 if span.index == 0 else settings.rewarm_ratio
    floor, warmup, steps = settings.min_lr_ratio, span.warmup, span.steps

    def factor(s: int) -> float:
        if s < warmup:
            return peak * s / max(1, warmup)
        progress = (s - warmup) / max(1, steps - warmup)
        return floor + (peak - floor) * (1 + math.cos(math.pi * progress)) / 2

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@register_schedule("rsqrt", CooldownSettings)
def inverse_sqrt(optimizer, settings: CooldownSettings, span: Span):
    """Infinite (Ibrahim et al. 2024; TiC-LM's rsqrt): one warmup at the sequence's start (the first domain's w
    updates), then ``sqrt(w / g)`` at the global step g, with no horizon; each domain's model is cooled down before
    it is evaluated, linearly over its last d = ``int(decay_fraction x n)`` updates to f times the rsqrt value, and
    the next domain resumes the rsqrt curve without re-warming."""
    warmup, steps, offset = max(1, span.warmup), span.steps, span.offset
    cooldown = int(settings.decay_fraction * steps)
    floor = settings.min_lr_ratio

    def factor(s: int) -> float:
        g = offset + s
        value = g / warmup if g < warmup else math.sqrt(warmup / g)
        if s >= steps - cooldown:
            value *= floor + (1 - floor) * (1 - (s - (steps - cooldown)) / max(1, cooldown))
        return value

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _schedule_free_adamw(groups: list[dict], lr: float, eps: float, span: Span) -> torch.optim.Optimizer:
    import schedulefree

    # The warmup is the schedule's (below), the same ``(k + 1) / w`` the optimizer's own would apply, so that the
    # rate a run logs and ``dapbench lr-curve`` draws is the rate it trained at.
    return schedulefree.AdamWScheduleFree(groups, lr=lr, eps=eps, warmup_steps=0)


@register_schedule("schedule_free", optimizer=_schedule_free_adamw)
def schedule_free(optimizer, settings: NoSettings, span: Span):
    """Schedule-free AdamW (Defazio et al. 2024; the ``schedulefree`` package) instead of AdamW with a schedule:
    ``(s + 1) / w`` while s < w, then a constant 1 with no decay; the model trains at the optimizer's interpolated
    point and is checkpointed and evaluated at its running average (its eval mode). Each domain starts a fresh
    optimizer, as with every schedule, so warmup and average restart per domain."""
    warmup = span.warmup
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / warmup if s < warmup else 1.0)


def _advanced(scheduler, updates: int):
    """``scheduler`` moved ``updates`` steps on, to the stage's place in a schedule over the whole sequence."""
    with warnings.catch_warnings():  # moving the schedule before any update is the point
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
        for _ in range(updates):
            scheduler.step()
    return scheduler
