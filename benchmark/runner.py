"""The continual runner: DAP through a domain sequence, end-task fine-tunes, one record per run.

For every stage t of the method's :class:`~benchmark.schedule.StageSchedule`: ``before_domain`` -> train
(:class:`~benchmark.training.DapTrainer`) -> ``after_domain`` -> held-out losses and representation drift
-> atomic checkpoint -> fine-tune the row of A[t][k] that ``--matrix`` asks for. Finished stages and
fine-tunes are files in the run's :class:`~benchmark.layout.RunLayout`, skipped when a run is started again.

:class:`ContinualRun` drives the parts, which share one :class:`RunParts`: :class:`StageModels` (which
model a stage starts from), :class:`BaseEvaluation` (the base model's held-out numbers), :class:`StageRunner`
(train, evaluate, checkpoint one stage) and :class:`EndTaskRunner` (the cells of A[t][k]); the base model's
held-out numbers and the general probe are :mod:`benchmark.heldout`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.config import RunConfig
from benchmark.data import fixed_mlm_batches
from benchmark.environment import environment_facts, make_accelerator, memory_kind, peak_memory_mb, reset_peak_memory
from benchmark.errors import error_context
from benchmark.evaluation import DeviceBatches, heldout_evaluation, heldout_features, representation_drift
from benchmark.finetune import evaluate_end_task
from benchmark.heldout import BaseEvaluation, GeneralProbe
from benchmark.identity import run_identity
from benchmark.inputs import RunData
from benchmark.io import atomic_write_json, read_json
from benchmark.layout import RunClock, RunLayout
from benchmark.method import ContinualMethod, DomainContext, FinetuneContext, RunEnv, build_method
from benchmark.metrics import anisotropy
from benchmark.modeling import load_masked_lm, mlm_loss, restore_checkpoint_weights
from benchmark.records import RunRecord, build_record, run_timing
from benchmark.registry import default_registry
from benchmark.schedule import StageSchedule
from benchmark.training import DapTrainer

SCORES = ("acc", "macro_f1", "micro_f1")
"""The end-task scores of every cell A[t][k] (fractions)."""


@dataclass
class RunParts:
    """What every part of one run shares."""

    config: RunConfig
    data: RunData
    method: ContinualMethod
    seed: int
    layout: RunLayout
    schedule: StageSchedule
    accelerator: Any
    show_progress: bool = True

    @property
    def where(self) -> str:
        """The run, as error messages name it."""
        return f"{self.method.name} seed {self.seed}"


class StageModels:
    """The model a stage starts from, with the method's surgery and state applied."""

    def __init__(self, parts: RunParts):
        self.parts = parts

    def for_stage(self, t: int):
        """The base model where the schedule starts fresh, else checkpoint ``t - 1``."""
        return self.fresh(t) if self.parts.schedule.starts_fresh(t) else self.load(t - 1)

    def fresh(self, t: int):
        """The base model after the method's surgery, with the method state of checkpoint t-1 where it carries."""
        p = self.parts
        model, _ = load_masked_lm(p.config.model)
        model = p.method.setup(model.to(p.accelerator.device))
        if p.schedule.carries_method_state(t):
            p.method.load_state_dict(p.layout.method_state(t - 1))
        return model

    def load(self, t: int):
        """The model of checkpoint ``t`` after the method's surgery, with the method state saved with it."""
        p, checkpoint = self.parts, self.parts.layout.verified_checkpoint(t)
        model, _ = load_masked_lm(str(checkpoint), require_complete=False)
        model = p.method.setup(model.to(p.accelerator.device))
        restore_checkpoint_weights(model, checkpoint)
        p.method.load_state_dict(p.layout.method_state(t))
        return model


