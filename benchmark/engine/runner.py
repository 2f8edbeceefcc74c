"""The continual runner: DAP through a domain sequence, end-task fine-tunes, one record per run.

For every stage t of the method's :class:`~benchmark.engine.schedule.StageSchedule`: ``before_domain`` -> train
(:class:`~benchmark.engine.training.DapTrainer`) -> ``after_domain`` -> held-out losses and representation drift
-> atomic checkpoint -> fine-tune the row of A[t][k] that ``--matrix`` asks for. Finished stages and
fine-tunes are files in the run's :class:`~benchmark.engine.layout.RunLayout`, skipped when a run is started again.

:class:`ContinualRun` drives the parts, which share one :class:`RunParts`: :class:`StageModels` (which
model a stage starts from), :class:`BaseEvaluation` (the base model's held-out numbers), :class:`StageRunner`
(train, evaluate, checkpoint one stage) and :class:`EndTaskRunner` (the cells of A[t][k]); the base model's
held-out numbers and the general probe are :mod:`benchmark.engine.heldout`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmark.config import RunConfig
from benchmark.data.inputs import RunData
from benchmark.engine.cells import EndTaskRunner
from benchmark.engine.environment import environment_facts, make_accelerator, memory_kind
from benchmark.engine.heldout import BaseEvaluation
from benchmark.engine.layout import RunClock, RunLayout
from benchmark.engine.parts import RunParts
from benchmark.engine.progress import RunPosition, RunProgress
from benchmark.engine.schedule import StageSchedule, run_phases, stage_phases
from benchmark.engine.stages import OWN_DOMAIN, StageModels, StageRunner
from benchmark.engine.tracking import RunTracker
from benchmark.engine.workfiles import finished, read_work_file
from benchmark.errors import DapbenchError, error_context
from benchmark.io import unlinked_path
from benchmark.method import ContinualMethod, RunEnv, build_method
from benchmark.metrics import anisotropy
from benchmark.records.build import build_record, run_timing
from benchmark.records.identity import run_identity
from benchmark.records.schema import RunRecord
from benchmark.records.store import kind_neutral


class ContinualRun:
    """Runs one method with one seed through the sequence, resumably, and builds its record."""

    def __init__(
        self,
        config: RunConfig,
        data: RunData,
        cls: type[ContinualMethod],
        seed: int,
        show_progress: bool = True,
        position: RunPosition | None = None,
    ):
        """``cls``: the method's class (the API resolves a registered name: :func:`benchmark.api.continual_run`; the
        engine never imports the registry, which imports the methods, which use the engine)."""
        accelerator = make_accelerator(config)
        self.identity = run_identity(config, cls, data.domains, data.checksums, accelerator.num_processes)
        self.run_id = self.identity.run_id(seed, config.sequence)
        env = RunEnv(len(data.domains), data.domains, seed, base_model=config.model)
        self.parts = RunParts(
            config,
            data,
            build_method(cls, config.method_options.get(cls.name, {}), env),
            seed,
            RunLayout(unlinked_path(config.work_dir, "runs", self.run_id)),
            StageSchedule(cls.capabilities, len(data.domains), config.dap.steps, config.matrix),
            accelerator,
            RunTracker(accelerator, config.report_to, self.run_id, config.to_dict()),
            show_progress,
        )
        p = self.parts
        self.method, self.layout, self.schedule, self.seed = p.method, p.layout, p.schedule, p.seed
        self.models, self.base = StageModels(p), BaseEvaluation(p)
        self.stages, self.end_tasks = StageRunner(p, self.models, self.base), EndTaskRunner(p, self.models)
        self.position = position or RunPosition()  # which run of the grid this is: ``run i/n`` on its progress line

    def execute(self) -> RunRecord:
        """Run (or resume) every stage and fine-tune, then return the complete record."""
        p = self.parts
        p.layout.root.mkdir(parents=True, exist_ok=True)
        clock = _clock(p)
        p.tracker.start()
        shown = p.show_progress and p.accelerator.is_main_process
        phases = run_phases(p.schedule, beside=len(self.end_tasks.protocols()) > 1)
        p.progress = RunProgress(p.where, self.position, p.data.domains, phases, enabled=shown)
        try:
            self._stages(clock)
        finally:
            p.progress.close()
            p.progress = None
        record = _record(self, clock)
        p.tracker.log_values("final", record["summary"])
        p.tracker.finish()
        return record

    def pretrain_only(self) -> dict[str, float]:
        """Every stage not finished yet (resumably), without the end tasks; the losses measured after the last stage
        (what ``dapbench tune`` compares)."""
        return self.pretrained_stages()[-1]["lm_loss"]

    def pretrained_stages(self, own_domain_only: bool = False) -> list[dict[str, Any]]:
        """Every stage not finished yet (resumably), without the end tasks; every stage's statistics, in the order
        of the schedule's stages (what ``dapbench reproduce --stages-only`` compares with a record's). With
        ``own_domain_only``, each stage is evaluated on its own domain's held-out set alone (no drift, no base model
        evaluation: ``RunParts.own_domain_only``)."""
        p = self.parts
        p.layout.root.mkdir(parents=True, exist_ok=True)
        shown = p.show_progress and p.accelerator.is_main_process
        phases = 1 + len(p.schedule.stages()) * stage_phases(p.schedule)
        p.progress = RunProgress(p.where, self.position, p.data.domains, phases, enabled=shown)
        p.own_domain_only = own_domain_only  # for this call only: a later execute() evaluates every set again
        try:
            self._stages(_clock(p), end_tasks=False)
        finally:
            p.progress.close()
            p.progress = None
            p.own_domain_only = False
        return [_stage_stats(p, t) for t in p.schedule.stages()]

    def _stages(self, clock: RunClock, end_tasks: bool = True) -> None:
        """The base model's evaluation, then every stage and end-task row not finished yet, on the progress line."""
        p = self.parts
        if p.own_domain_only:  # the base model's numbers serve the stages' drift and the record, neither made then
            p.skip_phases(1)
        else:
            with p.phase(None, "held-out evaluation"):
                self.base.losses()
        clock.save()
        for t in p.schedule.stages():
            if finished(p.layout.domain_done(t), "domain progress file", p.accelerator.is_main_process):
                _require_scope(p, t)
                p.skip_phases(stage_phases(p.schedule))
            else:
                with error_context(f"{p.where}, domain {t} ({p.data.domains[t]})"):
                    self.stages.run(t)
                clock.save()
            if end_tasks:
                self.end_tasks.run_row(t, on_cell_done=clock.save)
            if t > 0 and not p.config.keep_checkpoints and p.accelerator.is_main_process:
                p.layout.discard_checkpoint(t - 1)  # its row is done; the next stage starts from checkpoint t


