"""One stage of a run: the model it starts from (:class:`StageModels`), and training, held-out evaluation and the
checkpoint that marks it finished (:class:`StageRunner`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from benchmark.data.masking import fixed_mlm_batches
from benchmark.engine.environment import peak_memory_mb, reset_peak_memory
from benchmark.engine.evaluation import DeviceBatches, heldout_evaluation, heldout_features, representation_drift
from benchmark.engine.heldout import BaseEvaluation, GeneralProbe
from benchmark.engine.hooks import checked_report, checked_state, hook_call
from benchmark.engine.parts import RunParts
from benchmark.engine.recipe import stage_plan
from benchmark.engine.recompute import activation_checkpointing, recompute_restores
from benchmark.engine.training import DapTrainer
from benchmark.engine.updates import UpdateSizes
from benchmark.engine.workfiles import write_work_file
from benchmark.method import ContinualMethod, DomainContext
from benchmark.modeling import load_lm, mlm_loss, restore_checkpoint_weights


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
        model, _ = load_lm(p.config.model)
        model = p.method.setup(model.to(p.accelerator.device))
        if p.schedule.carries_method_state(t):
            p.method.load_state_dict(p.layout.method_state(t - 1))
        return model

    def unsharded(self, sharded):
        """A model of the stage's architecture (the method's surgery applied) holding the full weights of a model
        trained sharded (every process gathers them)."""
        from benchmark.acceleration.sharding import full_state_dict

        p, weights = self.parts, full_state_dict(sharded)
        devices = [p.accelerator.device] if p.accelerator.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # building a model draws initial weights: leave the RNG as it was
            model, _ = load_lm(p.config.model)
            model = p.method.setup(model.to(p.accelerator.device))
        model.load_state_dict(weights)
        return model.train(sharded.training)  # the mode training left it in (a method's after-domain work reads it)

    def load(self, t: int):
        """The model of checkpoint ``t`` after the method's surgery, with the method state saved with it."""
        p, checkpoint = self.parts, self.parts.layout.verified_checkpoint(t)
        model, _ = load_lm(str(checkpoint), require_complete=False)
        model = p.method.setup(model.to(p.accelerator.device))
        restore_checkpoint_weights(model, checkpoint)
        p.method.load_state_dict(p.layout.method_state(t))
        return model


def _probe_batches(p: RunParts, t: int) -> list:
    """The fixed batches of domain ``t``'s training text a method may probe (importance, Fisher, ...)."""
    dap = p.config.dap
    return fixed_mlm_batches(
        p.data.corpora[p.data.domains[t]].train,
        p.data.tokenizer,
        dap.probe_chunks,
        dap.probe_batch_size,
        dap.mlm_probability,
        seed=1000 + t,
        family=p.data.family,
    )


def _recomputed(model, dap):
    """Around a method's work before and after a domain's updates (DAS's importance: backward passes over probe
    batches of ``dap.probe_batch_size``, at the paper's shape as large as the update's micro-batch, in fp32), the
    blocks are recomputed too under ``dap.activation_checkpointing``. Not with compiled blocks that replay their own
    trace: a pass that changes the model's mode inside its loss (the KL proxy's train-mode views) would be recomputed
    in the mode restored after it, which only a checkpoint outside the compiled call re-enters
    (:func:`benchmark.engine.recompute.recompute_restores`)."""
    enabled = dap.activation_checkpointing and recompute_restores(dap.compile)
    return activation_checkpointing(model, enabled, dap.compile)


def replay_pools(p: RunParts, t: int, general: GeneralProbe) -> list[tuple[float, Any]]:
    """Stage ``t``'s replay pools: ``(share, chunks)`` of the general training text (``general_corpus``, never the
    held-out ``general_heldout``) and of the earlier domains' training chunks (none before the first domain)."""
    replay, out = p.config.replay, []
    if replay.general > 0:
        out.append((replay.general, general.training_chunks()))
    if replay.past > 0:
        out.append((replay.past, p.data.training_set(list(range(t))) if t > 0 else []))
    return out


def _stage_plan(p: RunParts, t: int, general: GeneralProbe):
    """Stage ``t``'s updates, schedule and replay pools."""
    s = p.schedule
    return stage_plan(
        p.config.dap, p.config.schedule, s.updates(t), s.step_offset(t), s.total_updates(t), replay_pools(p, t, general)
    )


