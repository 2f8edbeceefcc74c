"""The run record: one JSON file per method x seed run, its declared schema, and how it is built, checked,
loaded and migrated. Every reader (report, plots, reproduce, the CLI, the library API) goes through
:func:`load_record` / :func:`load_records`, so no reader guesses at fields of older records.

Schema history:

- 1: the first records (their ``config`` holds absolute input paths, their ids hash paths; some lack
  ``finetune.protocol``, ``mlm_loss.metrics``, ``representation``).
- 2: input paths are portable (``shared:<path>`` under the shared assets folder, ``local:<name>``
  elsewhere, hub ids as they are); output and work folders are not recorded; ``identity`` names the
  numerics versions the run id hashed (None for records migrated from schema 1, whose ids hashed paths);
  ``data_checksums`` also covers the base model's files and the general training corpus;
  ``finetune.protocol``, ``mlm_loss.metrics``, ``representation`` and ``majority_class`` are always present
  (the last two None in records migrated from schema 1 that lack them).
- 3: the run id hashes the canonical identity (``benchmark.identity.RunIdentity``): ``identity`` also holds the
  method's canonical options (and the process count where it matters), so the id can be re-derived from the record
  itself; ``mlm_loss.chunks`` holds every held-out chunk's summed loss (and masked-token count), from which the
  report bootstraps over the evaluation sample; ``comparison_role``, ``leaderboard_note`` and ``model_kind`` carry
  what the report says about the method, so records render the same whatever plugins are installed;
  ``predictions`` and ``test_labels`` hold every end-task test prediction (the end-task evaluation sample).
  Records of schema 2 migrate with ``chunks``, ``predictions`` and ``test_labels`` None (no evaluation-sample
  error known) and the rest from their fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from benchmark.config import shared_root
from benchmark.errors import DapbenchError
from benchmark.io import read_json, safe_name

SCHEMA_VERSION = 3


class LossMetrics(TypedDict):
    """Loss-based continual metrics in nats (``benchmark.metrics.loss_metrics``; None where undefined)."""

    plasticity: float | None
    """mean_k (base[k] - L[k][k]): how much each domain's held-out loss fell while training on it."""
    forgetting: float | None
    """mean_{k<T-1} (L[T-1][k] - L[k][k]): how much of that was lost by the end of the sequence."""
    max_forgetting: float | None
    """The worst stage's mean forgetting of the domains seen so far."""
    final_gain: float | None
    """mean_k (base[k] - L[T-1][k])."""
    general_rise: float | None
    """L[T-1][general] - base[general]."""


class ChunkLosses(TypedDict):
    """Per held-out set and chunk: the summed loss of the chunk's masked tokens over every mask draw (nats), and
    the masked-token count (the same for every model): the evaluation sample the report bootstraps over."""

    counts: dict[str, list[int]]
    base: dict[str, list[float]]
    after_domain: list[dict[str, list[float]] | None]


class MlmLossBlock(TypedDict):
    """Held-out MLM losses, nats per masked token, on fixed masked batches (identical for every method)."""

    columns: list[str]
    """The held-out sets: every domain of the sequence, and ``general`` when general text is given."""
    base: dict[str, float]
    """The base model's loss per held-out set."""
    after_domain: list[dict[str, float] | None]
    """L[t]: the loss per held-out set after domain t (None where a stage has no model: joint training)."""
    batch_checksums: dict[str, str]
    """Per held-out set, a hash of its masked batches: equal hashes mean bit-identical evaluations."""
    metrics: LossMetrics
    chunks: ChunkLosses | None
    """Per-chunk sums (schema 3); None in migrated records made before they were kept."""


class Timing(TypedDict):
    """Cost of the run on its device."""

    wall_seconds: float
    """Seconds of kept work summed over the invocations that made the record."""
    invocations: int
    last_invocation_seconds: float
    dap_seconds: float
    """Seconds inside DAP training loops."""
    tokens_per_second: float | None
    """DAP training tokens per second (mean over trained domains)."""
    step_seconds: float | None
    """Seconds per optimizer update (mean over trained domains)."""
    peak_memory_mb: float
    memory_kind: str
    """``cuda_max_allocated`` or ``cpu_peak_rss_per_domain``."""