def _require_scope(p: RunParts, t: int) -> None:
    """A finished stage is taken as it is only if it was evaluated on the sets this run evaluates: a stage of a cheap
    stages-only check (its own domain's set alone) never stands in for a run's, nor the other way round."""
    scope = read_work_file(p.layout.domain_done(t), "domain progress file").get("heldout_scope")
    if (scope == OWN_DOMAIN) != p.own_domain_only:
        raise DapbenchError(
            f"{p.layout.root} holds domain {t} evaluated on {'its own held-out set alone' if scope else 'every set'},"
            f" and this run evaluates {'its own set alone' if p.own_domain_only else 'every set'}",
            "give this run an output folder of its own (--output-dir)",
        )


def _stage_stats(p: RunParts, t: int) -> dict[str, Any]:
    """Stage ``t``'s progress file; one written before the held-out losses had kind-neutral names (a run started by
    that code and resumed by this one) is read under the names of now."""
    return kind_neutral(read_work_file(p.layout.domain_done(t), "domain progress file"))


def _record(run: ContinualRun, clock: RunClock) -> RunRecord:
    """The complete record of ``run`` from its finished stages' files, end-task cells and clock."""
    p = run.parts
    stats: list[dict[str, Any] | None] = [None] * len(p.data.domains)
    for t in p.schedule.stages():
        stats[t] = _stage_stats(p, t)
    present = [s for s in stats if s is not None]
    return build_record(
        run_id=run.run_id,
        identity=run.identity,
        method=p.method,
        seed=p.seed,
        config=p.config,
        data=p.data,
        stage_stats=stats,
        cells=(*run.end_tasks.matrices(), run.end_tasks.seed_predictions()),
        beside=run.end_tasks.beside(),
        base_losses=run.base.losses(),
        base_chunk_sums=run.base.chunk_sums(),
        base_anisotropy={name: round(anisotropy(v), 5) for name, v in run.base.features().items()},
        timing=run_timing(clock, present, memory_kind(), run.base.seconds(), run.end_tasks.seconds()),
        environment=environment_facts(p.accelerator),
    )


def run_once(run: ContinualRun, path: Path, echo: Callable[[str], None], describe: Callable[[RunRecord], str]):
    """The record of ``run``: kept if it exists, else made now and written to ``path``; None if another command
    holds the run. With several processes, the main one takes the lock and decides for all, and only it writes."""
    import contextlib

    from accelerate import PartialState

    from benchmark.engine.layout import run_lock
    from benchmark.records.store import load_record, write_record

    name, main = f"{run.method.name} seed {run.seed}", PartialState().is_main_process
    with run_lock(run.layout.root) if main else contextlib.nullcontext(True) as locked:
        decision = _main_decides("run" if locked and not path.is_file() else "kept" if locked else "held")
        if decision == "held":
            echo(f"{name}: in progress in another process, skipped (its record lands in {path})")
            return None
        if decision == "kept":  # a finished run is not redone, rewritten or counted again
            echo(f"{name}: complete, kept {path} (delete it to run again)")
            return load_record(path)
        record = run.execute()
        if main:
            write_record(path, record)
            echo(f"{name}: {describe(record)} -> {path}")
        return record


def _main_decides(decision: str) -> str:
    """The main process's ``decision``, on every process of a multi-process run (itself when alone)."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    if PartialState().num_processes == 1:
        return decision
    return broadcast_object_list([decision], from_process=0)[0]


def _clock(p: RunParts) -> RunClock:
    """The run's time ledger, which on a CPU also holds it to the thread count it started with."""
    return RunClock(p.layout.clock, on_cpu=p.accelerator.device.type == "cpu")
