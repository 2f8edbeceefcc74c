"""The continual runner: DAP through a domain sequence, end-task fine-tunes, one JSON record per run.

For every domain t of the sequence: ``before_domain`` -> train (owned step counter) ->
``after_domain`` -> atomic checkpoint (model + method state + RNG) -> MLM loss on every held-out
corpus -> fine-tune the row of A[t][k] that ``--matrix`` asks for. Finished domains and finished
fine-tunes are skipped when a run is started again.
"""

from __future__ import annotations

import contextlib
import math
import random
import resource
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset
from tqdm.auto import tqdm

from benchmark.config import DapConfig, RunConfig
from benchmark.data import (
    Corpus,
    MlmCollator,
    TaskSuite,
    batches_checksum,
    fixed_mlm_batches,
    load_corpus,
    load_end_task,
    load_heldout_text,
    load_suite,
    package_versions,
    resolve_corpus_path,
)
from benchmark.errors import DapbenchError, NonFiniteError, error_context
from benchmark.evaluation import heldout_features, heldout_losses, representation_drift
from benchmark.finetune import EncodedTask, encode_task, finetune_and_evaluate, probe_and_evaluate
from benchmark.io import atomic_directory, atomic_write_bytes, atomic_write_json, read_json
from benchmark.method import (
    ContinualMethod,
    DomainContext,
    FinetuneContext,
    RunEnv,
    StepContext,
    StepOutput,
    build_method,
)
from benchmark.metrics import anisotropy, loss_metrics, summarize_matrix
from benchmark.modeling import load_masked_lm, mlm_forward, mlm_loss, restore_checkpoint_weights
from benchmark.registry import default_registry

GENERAL = "general"


@dataclass
class RunData:
    """Everything data-side a run needs, loaded once and shared by the methods and seeds of a run."""

    suite: TaskSuite
    domains: tuple[str, ...]
    tokenizer: Any
    corpora: dict[str, Corpus]
    heldout_batches: dict[str, list[dict]]
    """Fixed-mask held-out MLM batches per domain corpus (and ``general`` when given)."""
    tasks: dict[str, EncodedTask]
    checksums: dict[str, str] = field(default_factory=dict)

    def heldout_checksums(self) -> dict[str, str]:
        """Per held-out set, a hash of its masked batches: equal hashes mean bit-identical evaluations."""
        return {name: batches_checksum(batches) for name, batches in self.heldout_batches.items()}


def prepare_data(config: RunConfig) -> RunData:
    """Load the suite, tokenizer, corpora (packed, cached) and end tasks (re-split, encoded)."""
    from transformers import AutoTokenizer

    suite = load_suite(config.data_root)
    domains = suite.sequence(config.sequence)
    sources = {name: resolve_corpus_path(suite.domains[name].corpus, config.data_root) for name in domains}
    try:
        tokenizer = AutoTokenizer.from_pretrained(config.model)
    except (OSError, ValueError) as exc:
        raise DapbenchError(
            f"cannot load the tokenizer of {config.model!r}: {exc}",
            "pass --model with a hub id or a model directory",
        ) from exc
    dap = config.dap
    cache_dir = Path(config.work_dir) / "cache"
    corpora, heldout, tasks, checksums = {}, {}, {}, {}
    for name in domains:
        spec = suite.domains[name]
        task = load_end_task(suite.end_tasks[spec.end_task], config.data_root, check_sizes=suite.source == "builtin")
        corpus = load_corpus(
            name, sources[name], tokenizer, dap.seq_len, dap.heldout_fraction, dap.max_corpus_lines, cache_dir
        )
        corpora[name], tasks[name] = corpus, encode_task(task, tokenizer, config.finetune)
        checksums[f"corpus/{name}"], checksums[f"task/{task.name}"] = corpus.checksum, task.checksum
    for name, corpus in corpora.items():
        heldout[name] = _heldout_batches(corpus.heldout, tokenizer, dap)
    if config.general_heldout:
        general, checksums[f"corpus/{GENERAL}"] = load_heldout_text(
            GENERAL, config.general_heldout, tokenizer, dap.seq_len, cache_dir
        )
        heldout[GENERAL] = _heldout_batches(general, tokenizer, dap)
    return RunData(suite, domains, tokenizer, corpora, heldout, tasks, checksums)