class RunIdentityBlock(TypedDict, total=False):
    """The code and options a run id hashed besides the record's config, sequence and checksums."""

    results_version: int
    method_version: int
    method_options: dict[str, Any]
    """The method's canonical options (default values left out)."""
    processes: int
    """Present only where the method's options make the numbers depend on the process count."""


class RunRecord(TypedDict):
    """One method x seed run (schema 3). Scores are fractions in [0, 1]; losses are nats."""

    schema: int
    run_id: str
    """``<method>-<sequence>-seed<seed>-<hash>`` (``benchmark.identity.run_id``); the file is ``<run_id>.json``."""
    status: str
    """``complete`` (only complete records are written)."""
    method: str
    method_label: str
    """The method name plus its non-default options, e.g. ``das[mask_target=update]``: one leaderboard row."""
    method_config: dict[str, Any]
    capabilities: dict[str, bool]
    comparison_role: str | None
    """``naive_continual`` or ``no_dap`` for the leaderboard's reference methods (their default options only)."""
    leaderboard_note: str
    """What the method says its numbers mean (printed once per method by the leaderboard's reading)."""
    model_kind: str
    """``masked``: a masked LM, its held-out loss the MLM loss at the masked positions."""
    seed: int
    profile: str
    sequence: list[str]
    end_tasks: list[str]
    config: dict[str, Any]
    """The resolved ``RunConfig`` with portable input paths and no output locations."""
    config_fingerprint: str
    identity: RunIdentityBlock | None
    """What the run id hashed besides config, sequence and checksums; None for migrated schema-1 records."""
    matrices: dict[str, list[list[float | None]]]
    """``acc``, ``macro_f1``, ``micro_f1``: A[t][k] after domain t on end task k (None: not computed)."""
    summary: dict[str, dict[str, float | None] | None]
    """Per score: ``final``, ``forgetting``, ``bwt`` (``benchmark.metrics.summarize_matrix``)."""
    predictions: dict[str, list[int]] | None
    """Per computed cell ``t/k``: the predicted label of every test example of end task k (schema 3; None before)."""
    test_labels: dict[str, dict[str, Any]] | None
    """Per end task: its number of ``classes`` and the test examples' ``labels`` in the order of ``predictions``
    (schema 3; None before)."""
    majority_class: dict[str, float] | None
    """What always predicting each task's most frequent test label scores (mean ``acc`` and ``macro_f1`` over
    end tasks); None for the schema-1 records made before it was recorded."""
    mlm_loss: MlmLossBlock
    representation: dict[str, Any] | None
    """``base_anisotropy`` and, per stage, drift from the base model's held-out features (cosine, linear CKA,
    anisotropy); None for schema-1 records made before it was measured."""
    timing: Timing
    trainable_parameters: int
    domains: list[dict[str, Any]]
    """Per stage: training statistics, loss log, the method's ``domain_report`` and held-out results."""
    environment: dict[str, Any]
    data_checksums: dict[str, str]
    """Content checksums of every input (``corpus/<domain>``, ``task/<task>``, ``model``, ...)."""


REQUIRED = tuple(RunRecord.__annotations__)


# ----------------------------------------------------------------------------------------------
# Portable paths
# ----------------------------------------------------------------------------------------------
def portable_path(value: str | None) -> str | None:
    """An input location as a record may carry it: ``shared:<relative>`` under the shared assets,
    ``local:<name>`` for another local path (the machine's own layout is not recorded), a hub id as it is."""
    if value is None or value.startswith(("shared:", "local:")):
        return value
    path = Path(value)
    if not path.exists() and not path.is_absolute():
        return value  # a hub id (``roberta-base``, ``org/name``): portable as it is
    resolved, shared = path.resolve(), shared_root().resolve()
    if resolved == shared or shared in resolved.parents:
        return f"shared:{resolved.relative_to(shared).as_posix()}"
    return f"local:{resolved.name}"