class StageRunner:
    """One stage: train (if the method pre-trains), evaluate on held-out text, checkpoint, mark it finished."""

    def __init__(self, parts: RunParts, models: StageModels, base: BaseEvaluation):
        self.parts, self.models, self.base = parts, models, base
        self.general_probe = GeneralProbe(parts)
        self.instrument = None  # set by `dapbench bench` (DapTrainer.instrument)

    def run(self, t: int) -> dict[str, Any]:
        """Run stage ``t`` and write its statistics (whose file marks it finished); return them."""
        p = self.parts
        # Seed first: a method's setup may draw random initial weights (adapters, prompts, task embeddings).
        p.layout.restore_rng(t - 1, p.seed + t)
        model = self.models.for_stage(t)
        reset_peak_memory()
        stats: dict[str, Any] = {"domain": p.data.domains[t], "trained": False, "trainable_parameters": 0}
        dap_seconds = 0.0
        if p.schedule.trains():
            start = time.perf_counter()
            with p.phase(t, "DAP"):
                trained, model = self._train(model, t)
            stats = {**stats, **trained}
            dap_seconds = time.perf_counter() - start
        stats["phase_seconds"] = {"dap": round(dap_seconds, 3)}  # the method's hooks included, not just its updates
        with p.phase(t, "held-out evaluation"):
            evaluate_and_checkpoint(p, self.base, model, t, stats)
        return stats

    def _train(self, model, t: int) -> tuple[dict[str, Any], Any]:
        """Train stage ``t``: its statistics, and the trained model (gathered from its shards if training sharded)."""
        p, dap = self.parts, self.parts.config.dap
        probe = DeviceBatches(_probe_batches(p, t), p.accelerator.device)
        ctx = DomainContext(t, p.data.domains[t], model, probe, p.accelerator, mlm_loss, self.general_probe)
        trainable = sum(q.numel() for _, q in p.method.trainable_parameters(model))
        with _recomputed(model, dap), hook_call(p.method, "before_domain"):
            p.method.before_domain(ctx)
        trainer = DapTrainer(
            p.method,
            dap,
            p.data.tokenizer,
            p.accelerator,
            p.seed,
            p.tracker,
            p.data.family,
            p.show_progress,
            self.instrument,
            _curve_losses(p, model),
        )
        sizes = UpdateSizes(model, p.method)  # after before_domain: what the stage's updates start from
        dataset = p.data.training_set(p.schedule.training_domains(t))
        plan = _stage_plan(p, t, self.general_probe)
        stats = trainer.train(model, dataset, plan, t, f"{p.method.name} {p.data.domains[t]}")
        if dap.sharding == "fsdp":  # one whole model again for the method's after-domain work, evaluation, checkpoint
            model = self.models.unsharded(model)
            ctx = dataclasses.replace(ctx, model=model)
        with _recomputed(ctx.model, dap), hook_call(p.method, "after_domain"):
            p.method.after_domain(ctx)
        with hook_call(p.method, "domain_report"):
            report = checked_report(p.method, p.method.domain_report())
        moved = sizes.measure(ctx.model)  # after after_domain: what is kept
        stats = {**stats, "update_sizes": moved, "method_report": report}
        return {"trained": True, "trainable_parameters": trainable, **stats}, model


OWN_DOMAIN = "own domain"
"""The ``heldout_scope`` of a stage evaluated on its own domain's held-out set alone (``RunParts.own_domain_only``);
a stage evaluated on every set carries no ``heldout_scope``."""


def evaluate_and_checkpoint(p: RunParts, base: BaseEvaluation, model, t: int, stats: dict[str, Any]) -> None:
    """Add stage ``t``'s held-out losses, drift from ``base`` and peak memory to ``stats`` (its own domain's loss
    alone under ``p.own_domain_only``); write the checkpoint and the statistics file that marks the stage finished."""
    device = p.accelerator.device
    view = _heldout_view(p, model)
    own = p.data.domains[t]
    sets = {own: p.data.heldout_batches[own]} if p.own_domain_only else p.data.heldout_batches
    start = time.perf_counter()
    # A stages-only check (own domain alone) measures no base evaluation to take the numbers from.
    as_base = serves_base_model(p) and not p.own_domain_only
    evaluation = base.evaluation(sets) if as_base else heldout_evaluation(model, sets, device, view, p.accelerator)
    stats["lm_loss"], stats["lm_loss_chunks"] = evaluation.losses, evaluation.chunk_sums
    p.tracker.log_values("heldout", evaluation.losses, step=p.schedule.step_offset(t) + p.schedule.updates(t))
    if p.own_domain_only:
        stats["heldout_scope"] = OWN_DOMAIN  # a run must not take this stage for one evaluated on every set
    else:
        base_features = base.features()
        features = (
            base_features if as_base else heldout_features(model, p.data.feature_batches(), device, view, p.accelerator)
        )
        stats["representation"] = representation_drift(base_features, features)
    stats["peak_memory_mb"] = peak_memory_mb()
    phases = stats.setdefault("phase_seconds", {})
    phases["heldout_evaluation"] = round(time.perf_counter() - start, 3)
    if p.accelerator.is_main_process:  # once; the other processes hold the same model and numbers
        start = time.perf_counter()
        with hook_call(p.method, "state_dict"):
            state = checked_state(p.method, p.method.state_dict())
        p.layout.save_checkpoint(t, p.accelerator.unwrap_model(model), p.data.tokenizer, state)
        phases["checkpoint"] = round(time.perf_counter() - start, 3)
        write_work_file(p.layout.domain_done(t), stats)
    p.accelerator.wait_for_everyone()
    p.accelerator.free_memory()


def serves_base_model(p: RunParts) -> bool:
    """Whether every stage's model is the base model exactly as the base evaluation measured it: a method that does
    not pre-train, leaves the loaded model as it is and evaluates it as it is (the no-DAP baseline). Its held-out
    numbers are then the base model's, bit for bit (every committed ``none`` record shows it), and are taken from the
    base evaluation rather than measured again once per stage: most of a ``none`` run's time."""
    method = type(p.method)
    return (
        not p.schedule.trains()
        and method.setup is ContinualMethod.setup
        and method.heldout_view is ContinualMethod.heldout_view
    )


def _curve_losses(p: RunParts, model):
    """What a continual evaluation measures (``dap.eval_every``): every held-out set's loss on its first
    ``dap.eval_chunks`` chunks (one mask draw), through the method's held-out view; None when it is off."""
    dap = p.config.dap
    if not dap.eval_every or p.own_domain_only:
        return None
    sets, view = p.data.feature_batches(dap.eval_chunks), _heldout_view(p, model)
    return lambda current: heldout_evaluation(current, sets, p.accelerator.device, view, p.accelerator).losses


def _heldout_view(p: RunParts, model):
    """Per held-out set name, the method's view of ``model`` for that set's domain (None: general text)."""
    index = {name: k for k, name in enumerate(p.data.domains)}
    return lambda name: p.method.heldout_view(p.accelerator.unwrap_model(model), index.get(name))