def _heldout_batches(dataset, tokenizer, dap: DapConfig) -> list[dict]:
    if len(dataset) == 0:
        raise DapbenchError("a held-out corpus slice yields no full chunk", "lower dap.seq_len or use more text")
    return fixed_mlm_batches(dataset, tokenizer, dap.heldout_chunks, dap.per_device_batch_size, dap.mlm_probability)


# ----------------------------------------------------------------------------------------------
# One run = one method x one seed
# ----------------------------------------------------------------------------------------------
class ContinualRun:
    """Runs one method with one seed through the sequence, resumably, and writes its record."""

    def __init__(self, config: RunConfig, data: RunData, method_name: str, seed: int, show_progress: bool = True):
        self.config, self.data, self.seed = config, data, seed
        self.method_cls = default_registry().get(method_name)
        self.caps = self.method_cls.capabilities
        self.run_id = run_id(config, method_name, seed)
        self.root = Path(config.work_dir) / "runs" / self.run_id
        self.show_progress = show_progress
        self.accelerator = _make_accelerator(config)
        if self.accelerator.num_processes > 1:
            # The MLM and method passes call the encoder inside the wrapper, which would bypass DDP's
            # gradient synchronisation: refuse rather than train silently wrong.
            raise DapbenchError(
                "multi-process (DDP) DAP training is not supported yet",
                "run one process per job (a single GPU); multi-GPU support is future work",
            )
        self.T = len(data.domains)
        self._general_batches: list[dict] | None = None
        env = RunEnv(self.T, data.domains, seed, self.root / "scratch")
        env.scratch_dir.mkdir(parents=True, exist_ok=True)
        self.method: ContinualMethod = build_method(self.method_cls, config.method_options.get(method_name, {}), env)

    # -- paths -------------------------------------------------------------------------------------
    def _ckpt(self, t: int) -> Path:
        return self.root / f"checkpoint-{t}"

    def _done(self, t: int) -> Path:
        return self.root / f"domain-{t}.json"

    def _pair(self, row_key: str, k: int) -> Path:
        return self.root / "finetune" / f"{row_key}-task{k}.json"

    # -- driver ------------------------------------------------------------------------------------
    def execute(self) -> dict:
        """Run (or resume) every domain and fine-tune, then return the complete record."""
        clock = _RunClock(self.root / "elapsed.json")
        base_losses = self._base_losses()
        self._base_features()
        clock.save()
        for t in self._stages():
            if not self._done(t).exists():
                with error_context(f"{self.method_cls.name} seed {self.seed}, domain {t} ({self.data.domains[t]})"):
                    self._run_domain(t)
                clock.save()
            self._finetune_row(t, on_pair_done=clock.save)
            if t > 0 and not self.config.keep_checkpoints and self._ckpt(t - 1).exists():
                shutil.rmtree(self._ckpt(t - 1))
        return self._record(base_losses, clock)

    def _stages(self) -> list[int]:
        """The domains after which a checkpoint exists: every one, or only the last for joint training
        (one model trained once on the union of all corpora)."""
        return [self.T - 1] if self.caps.joint_training else list(range(self.T))

    def _base_losses(self) -> dict[str, float]:
        path = self.root / "base-mlm-loss.json"
        if not path.exists():
            model, _ = load_masked_lm(self.config.model)
            atomic_write_json(
                path,
                heldout_losses(model.to(self.accelerator.device), self.data.heldout_batches, self.accelerator.device),
            )
        return read_json(path, "base MLM-loss file")

    def _base_features(self) -> dict[str, np.ndarray]:
        """The base model's held-out features (computed once per run directory)."""
        path = self.root / "base-features.npz"
        if not path.exists():
            model, _ = load_masked_lm(self.config.model)
            features = heldout_features(
                model.to(self.accelerator.device), self.data.heldout_batches, self.accelerator.device
            )
            atomic_write_bytes(path, lambda tmp: np.savez(tmp, **features))
        with np.load(path, allow_pickle=False) as saved:
            return {name: saved[name] for name in saved.files}

    # -- one domain --------------------------------------------------------------------------------
    def _run_domain(self, t: int) -> None:
        name = self.data.domains[t]
        # Seed first: a method's setup may draw random initial weights (adapters, prompts, task embeddings).
        _restore_rng(self._ckpt(t - 1) / "rng.pt" if t > 0 else None, self.seed + t)
        model = self._model_for_domain(t)
        _reset_peak_memory()
        probe = _DeviceBatches(self._probe_batches(t), self.accelerator.device)
        ctx = DomainContext(t, name, model, probe, self.accelerator, mlm_loss, general_probe=self._general_probe)
        stats: dict[str, Any] = {"domain": name, "trained": False, "trainable_parameters": 0}
        if self.caps.pretrains:
            stats["trainable_parameters"] = sum(p.numel() for _, p in self.method.trainable_parameters(model))
            self.method.before_domain(ctx)
            stats = {**stats, "trained": True, **self._train(model, t)}
            ctx.model = model
            self.method.after_domain(ctx)
            stats["method_report"] = self.method.domain_report()
        device, view = self.accelerator.device, self._heldout_view(model)
        stats["mlm_loss"] = heldout_losses(model, self.data.heldout_batches, device, view)
        features = heldout_features(model, self.data.heldout_batches, device, view)
        stats["representation"] = representation_drift(self._base_features(), features)
        stats["peak_memory_mb"] = _peak_memory_mb()
        self._save_checkpoint(t, model)
        atomic_write_json(self._done(t), stats)
        self.accelerator.free_memory()

    def _heldout_view(self, model):
        """Per held-out set name, the method's view of ``model`` for that set's domain (None: general text)."""
        index = {name: k for k, name in enumerate(self.data.domains)}
        return lambda name: self.method.heldout_view(self.accelerator.unwrap_model(model), index.get(name))

    def _model_for_domain(self, t: int):
        """Base model at the first domain and for independent methods, else checkpoint t-1."""
        caps = self.caps
        fresh = t == 0 or caps.independent_per_domain or caps.joint_training or not caps.pretrains
        if not fresh:
            return self._load_checkpoint_model(t - 1)
        model, _ = load_masked_lm(self.config.model)
        model = self.method.setup(model.to(self.accelerator.device))
        if t > 0 and not caps.joint_training:
            state = load_plain(self._ckpt(t - 1) / "method_state.pt", "method state")
            self.method.load_state_dict(state)
        return model

    def _probe_batches(self, t: int) -> list[dict]:
        dap = self.config.dap
        corpus = self.data.corpora[self.data.domains[t]]
        return fixed_mlm_batches(
            corpus.train,
            self.data.tokenizer,
            dap.probe_chunks,
            dap.probe_batch_size,
            dap.mlm_probability,
            seed=1000 + t,
        )

    def _general_probe(self) -> _DeviceBatches | None:
        """A fixed masked subset of the general training corpus, loaded on first use."""
        if not self.config.general_corpus:
            return None
        if self._general_batches is None:
            dap = self.config.dap
            dataset, _ = load_heldout_text(
                "general-train",
                self.config.general_corpus,
                self.data.tokenizer,
                dap.seq_len,
                Path(self.config.work_dir) / "cache",
                max_lines=dap.max_corpus_lines,
            )
            self._general_batches = fixed_mlm_batches(
                dataset, self.data.tokenizer, dap.probe_chunks, dap.probe_batch_size, dap.mlm_probability, seed=999
            )
        return _DeviceBatches(self._general_batches, self.accelerator.device)

    def _training_set(self, t: int) -> tuple[Dataset, int]:
        """Domain t's training chunks and its number of updates; for joint training the union of all
        corpora with the whole sequence's budget (T x steps), so it sees as many tokens as a continual run."""
        if self.caps.joint_training:
            union = ConcatDataset([self.data.corpora[name].train for name in self.data.domains])
            return union, self.T * self.config.dap.steps
        return self.data.corpora[self.data.domains[t]].train, self.config.dap.steps

    def _train(self, model, t: int) -> dict:
        dap, acc = self.config.dap, self.accelerator
        dataset, steps = self._training_set(t)
        params = self.method.trainable_parameters(model)
        optimizer = torch.optim.AdamW(_param_groups(params, dap.weight_decay), lr=dap.lr, eps=dap.adam_eps)
        from transformers import get_linear_schedule_with_warmup

        scheduler = get_linear_schedule_with_warmup(optimizer, int(dap.warmup_ratio * steps), steps)
        loader = DataLoader(
            dataset,
            batch_size=dap.per_device_batch_size,
            shuffle=True,
            collate_fn=MlmCollator(self.data.tokenizer, dap.mlm_probability),
            drop_last=len(dataset) >= dap.per_device_batch_size,
        )
        model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)
        accum = max(1, dap.batch_size // (dap.per_device_batch_size * acc.num_processes))
        return self._train_loop(model, optimizer, scheduler, _forever(loader), accum, t, steps)

    def _train_loop(self, model, optimizer, scheduler, batches: Iterator[dict], accum: int, t: int, steps: int) -> dict:
        dap, acc = self.config.dap, self.accelerator
        offset = 0 if self.caps.joint_training else t * dap.steps
        ctx = StepContext(model, t, 0, steps, offset, acc, optimizer)
        sums: dict[str, torch.Tensor] = {}
        log: list[dict] = []
        last_logged = 0
        model.train()
        bar = tqdm(
            range(steps),
            desc=f"{self.method_cls.name} {self.data.domains[t]}",
            disable=not self.show_progress,
            leave=False,
        )
        start = time.perf_counter()
        for step in bar:
            ctx.domain_step, ctx.global_step = step, offset + step
            for micro in range(accum):
                batch = next(batches)
                sync = contextlib.nullcontext() if micro == accum - 1 else acc.no_sync(model)
                with sync:
                    loss, hidden, logits = mlm_forward(model, batch)
                    terms = {"mlm": loss, **self.method.training_loss(batch, StepOutput(loss, hidden, logits), ctx)}
                    acc.backward(sum(terms.values()) / accum)
                for key, value in terms.items():
                    sums[key] = sums.get(key, 0) + value.detach() / accum
            self.method.after_backward(ctx)
            if dap.max_grad_norm is not None:
                acc.clip_grad_norm_(model.parameters(), dap.max_grad_norm)
            optimizer.step()
            scheduler.step()
            self.method.after_optimizer_step(ctx)
            optimizer.zero_grad(set_to_none=True)
            if (step + 1) % dap.log_every == 0 or step + 1 == steps:
                log.append(self._flush_log(sums, step + 1, step + 1 - last_logged, bar))  # the only host sync
                last_logged = step + 1
        seconds = time.perf_counter() - start
        tokens = steps * accum * dap.per_device_batch_size * dap.seq_len * acc.num_processes
        return {
            "steps": steps,
            "train_seconds": round(seconds, 3),
            "tokens": tokens,
            "tokens_per_second": round(tokens / seconds, 1),
            "step_seconds": round(seconds / steps, 4),
            "loss_log": log,
        }

    def _flush_log(self, sums: dict[str, torch.Tensor], step: int, n: int, bar) -> dict:
        means = {k: float(v) / n for k, v in sums.items()}
        sums.clear()
        bad = [k for k, v in means.items() if not math.isfinite(v)]
        if bad:
            raise NonFiniteError(
                f"{self.method_cls.name}: DAP loss term(s) {bad} became non-finite by step {step}",
                "lower the learning rate or check the method's loss terms",
            )
        bar.set_postfix({k: f"{v:.3f}" for k, v in means.items()})
        return {"step": step, **{k: round(v, 5) for k, v in means.items()}}

    def _save_checkpoint(self, t: int, model) -> None:
        unwrapped = self.accelerator.unwrap_model(model)

        def fill(tmp: Path) -> None:
            unwrapped.save_pretrained(tmp)
            self.data.tokenizer.save_pretrained(tmp)
            torch.save(self.method.state_dict(), tmp / "method_state.pt")
            torch.save(_rng_state(), tmp / "rng.pt")

        atomic_directory(self._ckpt(t), fill)

    # -- fine-tuning -------------------------------------------------------------------------------
    def _row_tasks(self, t: int) -> list[int]:
        """Columns k of row t that the matrix mode asks for.

        A per-domain method (the ONE family) scores each end task with its own domain's model, so only
        the diagonal enters any summary; row t's other cells would measure cross-domain transfer of the
        domain-t model, which no metric reads, and are not computed.
        """
        if self.caps.independent_per_domain:
            return [t]
        if self.config.matrix == "full" or t == self.T - 1:
            return list(range(t + 1))
        return [t]

    def _row_key(self, t: int) -> str:
        # The no-DAP baseline fine-tunes the same base model in every row: compute each column once.
        return "base" if not self.caps.pretrains else f"row{t}"

    def _finetune_row(self, t: int, on_pair_done=lambda: None) -> None:
        from transformers import set_seed

        todo = [k for k in self._row_tasks(t) if not self._pair(self._row_key(t), k).exists()]
        if not todo:
            return
        dap_model = None
        for k in todo:
            if dap_model is None:
                dap_model = self._load_checkpoint_model(t)
            task = self.data.tasks[self.data.domains[k]]
            ctx = FinetuneContext(
                checkpoint_dir=self._ckpt(t),
                model=dap_model,
                num_labels=task.num_labels,
                task_domain_index=k if self.caps.needs_domain_id_at_finetune else None,
            )
            seed = self.seed + self.config.finetune.seed_offset
            # Seeded before the classifier exists: its fresh head must not depend on what ran before
            # (a resumed run skips work and would otherwise draw a different head).
            set_seed(seed)
            model = self.method.finetune_model(ctx).to(self.accelerator.device)
            where = f"{self.method_cls.name} seed {self.seed}, checkpoint after domain {t}, end task {task.name}"
            with error_context(where):
                result = self._evaluate_end_task(model, task, seed)
            atomic_write_json(self._pair(self._row_key(t), k), {"row": t, "task": task.name, **result})
            on_pair_done()

    def _evaluate_end_task(self, model, task: EncodedTask, seed: int) -> dict:
        if self.config.finetune.protocol == "linear_probe":
            return probe_and_evaluate(model, task, self.data.tokenizer, self.config.finetune, self.accelerator)
        return finetune_and_evaluate(model, task, self.data.tokenizer, self.config.finetune, seed, self.accelerator)

    def _load_checkpoint_model(self, t: int):
        model, _ = load_masked_lm(str(self._ckpt(t)), require_complete=False)
        model = self.method.setup(model.to(self.accelerator.device))
        restore_checkpoint_weights(model, self._ckpt(t))
        self.method.load_state_dict(load_plain(self._ckpt(t) / "method_state.pt", "method state"))
        return model

    # -- record ------------------------------------------------------------------------------------
    def _record(self, base_losses: dict[str, float], clock: _RunClock) -> dict:
        stages = self._stages()
        domain_stats = [read_json(self._done(t), "domain progress file") for t in stages]
        after_domain: list[dict | None] = [None] * self.T
        for t, stats in zip(stages, domain_stats, strict=True):
            after_domain[t] = stats["mlm_loss"]
        matrices = self._matrices()
        caps = self.caps
        summary = {
            metric: summarize_matrix(np.asarray(m, dtype=float), caps.independent_per_domain, caps.joint_training)
            if _summarizable(m, caps.independent_per_domain, caps.joint_training)
            else None
            for metric, m in matrices.items()
        }
        trained = [s for s in domain_stats if s.get("trained")]
        return {
            "schema": 1,
            "run_id": self.run_id,
            "status": "complete",
            "method": self.method_cls.name,
            "method_label": self.method.label(),
            "method_config": _asdict(self.method.config),
            "capabilities": _asdict(caps),
            "seed": self.seed,
            "profile": self.config.profile,
            "sequence": list(self.data.domains),
            "end_tasks": [self.data.tasks[d].name for d in self.data.domains],
            "config": self.config.to_dict(),
            "config_fingerprint": self.config.fingerprint(self.method_cls.name),
            "matrices": matrices,
            "summary": summary,
            "majority_class": _majority_class([self.data.tasks[d] for d in self.data.domains]),
            "mlm_loss": {
                "columns": list(self.data.heldout_batches),
                "base": base_losses,
                "after_domain": after_domain,
                "batch_checksums": self.data.heldout_checksums(),
                "metrics": loss_metrics(
                    base_losses,
                    after_domain,
                    self.data.domains,
                    independent_per_domain=caps.independent_per_domain,
                    final_row_only=caps.joint_training,
                ),
            },
            "representation": {
                # Drift of the held-out features from the base model's after every stage (None: no model).
                "base_anisotropy": {
                    name: round(anisotropy(values), 5) for name, values in self._base_features().items()
                },
                "after_domain": [
                    stats.get("representation") if stats is not None else None
                    for stats in self._stats_by_stage(domain_stats)
                ],
            },
            "timing": {
                # Summed over invocations: a resumed run counts the kept work of its earlier ones.
                "wall_seconds": round(clock.total(), 1),
                "invocations": clock.invocations,
                "last_invocation_seconds": round(clock.this_invocation(), 1),
                "dap_seconds": round(sum(s.get("train_seconds", 0.0) for s in domain_stats), 2),
                "tokens_per_second": _mean([s["tokens_per_second"] for s in trained]),
                "step_seconds": _mean([s["step_seconds"] for s in trained]),
                "peak_memory_mb": max(s["peak_memory_mb"] for s in domain_stats),
                "memory_kind": "cuda_max_allocated" if torch.cuda.is_available() else "cpu_peak_rss_per_domain",
            },
            "trainable_parameters": max(s["trainable_parameters"] for s in domain_stats),
            "domains": domain_stats,
            "environment": {
                "versions": package_versions(),
                "git_commit": _git_commit(),
                "device": str(self.accelerator.device),
                "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                "num_processes": self.accelerator.num_processes,
                "mixed_precision": self.accelerator.mixed_precision,
                "torch_threads": torch.get_num_threads(),
            },
            "data_checksums": self.data.checksums,
        }

    def _stats_by_stage(self, domain_stats: list[dict]) -> list[dict | None]:
        """Domain progress stats in sequence order, None for stages without a model (joint training)."""
        by_stage: list[dict | None] = [None] * self.T
        for t, stats in zip(self._stages(), domain_stats, strict=True):
            by_stage[t] = stats
        return by_stage

    def _matrices(self) -> dict[str, list[list[float | None]]]:
        out: dict[str, list[list[float | None]]] = {
            m: [[None] * self.T for _ in range(self.T)] for m in ("acc", "macro_f1", "micro_f1")
        }
        for t in self._stages():
            for k in self._row_tasks(t):
                pair = read_json(self._pair(self._row_key(t), k), "fine-tune result")
                for metric in out:
                    out[metric][t][k] = pair[metric]
        return out


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
class _DeviceBatches:
    """Re-iterable view of host batches that moves each one to ``device`` when it is read."""

    def __init__(self, batches: list[dict], device):
        self.batches, self.device = batches, device

    def __iter__(self):
        for batch in self.batches:
            yield {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def __len__(self) -> int:
        return len(self.batches)


class _RunClock:
    """Wall time of one run summed over the invocations that produced it.

    Saved after every finished unit of work (base losses, a domain, a fine-tune), so a run stopped
    and resumed still reports the time of the work its record is made of; the unfinished unit an
    interruption threw away is not counted (it is redone, and counted, by the resuming invocation).
    """

    def __init__(self, path: Path):
        self.path = path
        earlier = read_json(path, "run time ledger") if path.exists() else {"seconds": 0.0, "invocations": 0}
        self.earlier_seconds = float(earlier["seconds"])
        self.invocations = int(earlier["invocations"]) + 1
        self.started = time.time()

    def this_invocation(self) -> float:
        """Seconds since this invocation started."""
        return time.time() - self.started

    def total(self) -> float:
        """Seconds of kept work over all invocations, this one up to now included."""
        return self.earlier_seconds + self.this_invocation()

    def save(self) -> None:
        """Persist the total so far (called after each finished unit of work)."""
        atomic_write_json(self.path, {"seconds": round(self.total(), 3), "invocations": self.invocations})


def _forever(loader) -> Iterator[dict]:
    """Cycle through the loader epoch after epoch (re-shuffled each time, nothing cached)."""
    while True:
        yield from loader


def _param_groups(params: list[tuple[str, torch.nn.Parameter]], weight_decay: float) -> list[dict]:
    no_decay = [p for n, p in params if n.endswith("bias") or "LayerNorm" in n or "layer_norm" in n]
    decay = [p for n, p in params if not (n.endswith("bias") or "LayerNorm" in n or "layer_norm" in n)]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _make_accelerator(config: RunConfig):
    from accelerate import Accelerator

    cpu = config.device == "cpu" or not torch.cuda.is_available()
    precision = "no" if cpu else config.dap.mixed_precision
    return Accelerator(cpu=cpu, mixed_precision=precision)


def _rng_state() -> dict:
    return {
        "python": random.getstate(),
        # numpy's key array as a tensor: a checkpoint holds tensors and plain values only (no pickled objects).
        "numpy": _numpy_state_to_plain(np.random.get_state()),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _restore_rng(path: Path | None, fallback_seed: int) -> None:
    """Continue the RNG stream saved with the previous checkpoint (so resuming changes nothing)."""
    from transformers import set_seed

    if path is None or not path.exists():
        set_seed(fallback_seed)
        return
    state = load_plain(path, "RNG state")
    random.setstate(state["python"])
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy_state_to_plain(state: tuple) -> tuple:
    name, keys, position, has_gauss, cached = state
    return name, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(cached)


def load_plain(path: Path, what: str) -> Any:
    """``torch.load`` restricted to tensors and plain Python values (``weights_only``): a checkpoint from
    someone else cannot run code when a run resumes from it."""
    import pickle

    try:
        return torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError) as exc:
        raise DapbenchError(
            f"{what} file {path} is corrupt or holds objects other than tensors and plain values: refused ({exc})",
            f"delete the run directory {path.parent.parent} and run again (finished domains are recomputed)",
        ) from exc


def _reset_peak_memory() -> None:
    """Start a new peak: CUDA's allocator statistics, or Linux's per-process RSS high-water mark."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)


def _peak_memory_mb() -> float:
    """Peak since the last reset: CUDA max allocated, else VmHWM (else the process-lifetime max RSS)."""
    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return round(int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _majority_class(tasks: list[EncodedTask]) -> dict[str, float]:
    """Mean over end tasks of what always predicting the most frequent test label scores: accuracy p and
    macro-F1 2p/(1+p)/labels (the majority class's F1; every other class scores 0)."""
    shares = [np.bincount(t.test_labels, minlength=t.num_labels).max() / len(t.test_labels) for t in tasks]
    f1 = [2 * p / (1 + p) / t.num_labels for p, t in zip(shares, tasks, strict=True)]
    return {"acc": round(float(np.mean(shares)), 5), "macro_f1": round(float(np.mean(f1)), 5)}


def _summarizable(matrix: list[list[float | None]], independent: bool, final_row_only: bool) -> bool:
    t = len(matrix)
    diagonal = [] if final_row_only else [matrix[k][k] for k in range(t)]
    needed = diagonal + ([] if independent else matrix[-1])
    return all(v is not None for v in needed)


def _mean(values: list[float]) -> float | None:
    return round(float(np.mean(values)), 3) if values else None


def _asdict(obj) -> dict:
    import dataclasses

    return dataclasses.asdict(obj)


def run_id(config: RunConfig, method: str, seed: int) -> str:
    """The id of one method x seed run of ``config``: its record's file name and its work directory's name."""
    return f"{method}-{_sequence_tag(config.sequence)}-seed{seed}-{config.fingerprint(method)}"


def _sequence_tag(sequence: str) -> str:
    return sequence if "," not in sequence else "custom-" + sequence.replace(",", "-")


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