def resolve_portable(value: str | None) -> str | None:
    """The local path of a portable location (``local:`` names cannot be resolved and are returned as they are)."""
    if value is not None and value.startswith("shared:"):
        return str(shared_root() / value.removeprefix("shared:"))
    return value


def portable_config(config: dict[str, Any]) -> dict[str, Any]:
    """A ``RunConfig.to_dict()`` as recorded: portable input paths, no output or work folder."""
    from benchmark.identity import INPUT_PATH_FIELDS

    out = {k: v for k, v in config.items() if k not in ("output_dir", "work_dir")}
    for key in INPUT_PATH_FIELDS:
        out[key] = portable_path(out.get(key))
    return out


# ----------------------------------------------------------------------------------------------
# Check, migrate, load
# ----------------------------------------------------------------------------------------------
def validate_record(record: Any, source: str) -> RunRecord:
    """``record`` as a :class:`RunRecord` if it is one of the current schema, else a named error."""
    if not isinstance(record, dict):
        raise DapbenchError(f"{source} is not a run record (not a JSON object)", "remove it from results/")
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise DapbenchError(
            f"{source} is not a complete schema-{SCHEMA_VERSION} run record: missing {', '.join(missing)}",
            "re-run it with the current dapbench, or remove it from results/",
        )
    safe_name(record["run_id"], "record run id")  # it names files and folders
    safe_name(record["profile"], "record profile")
    if record["status"] != "complete":
        raise DapbenchError(f"{source} has status {record['status']!r}", "only complete records belong in results/")
    return record  # type: ignore[return-value]


def migrate_record(record: dict[str, Any], source: str) -> dict[str, Any]:
    """``record`` upgraded to :data:`SCHEMA_VERSION`; a record of a newer schema is refused."""
    version = record.get("schema")
    if not isinstance(version, int) or version < 1:
        raise DapbenchError(f"{source} has no valid schema version ({version!r})", "remove it from results/")
    if version > SCHEMA_VERSION:
        raise DapbenchError(
            f"{source} is a schema-{version} record; this dapbench reads schema {SCHEMA_VERSION} and older",
            "update dapbench (git pull; pip install -e .) to read it",
        )
    if version == 1:
        record = _from_schema_1(record)
    if record["schema"] == 2:
        record = _from_schema_2(record)
    return record


def _from_schema_1(record: dict[str, Any]) -> dict[str, Any]:
    from benchmark.metrics import record_loss_metrics

    record = dict(record)
    config = portable_config(record["config"])
    # Schema-1 records were made before the linear probe existed whenever they lack the field.
    config["finetune"] = {"protocol": "finetune", **config["finetune"]}
    record["config"] = config
    record["identity"] = None
    record.setdefault("representation", None)
    record.setdefault("majority_class", None)
    record["mlm_loss"] = {**record["mlm_loss"], "metrics": record_loss_metrics(record)}
    record["mlm_loss"].setdefault("batch_checksums", {})
    record["schema"] = 2
    return record


