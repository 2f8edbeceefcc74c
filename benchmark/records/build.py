"""Building the record of a finished run from its stages' statistics, its end-task cells and its identity."""

from __future__ import annotations

import dataclasses
from typing import Any

from benchmark.metrics import backbone_flags
from benchmark.records.identity import row_label
from benchmark.records.schema import (
    SCHEMA_VERSION,
    ChunkLosses,
    EndTasksBeside,
    LossBlock,
    RunIdentityBlock,
    RunRecord,
    Timing,
    portable_config,
)


def build_record(
    *,
    run_id: str,
    identity,
    method,
    seed: int,
    config,
    data,
    stage_stats: list[dict[str, Any] | None],
    cells: tuple[dict[str, list[list[float | None]]], dict[str, list[int]], dict, dict[str, list[list[int]]]],
    base_losses: dict[str, float],
    base_chunk_sums: dict[str, list[float]],
    base_anisotropy: dict[str, float],
    timing: Timing,
    environment: dict[str, Any],
    beside: dict[str, tuple] | None = None,
) -> RunRecord:
    """The record of a finished run. ``stage_stats[t]`` is domain t's progress file (None: no model at t); ``cells``
    the matrices A[t][k] per score, each cell's test predictions, the method's reports on the fine-tuned models and the
    predictions of each cell's further fine-tunes (``finetune.seeds``); ``beside``, the same of a second protocol."""
    caps, (matrices, predictions, reports, seed_predictions) = method.capabilities, cells
    after_domain = [None if s is None else s["lm_loss"] for s in stage_stats]
    chunk_rows = [None if s is None else s["lm_loss_chunks"] for s in stage_stats]
    present = [{k: v for k, v in s.items() if k != "lm_loss_chunks"} for s in stage_stats if s is not None]
    tasks, labels = [data.tasks[d].name for d in data.domains], _test_labels(data)
    return {
        "schema": SCHEMA_VERSION,
        "run_id": run_id,
        "status": "complete",
        "method": method.name,
        "method_label": row_label(method.name, method.config.canonical_options(), identity.recipe),
        "method_config": dataclasses.asdict(method.config),
        "capabilities": dataclasses.asdict(caps),
        "comparison_role": None if method.variant() or identity.recipe else method.comparison_role,
        "leaderboard_note": method.leaderboard_note,
        "model_kind": data.family.name,
        "seed": seed,
        "profile": config.profile,
        "sequence": list(data.domains),
        "end_tasks": tasks,
        "config": portable_config(config.to_dict()),
        "config_fingerprint": run_id.rsplit("-", 1)[-1],
        "identity": _identity_block(identity),
        "matrices": matrices,
        "summary": {metric: _summary(m, caps) for metric, m in matrices.items()},
        "predictions": predictions,
        "test_labels": labels,
        "majority_class": _majority_class([data.tasks[d] for d in data.domains]),
        "lm_loss": _lm_loss_block(data, base_losses, after_domain, caps, _chunks(data, base_chunk_sums, chunk_rows)),
        "representation": {
            # Drift of the held-out features from the base model's after every stage (None: no model).
            "base_anisotropy": base_anisotropy,
            "after_domain": [None if s is None else s.get("representation") for s in stage_stats],
        },
        "timing": timing,
        "trainable_parameters": max(s["trainable_parameters"] for s in present),
        "domains": present,
        "environment": environment,
        "data_checksums": data.checksums,
        "backbone_flags": backbone_flags(predictions, labels, tasks, seed_predictions),
        **({"seed_predictions": seed_predictions} if seed_predictions else {}),
        **_optional_blocks(reports, beside, caps, labels, tasks),
    }


def _optional_blocks(
    reports: dict, beside: dict[str, tuple] | None, caps, labels: dict[str, dict[str, Any]], tasks: list[str]
) -> dict[str, Any]:
    """The blocks only some records carry: the method's reports on its fine-tuned models (DoMIX) and the cells of the
    protocol beside the run's own (``finetune.beside``)."""
    out: dict[str, Any] = {}
    if reports:
        out["finetune_reports"] = reports
    if beside:
        out["end_tasks_beside"] = _beside_block(beside, caps, labels, tasks)
    return out


def _beside_block(
    beside: dict[str, tuple], caps, labels: dict[str, dict[str, Any]], tasks: list[str]
) -> dict[str, EndTasksBeside]:
    """Per protocol scored beside the run's own: its matrices, their summaries, each cell's test predictions and the
    cells that do not measure the backbone."""
    return {
        name: {
            "matrices": matrices,
            "summary": {metric: _summary(m, caps) for metric, m in matrices.items()},
            "predictions": predictions,
            "backbone_flags": backbone_flags(predictions, labels, tasks, seeds),
            **({"seed_predictions": seeds} if seeds else {}),
        }
        for name, (matrices, predictions, _, seeds) in beside.items()
    }


def _identity_block(identity) -> RunIdentityBlock:
    """What the run id hashed besides the record's config, sequence and checksums."""
    block: RunIdentityBlock = {
        "results_version": identity.results_version,
        "method_version": identity.method_version,
        "method_options": identity.method_options,
    }
    if identity.processes is not None:
        block["processes"] = identity.processes
    if identity.replay_version is not None:
        block["replay_version"] = identity.replay_version
    return block


