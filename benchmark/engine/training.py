"""The DAP training loop of one stage: the runner's loop that every method's hooks plug into.

Per update: ``accum`` micro-batches of MLM forward + the method's named loss terms + backward ->
``after_backward`` -> optional clipping -> AdamW step -> scheduler -> ``after_optimizer_step``. Loss terms
are summed on the device and read back only every ``log_every`` updates (the loop's one host sync),
where a non-finite term stops the run with a named error.

The micro-batches, their masks and their dropout come from :mod:`benchmark.data.sampling`: seeded per
micro-batch, so N processes (each taking every N-th micro-batch) train what one process trains.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from benchmark.acceleration.compiling import prepare_blocks
from benchmark.acceleration.sharding import accumulating
from benchmark.config import DapConfig
from benchmark.data.sampling import DROPOUT, derived_seed, seeded, stage_stream
from benchmark.engine.hooks import checked_loss_terms, hook_call
from benchmark.engine.optimizers import StageUpdate, stage_optimizers
from benchmark.engine.recipe import StagePlan
from benchmark.engine.recompute import activation_checkpointing
from benchmark.errors import NonFiniteError
from benchmark.families import ModelFamily
from benchmark.io import bar_disabled
from benchmark.method import ContinualMethod, StepContext, StepOutput
from benchmark.modeling import mlm_forward


@contextlib.contextmanager
def _stage_context(model, dap: DapConfig, instrument):
    """Around a stage's updates: activation checkpointing on (if asked) and ``instrument``'s context entered."""
    with activation_checkpointing(model, dap.activation_checkpointing, dap.compile):
        with instrument() if instrument else contextlib.nullcontext():
            yield


def _optimizer_mode(optimizer, mode: str) -> None:
    """Put an optimizer with modes in ``mode`` (``train``/``eval``; schedule-free AdamW trains at an interpolated point
    and is evaluated at its running average); AdamW has none and is left alone."""
    switch = getattr(optimizer, mode, None)
    if callable(switch):
        switch()


def _prepared_step(model, method: ContinualMethod, acc, optimizer, replicated):
    """The module whose forward is one micro-batch's loss, and the optimizer to step, ready for ``acc``.

    The schedule is not prepared: accelerate would step it once per process at every update.
    """
    if replicated is not None:  # sharded by FSDP2: accelerate's DDP would wrap it once more
        return ShardedStep(model, method, acc, replicated), optimizer
    return acc.prepare(DapStep(model, method), optimizer)


def _log_entry(
    sums: dict[str, torch.Tensor], count: int, acc, method: str, step: int, bar, family: ModelFamily
) -> dict:
    """The log entry of the ``count`` updates since the last one: each loss term's mean over every process's
    micro-batches (as in one), shown on the progress bar too (the language-model term under the name of what it is,
    the family's ``loss_name``: ``next-token`` for a decoder, ``mlm`` for a masked LM; the record keeps the key
    ``mlm`` for every family)."""
    if acc.num_processes > 1:
        sums = {k: acc.reduce(v, "mean") for k, v in sums.items()}
    means = finite_means(sums, count, f"{method}: DAP loss term(s)", step)  # the loop's only host sync
    shown = {(family.loss_name if k == "mlm" else k): f"{v:.3f}" for k, v in means.items()}
    bar.set_postfix(shown)
    return {"step": step, **{k: round(v, 5) for k, v in means.items()}}


@dataclass
class DapTrainer:
    """Trains one stage of one method; built by the runner for each stage."""

    method: ContinualMethod
    dap: DapConfig
    tokenizer: Any
    accelerator: Any
    seed: int
    """The run's seed: with the stage, it names every draw of the stage's stream (:mod:`benchmark.data.sampling`)."""
    tracker: Any
    """The run's :class:`~benchmark.engine.tracking.RunTracker` (inactive when no tracker is asked for)."""
    family: ModelFamily
    """The model's family: what its stream's batches predict (masked tokens, next tokens)."""
    show_progress: bool = True
    instrument: Callable[[], contextlib.AbstractContextManager] | None = None
    """Makes a context entered around the stage's updates only (not its setup or evaluation): ``dapbench bench``
    counts FLOPs (``torch.utils.flop_counter``) and records ``torch.profiler`` traces with it."""
    curve: Callable[[Any], dict[str, float]] | None = None
    """Continual evaluation (``dap.eval_every``): the held-out losses of a model on the curve's subsets, measured
    before the stage's first update and every ``eval_every`` updates; None: off."""

    def train(self, model, dataset: Dataset, plan: StagePlan, t: int, desc: str) -> dict:
        """Run ``plan.steps`` updates on ``dataset`` (and its replay pools) and return the stage's statistics."""
        dap, acc, steps = self.dap, self.accelerator, plan.steps
        replicated = prepare_blocks(model, dap, acc.device)
        (optimizer, *extra), schedules, clipped = stage_optimizers(self.method, model, dap, plan, acc)
        accum = max(1, dap.batch_size // (dap.per_device_batch_size * acc.num_processes))
        replay = plan.replay_plan(dap.per_device_batch_size, accum * acc.num_processes)
        stream = training_stream(dataset, self.tokenizer, dap, self.seed, t, acc, self.family, replay)
        step, optimizer = _prepared_step(model, self.method, acc, optimizer, replicated)
        ctx = StepContext(model, t, 0, steps, plan.step_offset, acc, optimizer)
        update = StageUpdate(optimizer, extra, schedules, clipped, self.method, dap.max_grad_norm, replicated)
        start = time.perf_counter()
        _optimizer_mode(optimizer, "train")
        curve = Curve(self.curve) if self.curve is not None else None
        with _stage_context(model, dap, self.instrument):
            log = self._loop(ctx, step, update, iter(stream), accum, desc, curve)
        _optimizer_mode(optimizer, "eval")  # the weights the stage is checkpointed and evaluated at
        seconds = time.perf_counter() - start - (curve.seconds if curve else 0.0)  # the updates' time alone
        stats = stage_statistics(
            steps, steps * accum * dap.per_device_batch_size * dap.seq_len * acc.num_processes, seconds, log
        )
        return {**stats, "curve": curve.entry()} if curve else stats

    def _loop(
        self,
        ctx: StepContext,
        step_module,
        update: StageUpdate,
        batches: Iterator[tuple[int, dict]],
        accum: int,
        desc: str,
        curve: Curve | None = None,
    ) -> list[dict]:
        model, acc, dap = ctx.model, self.accelerator, self.dap
        if curve is not None:
            curve.measure(0, model)  # where the domain starts: the previous one's end (after before_domain)
        tracking = self.tracker.active
        sums: dict[str, torch.Tensor] = {}
        log: list[dict] = []
        last_logged, offset = 0, ctx.global_step
        model.train()
        bar = tqdm(range(ctx.total_domain_steps), desc=desc, disable=bar_disabled(self.show_progress), leave=False)
        for step in bar:
            ctx.domain_step, ctx.global_step = step, offset + step
            terms = {} if tracking else None  # an update's own terms, kept only for a tracker (no work otherwise)
            accumulate(ctx, step_module, batches, accum, self.seed, sums, terms)
            lr = update.schedules[0].get_last_lr()[0]  # the rate this update is taken at, before the schedule steps
            update.apply(ctx)
            if tracking:
                self.tracker.log_update(ctx.global_step + 1, terms, lr)
            if (step + 1) % dap.log_every == 0 or step + 1 == ctx.total_domain_steps:
                log.append(_log_entry(sums, step + 1 - last_logged, acc, self.method.name, step + 1, bar, self.family))
                last_logged = step + 1
            if curve is not None and ((step + 1) % dap.eval_every == 0 or step + 1 == ctx.total_domain_steps):
                curve.measure(step + 1, model)
        return log


class Curve:
    """The held-out losses of one stage's model measured while it trains (``dap.eval_every``): per measured update
    count, every held-out set's loss on its curve subset, and the seconds the measurements took (kept out of the
    stage's training time and speed)."""

    def __init__(self, losses_of: Callable[[Any], dict[str, float]]):
        self.losses_of, self.steps, self.losses, self.seconds = losses_of, [], {}, 0.0

    def measure(self, step: int, model) -> None:
        """Score ``model`` after ``step`` updates of the stage (no gradient; the model's mode is restored)."""
        start = time.perf_counter()
        for name, value in self.losses_of(model).items():
            self.losses.setdefault(name, []).append(value)
        self.steps.append(step)
        self.seconds += time.perf_counter() - start

    def entry(self) -> dict:
        """The stage's ``curve`` as its record entry keeps it."""
        return {"steps": self.steps, "losses": self.losses, "seconds": round(self.seconds, 3)}


def training_stream(
    dataset: Dataset,
    tokenizer,
    dap: DapConfig,
    seed: int,
    stage: int,
    acc,
    family: ModelFamily,
    replay=None,
) -> DataLoader:
    """This process's share of the stage's training stream (with ``replay``'s plan and pools, if any). Not prepared
    by accelerate: it shards itself across processes (:mod:`benchmark.data.sampling`)."""
    return stage_stream(
        dataset,
        tokenizer,
        dap.per_device_batch_size,
        dap.mlm_probability,
        seed,
        stage,
        acc.process_index,
        acc.num_processes,
        dap.loader_workers,
        pin_memory=acc.device.type == "cuda",
        family=family,
        replay=replay,
    )


def accumulate(
    ctx: StepContext,
    step_module,
    batches: Iterator[tuple[int, dict]],
    accum: int,
    seed: int,
    sums: dict,
    update: dict | None = None,
) -> None:
    """Forward and backward of an update's ``accum`` micro-batches (gradients synchronised across processes at the
    last), each under the seed of its global index; adds each loss term's mean into ``sums`` on the device (and
    into ``update``, if given: the update's own means on this process)."""
    acc = ctx.accelerator
    for micro in range(accum):
        ctx.micro_batch, batch = next(batches)
        batch = {k: v.to(acc.device, non_blocking=True) for k, v in batch.items()}
        sync = contextlib.nullcontext() if micro == accum - 1 else _no_sync(acc, step_module)
        with sync, seeded(derived_seed(seed, ctx.domain_index, DROPOUT, ctx.micro_batch), acc.device):
            terms = step_module(batch, ctx)
            acc.backward(sum(terms.values()) / accum)
        for key, value in terms.items():
            share = value.detach() / accum
            sums[key] = sums.get(key, 0) + share
            if update is not None:
                update[key] = update.get(key, 0) + share


def _no_sync(acc, step_module):
    """The context in which a micro-batch accumulates gradients without synchronising them across processes."""
    return accumulating(step_module.model) if isinstance(step_module, ShardedStep) else acc.no_sync(step_module)


class DapStep(torch.nn.Module):
    """One micro-batch's MLM forward and the method's named loss terms, as one module call.

    ``accelerator.prepare`` wraps this module (DDP, autocast), so every forward a method runs, its
    extra passes included, happens inside the wrapper: gradients of every term are synchronised across
    processes and mixed precision covers them. The model is a submodule, so the wrapper sees its parameters.
    """

    def __init__(self, model: torch.nn.Module, method: ContinualMethod):
        super().__init__()
        self.model = model
        self.method = method  # not a module: the wrapper leaves it alone

    def forward(self, batch: dict, ctx: StepContext) -> dict[str, torch.Tensor]:
        """``{"mlm": loss, **method terms}`` of ``batch``."""
        loss, hidden, logits = mlm_forward(self.model, batch)
        where = f"step {ctx.domain_step}"  # the runner's error context names the run and the domain
        with hook_call(self.method, "training_loss", where):
            terms = self.method.training_loss(batch, StepOutput(loss, hidden, logits), ctx)
        return {"mlm": loss, **checked_loss_terms(self.method, terms, where)}


def stage_statistics(steps: int, tokens: int, seconds: float, log: list[dict]) -> dict:
    """A stage's training statistics as the record keeps them (``RunRecord.domains``)."""
    return {
        "steps": steps,
        "train_seconds": round(seconds, 3),
        "tokens": tokens,
        "tokens_per_second": round(tokens / seconds, 1),
        "step_seconds": round(seconds / steps, 4),
        "loss_log": log,
    }


def finite_means(sums: dict[str, torch.Tensor], n: int, what: str, step: int) -> dict[str, float]:
    """The means of the summed loss terms over ``n`` updates (one host sync), emptying ``sums``; a non-finite
    term stops the run with a named error."""
    means = {k: float(v) / n for k, v in sums.items()}
    sums.clear()
    bad = [k for k, v in means.items() if not math.isfinite(v)]
    if bad:
        raise NonFiniteError(
            f"{what} {bad} became non-finite by step {step}", "lower the learning rate or check the method's loss terms"
        )
    return means


class ShardedStep(DapStep):
    """:class:`DapStep` of a model sharded by FSDP2 (:mod:`benchmark.acceleration.sharding`), under accelerate's
    mixed-precision autocast (which ``prepare`` would otherwise have added)."""

    def __init__(self, model: torch.nn.Module, method: ContinualMethod, accelerator, replicated: list):
        super().__init__(model, method)
        self._autocast = accelerator.autocast
        self.replicated = replicated
        """The parameters outside the sharded blocks, whose gradients are averaged after the backward passes."""

    def forward(self, batch: dict, ctx: StepContext) -> dict[str, torch.Tensor]:
        """``{"mlm": loss, **method terms}`` of ``batch`` under the run's autocast."""
        with self._autocast():
            return super().forward(batch, ctx)