def _from_schema_2(record: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 -> 3: no per-chunk losses (the evaluation sample's error is unknown for it); the method's
    comparison role and note from the installed plugin where the record's label is the method at its defaults."""
    record = {**record, "schema": SCHEMA_VERSION, "model_kind": "masked", "predictions": None, "test_labels": None}
    record["mlm_loss"] = {**record["mlm_loss"], "chunks": None}
    role, note = None, ""
    try:
        from benchmark.registry import default_registry

        cls = default_registry().get(record["method"])
        role = cls.comparison_role if record["method_label"] == record["method"] else None
        note = cls.leaderboard_note
    except DapbenchError:  # a plugin not installed here: the record keeps no role and no note
        pass
    record["comparison_role"], record["leaderboard_note"] = role, note
    return {key: record[key] for key in REQUIRED}


def load_record(path: str | Path) -> RunRecord:
    """Read, migrate and check one run record file: its schema, that its run id is its file name, method and seed
    (and, for schema 3, the hash of its own identity fields), and that every derived number is what its raw
    numbers give (:func:`benchmark.record_checks.check_record`)."""
    from benchmark.record_checks import check_record

    path = Path(path)
    if path.is_symlink():
        raise DapbenchError(
            f"{path} is a symbolic link: records are read only as plain files inside the results folder",
            "replace the link by a copy of the record, or remove it",
        )
    data = read_json(path, "run record")
    if not isinstance(data, dict):
        raise DapbenchError(f"{path} is not a run record (not a JSON object)", "remove it from results/")
    record = validate_record(migrate_record(data, str(path)), str(path))
    check_record(record, path)
    return record


OTHER_REPORTS = ("bench",)
"""Folders directly under ``results/`` that hold JSON reports other than run records (``dapbench bench --save``)."""


def record_paths(results_dir: str | Path) -> list[Path]:
    """The JSON files under ``results_dir`` (recursively) that are run records: all but :data:`OTHER_REPORTS`."""
    root = Path(results_dir)
    return sorted(p for p in root.rglob("*.json") if p.relative_to(root).parts[0] not in OTHER_REPORTS)


def load_records(results_dir: str | Path) -> list[RunRecord]:
    """Every run record under ``results_dir`` (recursively), migrated; a corrupt or foreign file is an error."""
    root = Path(results_dir)
    if not root.is_dir():
        raise DapbenchError(f"no results directory at {root}", "run `dapbench run` first or pass --output-dir")
    return [load_record(path) for path in record_paths(root)]


# ----------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------
def build_record(
    *,
    run_id: str,
    identity,
    method,
    seed: int,
    config,
    data,
    stage_stats: list[dict[str, Any] | None],
    cells: tuple[dict[str, list[list[float | None]]], dict[str, list[int]]],
    base_losses: dict[str, float],
    base_chunk_sums: dict[str, list[float]],
    base_anisotropy: dict[str, float],
    timing: Timing,
    environment: dict[str, Any],
) -> RunRecord:
    """The record of a finished run. ``stage_stats[t]`` is domain t's progress file (None: no model at t);
    ``cells`` the matrices A[t][k] per score and each cell's test predictions."""
    import dataclasses

    caps, (matrices, predictions) = method.capabilities, cells
    after_domain = [None if s is None else s["mlm_loss"] for s in stage_stats]
    chunk_rows = [None if s is None else s["mlm_loss_chunks"] for s in stage_stats]
    present = [{k: v for k, v in s.items() if k != "mlm_loss_chunks"} for s in stage_stats if s is not None]
    return {
        "schema": SCHEMA_VERSION,
        "run_id": run_id,
        "status": "complete",
        "method": method.name,
        "method_label": method.label(),
        "method_config": dataclasses.asdict(method.config),
        "capabilities": dataclasses.asdict(caps),
        "comparison_role": None if method.variant() else method.comparison_role,
        "leaderboard_note": method.leaderboard_note,
        "model_kind": "masked",
        "seed": seed,
        "profile": config.profile,
        "sequence": list(data.domains),
        "end_tasks": [data.tasks[d].name for d in data.domains],
        "config": portable_config(config.to_dict()),
        "config_fingerprint": run_id.rsplit("-", 1)[-1],
        "identity": _identity_block(identity),
        "matrices": matrices,
        "summary": {metric: _summary(m, caps) for metric, m in matrices.items()},
        "predictions": predictions,
        "test_labels": _test_labels(data),
        "majority_class": _majority_class([data.tasks[d] for d in data.domains]),
        "mlm_loss": _mlm_loss_block(data, base_losses, after_domain, caps, _chunks(data, base_chunk_sums, chunk_rows)),
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


def _mlm_loss_block(data, base_losses: dict[str, float], after_domain: list, caps, chunks: ChunkLosses) -> MlmLossBlock:
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


def run_timing(clock, stats: list[dict[str, Any]], memory_kind: str) -> Timing:
    """The ``timing`` block from the run clock and the finished stages' statistics."""
    trained = [s for s in stats if s.get("trained")]

    def mean(values: list[float]) -> float | None:
        return round(sum(values) / len(values), 3) if values else None

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
    }


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