def _test_labels(data) -> dict[str, dict[str, Any]]:
    return {
        data.tasks[d].name: {"classes": data.tasks[d].num_labels, "labels": list(data.tasks[d].test_labels)}
        for d in data.domains
    }


def _chunks(data, base: dict[str, list[float]], rows: list[dict[str, list[float]] | None]) -> ChunkLosses:
    return {"counts": data.heldout_chunk_counts(), "base": base, "after_domain": rows}


def summary_of(matrix: list[list[float | None]], capabilities: dict[str, bool]) -> dict[str, float | None] | None:
    """A record's ``summary`` block of one score's matrix, from its capabilities as the record stores them."""
    from types import SimpleNamespace

    caps = SimpleNamespace(
        independent_per_domain=capabilities.get("independent_per_domain", False),
        joint_training=capabilities.get("joint_training", False),
    )
    return _summary(matrix, caps)


def _summary(matrix: list[list[float | None]], caps) -> dict[str, float | None] | None:
    """``summarize_matrix`` of one score's matrix, None when a cell it needs was not computed."""
    import numpy as np

    from benchmark.metrics import summarize_matrix

    if not _summarizable(matrix, caps.independent_per_domain, caps.joint_training):
        return None
    return summarize_matrix(np.asarray(matrix, dtype=float), caps.independent_per_domain, caps.joint_training)


def _lm_loss_block(data, base_losses: dict[str, float], after_domain: list, caps, chunks: ChunkLosses) -> LossBlock:
    from benchmark.metrics import loss_metrics

    metrics = loss_metrics(
        base_losses,
        after_domain,
        data.domains,
        independent_per_domain=caps.independent_per_domain,
        final_row_only=caps.joint_training,
    )
    return {
        "columns": list(data.heldout_batches),
        "base": base_losses,
        "after_domain": after_domain,
        "batch_checksums": data.heldout_checksums(),
        "metrics": metrics,
        "chunks": chunks,
    }


def run_timing(
    clock,
    stats: list[dict[str, Any]],
    memory_kind: str,
    base_seconds: float | None = None,
    end_task_seconds: float | None = None,
) -> Timing:
    """The ``timing`` block from the run clock, the finished stages' statistics and, where known, the seconds of the
    base model's evaluation and of the end-task cells (``phase_seconds`` only where every part is known)."""
    trained = [s for s in stats if s.get("trained")]

    def mean(values: list[float]) -> float | None:
        return round(sum(values) / len(values), 3) if values else None

    phases = phase_seconds(stats, base_seconds, end_task_seconds)
    return {
        # Summed over invocations: a resumed run counts the kept work of its earlier ones.
        "wall_seconds": round(clock.total(), 1),
        "invocations": clock.invocations,
        "last_invocation_seconds": round(clock.this_invocation(), 1),
        "dap_seconds": round(sum(s.get("train_seconds", 0.0) for s in stats), 2),
        "tokens_per_second": mean([s["tokens_per_second"] for s in trained]),
        "step_seconds": mean([s["step_seconds"] for s in trained]),
        "peak_memory_mb": max(s["peak_memory_mb"] for s in stats),
        "memory_kind": memory_kind,
        **({"phase_seconds": phases} if phases else {}),
    }


def phase_seconds(
    stats: list[dict[str, Any]], base_seconds: float | None, end_task_seconds: float | None
) -> dict[str, float] | None:
    """Where a run's time went (seconds summed over its stages): the base model's evaluation, DAP (the method's hooks
    included), held-out evaluation, checkpoints and end tasks; None where a part was made before phases were timed
    (a run resumed across that change), so no total is ever partial."""
    stage_phases = [s.get("phase_seconds") for s in stats]
    if base_seconds is None or end_task_seconds is None or any(not p for p in stage_phases):
        return None
    return {
        "base_evaluation": round(base_seconds, 2),
        **{name: round(sum(p.get(name, 0.0) for p in stage_phases), 2) for name in STAGE_PHASES},
        "end_tasks": round(end_task_seconds, 2),
    }


STAGE_PHASES = ("dap", "heldout_evaluation", "checkpoint")
"""The phases of one stage a stage's statistics time (``phase_seconds``; ``checkpoint`` only on the main process)."""


def _majority_class(tasks: list) -> dict[str, float]:
    """Mean over end tasks of what always predicting the most frequent test label scores: accuracy p and
    macro-F1 2p/(1+p)/labels (the majority class's F1; every other class scores 0)."""
    import numpy as np

    shares = [np.bincount(t.test_labels, minlength=t.num_labels).max() / len(t.test_labels) for t in tasks]
    f1 = [2 * p / (1 + p) / t.num_labels for p, t in zip(shares, tasks, strict=True)]
    return {"acc": round(float(np.mean(shares)), 5), "macro_f1": round(float(np.mean(f1)), 5)}


def _summarizable(matrix: list[list[float | None]], independent: bool, final_row_only: bool) -> bool:
    t = len(matrix)
    diagonal = [] if final_row_only else [matrix[k][k] for k in range(t)]
    needed = diagonal + ([] if independent else matrix[-1])
    return all(v is not None for v in needed)