class StageRunner:
    """One stage: train (if the method pre-trains), evaluate on held-out text, checkpoint, mark it finished."""

    def __init__(self, parts: RunParts, models: StageModels, base: BaseEvaluation):
        self.parts, self.models, self.base = parts, models, base
        self.general_probe = GeneralProbe(parts)
        self.instrument = None  # set by `dapbench bench` (DapTrainer.instrument)

    def run(self, t: int) -> dict[str, Any]:
        """Run stage ``t`` and write its statistics (whose file marks it finished); return them."""
        p, device = self.parts, self.parts.accelerator.device
        # Seed first: a method's setup may draw random initial weights (adapters, prompts, task embeddings).
        p.layout.restore_rng(t - 1, p.seed + t)
        model = self.models.for_stage(t)
        reset_peak_memory()
        stats: dict[str, Any] = {"domain": p.data.domains[t], "trained": False, "trainable_parameters": 0}
        if p.schedule.trains():
            stats = {**stats, **self._train(model, t)}
        view = self._heldout_view(model)
        evaluation = heldout_evaluation(model, p.data.heldout_batches, device, view, p.accelerator)
        stats["mlm_loss"], stats["mlm_loss_chunks"] = evaluation.losses, evaluation.chunk_sums
        features = heldout_features(model, p.data.feature_batches(), device, view, p.accelerator)
        stats["representation"] = representation_drift(self.base.features(), features)
        stats["peak_memory_mb"] = peak_memory_mb()
        if p.accelerator.is_main_process:  # once; the other processes hold the same model and numbers
            p.layout.save_checkpoint(t, p.accelerator.unwrap_model(model), p.data.tokenizer, p.method.state_dict())
            atomic_write_json(p.layout.domain_done(t), stats)
        p.accelerator.wait_for_everyone()
        p.accelerator.free_memory()
        return stats

    def _train(self, model, t: int) -> dict[str, Any]:
        p, dap = self.parts, self.parts.config.dap
        probe = fixed_mlm_batches(
            p.data.corpora[p.data.domains[t]].train, p.data.tokenizer, dap.probe_chunks, dap.probe_batch_size,
            dap.mlm_probability, seed=1000 + t,
        )  # fmt: skip
        device = p.accelerator.device
        ctx = DomainContext(
            t, p.data.domains[t], model, DeviceBatches(probe, device), p.accelerator, mlm_loss, self.general_probe
        )
        trainable = sum(q.numel() for _, q in p.method.trainable_parameters(model))
        p.method.before_domain(ctx)
        trainer = DapTrainer(p.method, dap, p.data.tokenizer, p.accelerator, p.seed, p.show_progress, self.instrument)
        dataset = p.data.training_set(p.schedule.training_domains(t))
        desc = f"{p.method.name} {p.data.domains[t]}"
        stats = trainer.train(model, dataset, p.schedule.updates(), t, p.schedule.step_offset(t), desc)
        p.method.after_domain(ctx)
        report = p.method.domain_report()
        return {"trained": True, "trainable_parameters": trainable, **stats, "method_report": report}

    def _heldout_view(self, model):
        """Per held-out set name, the method's view of ``model`` for that set's domain (None: general text)."""
        p = self.parts
        index = {name: k for k, name in enumerate(p.data.domains)}
        return lambda name: p.method.heldout_view(p.accelerator.unwrap_model(model), index.get(name))


class EndTaskRunner:
    """The cells A[t][k]: each end task fine-tuned (or probed) from checkpoint t, once."""

    def __init__(self, parts: RunParts, models: StageModels):
        self.parts, self.models = parts, models

    def run_row(self, t: int, on_cell_done=lambda: None) -> None:
        """Every cell of row ``t`` that the matrix mode asks for and that is not finished yet."""
        from transformers import set_seed

        p, row_key, acc = self.parts, self.parts.schedule.row_key(t), self.parts.accelerator
        todo = [k for k in p.schedule.row_tasks(t) if not p.layout.finetune_cell(row_key, k).exists()]
        mine = todo[acc.process_index :: acc.num_processes]  # several processes take whole fine-tunes each
        dap_model = self.models.load(t) if mine else None
        for k in mine:
            task = p.data.tasks[p.data.domains[k]]
            domain_id = k if p.method.capabilities.needs_domain_id_at_finetune else None
            ctx = FinetuneContext(
                p.layout.verified_checkpoint(t), dap_model, task.num_labels, task_domain_index=domain_id
            )
            seed = p.seed + p.config.finetune.seed_offset
            # Seeded before the classifier exists: its fresh head must not depend on what ran before
            # (a resumed run skips work and would otherwise draw a different head).
            set_seed(seed)
            model = p.method.finetune_model(ctx).to(p.accelerator.device)
            with error_context(f"{p.where}, checkpoint after domain {t}, end task {task.name}"):
                result = evaluate_end_task(model, task, p.data.tokenizer, p.config.finetune, seed, p.accelerator)
            atomic_write_json(p.layout.finetune_cell(row_key, k), {"row": t, "task": task.name, **result})
            on_cell_done()
        acc.wait_for_everyone()  # every cell of the row is on disk before anyone reads the matrix or trains on

    def matrices(self) -> tuple[dict[str, list[list[float | None]]], dict[str, list[int]]]:
        """A[t][k] per score from the finished cells (None where the matrix mode skips a cell), and each cell's
        test predictions keyed ``t/k`` (what the report bootstraps the test sample over)."""
        p, size = self.parts, len(self.parts.data.domains)
        out: dict[str, list[list[float | None]]] = {m: [[None] * size for _ in range(size)] for m in SCORES}
        predictions = {}
        for t in p.schedule.stages():
            for k in p.schedule.row_tasks(t):
                cell = read_json(p.layout.finetune_cell(p.schedule.row_key(t), k), "fine-tune result")
                for metric in out:
                    out[metric][t][k] = cell[metric]
                predictions[f"{t}/{k}"] = cell["predictions"]
        return out, predictions


class ContinualRun:
    """Runs one method with one seed through the sequence, resumably, and builds its record."""

    def __init__(self, config: RunConfig, data: RunData, method_name: str, seed: int, show_progress: bool = True):
        cls, accelerator = default_registry().get(method_name), make_accelerator(config)
        self.identity = run_identity(config, cls, data.domains, data.checksums, accelerator.num_processes)
        self.run_id = self.identity.run_id(seed, config.sequence)
        env = RunEnv(len(data.domains), data.domains, seed, base_model=config.model)
        self.parts = RunParts(
            config, data, build_method(cls, config.method_options.get(method_name, {}), env), seed,
            RunLayout(Path(config.work_dir) / "runs" / self.run_id),
            StageSchedule(cls.capabilities, len(data.domains), config.dap.steps, config.matrix),
            accelerator, show_progress,
        )  # fmt: skip
        p = self.parts
        self.method, self.layout, self.schedule, self.seed = p.method, p.layout, p.schedule, p.seed
        self.models, self.base = StageModels(p), BaseEvaluation(p)
        self.stages, self.end_tasks = StageRunner(p, self.models, self.base), EndTaskRunner(p, self.models)

    def execute(self) -> RunRecord:
        """Run (or resume) every stage and fine-tune, then return the complete record."""
        p = self.parts
        p.layout.root.mkdir(parents=True, exist_ok=True)
        clock = RunClock(p.layout.clock)
        self.base.losses()
        clock.save()
        for t in p.schedule.stages():
            if not p.layout.domain_done(t).exists():
                with error_context(f"{p.where}, domain {t} ({p.data.domains[t]})"):
                    self.stages.run(t)
                clock.save()
            self.end_tasks.run_row(t, on_cell_done=clock.save)
            if t > 0 and not p.config.keep_checkpoints and p.accelerator.is_main_process:
                p.layout.discard_checkpoint(t - 1)  # its row is done; the next stage starts from checkpoint t
        return self._record(clock)

    def _record(self, clock: RunClock) -> RunRecord:
        p = self.parts
        stats: list[dict[str, Any] | None] = [None] * len(p.data.domains)
        for t in p.schedule.stages():
            stats[t] = read_json(p.layout.domain_done(t), "domain progress file")
        present = [s for s in stats if s is not None]
        return build_record(
            run_id=self.run_id, identity=self.identity, method=p.method, seed=p.seed, config=p.config, data=p.data,
            stage_stats=stats, cells=self.end_tasks.matrices(), base_losses=self.base.losses(),
            base_chunk_sums=self.base.chunk_sums(),
            base_anisotropy={name: round(anisotropy(v), 5) for name, v in self.base.features().items()},
            timing=run_timing(clock, present, memory_kind()), environment=environment_facts(p.accelerator),
        )  # fmt: skip
