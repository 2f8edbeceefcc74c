"""The run record: one JSON file per method x seed run, its declared schema, and how it is built, checked,
loaded and migrated. Every reader (report, plots, reproduce, the CLI, the library API) goes through
:func:`load_record` / :func:`load_records`, so no reader guesses at fields of older records.

Schema history:

- 1: the first records (their ``config`` holds absolute input paths, their ids hash paths; some lack
  ``finetune.protocol``, ``lm_loss.metrics``, ``representation``).
- 2: input paths are portable (``shared:<path>`` under the shared assets folder, ``local:<name>``
  elsewhere, hub ids as they are); output and work folders are not recorded; ``identity`` names the
  numerics versions the run id hashed (None for records migrated from schema 1, whose ids hashed paths;
  ``{"migrated_from_schema": 1}`` since schema 5, whose records always carry an identity);
  ``data_checksums`` also covers the base model's files and the general training corpus;
  ``finetune.protocol``, ``lm_loss.metrics``, ``representation`` and ``majority_class`` are always present
  (the last two None in records migrated from schema 1 that lack them).
- 3: the run id hashes the canonical identity (``benchmark.records.identity.RunIdentity``): ``identity`` also holds the
  method's canonical options (and the process count where it matters), so the id can be re-derived from the record
  itself; ``lm_loss.chunks`` holds every held-out chunk's summed loss (and masked-token count), from which the
  report bootstraps over the evaluation sample; ``comparison_role``, ``leaderboard_note`` and ``model_kind`` carry
  what the report says about the method, so records render the same whatever plugins are installed;
  ``predictions`` and ``test_labels`` hold every end-task test prediction (the end-task evaluation sample).
  Records of schema 2 migrate with ``chunks``, ``predictions`` and ``test_labels`` None (no evaluation-sample
  error known) and the rest from their fields.
- 4: kind-neutral names: the held-out losses are ``lm_loss`` (the record and each domain's entry; ``mlm_loss`` before,
  whatever the model family). Older records migrate by the rename alone; the numbers are the same.
- 5: lean files: the record file is the summary, and its evaluation samples (``lm_loss.chunks``, ``predictions``,
  ``test_labels``, each beside protocol's ``predictions``) live in Parquet sidecars beside it, which its ``samples``
  block names with their SHA-256 (:mod:`benchmark.records.samples`); what a group shares (chunk counts, base chunk
  sums, test labels) is one file for all its records. Read back, a record is whole as in schema 4; older records
  migrate unchanged (``dapbench migrate`` writes them lean).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from typing_extensions import NotRequired, TypedDict

from benchmark.config import shared_root

SCHEMA_VERSION = 5
CHUNK_SUM_DECIMALS = 4
"""Decimals a record keeps of each held-out chunk's loss sum (``lm_loss.chunks``)."""


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


class LossBlock(TypedDict):
    """Held-out language-model losses in nats per predicted token (the masked tokens of a masked LM, every next token
    of a causal LM: the model family's objective), on fixed batches identical for every method."""

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
    invocations: NotRequired[int]
    """Invocations that made the record (absent in schema-1 records, made before runs resumed)."""
    last_invocation_seconds: NotRequired[float]
    """Seconds of the last invocation (absent in schema-1 records)."""
    dap_seconds: float
    """Seconds inside DAP training loops."""
    tokens_per_second: float | None
    """DAP training tokens per second (mean over trained domains)."""
    step_seconds: float | None
    """Seconds per optimizer update (mean over trained domains)."""
    peak_memory_mb: float
    memory_kind: str
    """``cuda_max_allocated`` or ``cpu_peak_rss_per_domain``."""
    phase_seconds: NotRequired[dict[str, float]]
    """Where the time went, in seconds summed over stages: ``base_evaluation``, ``dap`` (the method's hooks
    included), ``heldout_evaluation`` (losses and drift features), ``checkpoint`` and ``end_tasks``; what is left of
    ``wall_seconds`` is loading data and models. Absent in records made before phases were timed."""


class UpdateSizesMeasured(TypedDict):
    """How the update sizes of a record made before they were measured (issue #45) were added later: by a stages-only
    re-run of its method and seed (``dapbench reproduce --stages-only``) whose every stage number matched the
    record's within tolerance, so the sizes are those of the very training the record reports."""

    git_commit: str | None
    """The commit that re-ran the stages."""
    torch_threads: int | None
    """The CPU threads of the re-run (the record's own, so the float summation order is the same)."""
    cpu_kernels: NotRequired[str]
    """The instruction set of the re-run's CPU float kernels (``environment.cpu_kernels``); absent in the
    earliest re-runs."""
    compared: int
    """Stage numbers compared: held-out losses and chunk sums, drift, loss logs, method reports, counts."""
    largest_loss_difference: float
    """The largest |difference| of a held-out or logged loss between the re-run and the record (nats)."""
    heldout_scope: NotRequired[str]
    """``own domain`` where the re-run evaluated each stage on its own domain's held-out set alone (``reproduce
    --stages-only --own-domain``): those losses and chunk sums, the logged training losses and counts were compared;
    absent where every stage number was."""


class EndTasksBeside(TypedDict):
    """The cells of one protocol scored beside the run's own (``finetune.beside``), as the record keeps the run's own:
    ``matrices`` per score, their ``summary`` and each cell's test ``predictions``."""

    matrices: dict[str, list[list[float | None]]]
    summary: dict[str, dict[str, float | None] | None]
    predictions: dict[str, list[int]]
    backbone_flags: NotRequired[dict[str, str]]
    """As the record's own ``backbone_flags``, for this protocol's cells."""
    seed_predictions: NotRequired[dict[str, list[list[int]]]]
    """As the record's own ``seed_predictions``, for this protocol's cells."""


class RunIdentityBlock(TypedDict, total=False):
    """The code and options a run id hashed besides the record's config, sequence and checksums."""

    results_version: int
    method_version: int
    method_options: dict[str, Any]
    """The method's canonical options (default values left out)."""
    processes: int
    """Present only where the method's options make the numbers depend on the process count."""
    replay_version: int
    """Present only for a run with replay: how replayed chunks are counted (``identity.REPLAY_VERSION``)."""
    migrated_from_schema: int
    """Present, alone, only in a record migrated from schema 1, whose run id hashed machine paths (nothing in the record
    re-derives it)."""


class RunRecord(TypedDict):
    """One method x seed run (schema 3). Scores are fractions in [0, 1]; losses are nats."""

    schema: int
    run_id: str
    """``<method>-<sequence>-seed<seed>-<hash>`` (``benchmark.records.identity.RunIdentity.run_id``); the file is
    ``<run_id>.json``."""
    status: str
    """``complete`` (only complete records are written)."""
    method: str
    method_label: str
    """The method name plus its non-default options, e.g. ``das[mask_target=update]``: one leaderboard row."""
    method_config: dict[str, Any]
    capabilities: dict[str, bool]
    comparison_role: str | None
    """``naive_continual``, ``proposed`` or ``no_dap`` for the leaderboard's reference methods (their default options
    only)."""
    leaderboard_note: str
    """What the method says its numbers mean (printed once per method by the leaderboard's reading)."""
    model_kind: str
    """The base model's family (:mod:`benchmark.families`): ``masked``, a masked LM, its held-out loss the MLM loss at
    the masked positions; ``causal``, a causal LM, its held-out loss the next-token loss at every position (nats per
    token); or a registered plugin family's name."""
    seed: int
    profile: str
    sequence: list[str]
    end_tasks: list[str]
    config: dict[str, Any]
    """The resolved ``RunConfig`` with portable input paths and no output locations."""
    config_fingerprint: str
    identity: RunIdentityBlock
    """What the run id hashed besides config, sequence and checksums; ``{"migrated_from_schema": 1}`` for a migrated
    schema-1 record."""
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
    lm_loss: LossBlock
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
    finetune_reports: NotRequired[dict[str, dict[str, Any]]]
    """Per cell ``t/k``: what the method reports about its fine-tuned model (DoMIX's learned bridge); present only
    for methods that report something."""
    end_tasks_beside: NotRequired[dict[str, EndTasksBeside]]
    """Per protocol scored beside ``config.finetune.protocol`` (``finetune.beside``): the same cells under it; present
    only in runs that ask for one."""
    backbone_flags: NotRequired[dict[str, str]]
    """Per cell ``t/k`` of the run's own protocol that does not measure the backbone, why
    (:func:`benchmark.metrics.backbone_problem`: its classifier predicts fewer than half of the test set's classes, or
    scores at or below the majority class); the report states no verdict from such a cell. Absent in records made
    before it was kept: ``dapbench migrate`` writes it, and until then the report derives it from their predictions."""
    seed_predictions: NotRequired[dict[str, list[list[int]]]]
    """Per cell ``t/k`` fine-tuned more than once (``finetune.seeds``): the test predictions of each fine-tune after
    the first (whose are ``predictions``); the cell's scores are the means over all of them. Present only in records
    of runs that fine-tune several times."""
    update_sizes_measured: NotRequired[UpdateSizesMeasured]
    """Present only in a record made before per-stage ``update_sizes`` were measured, whose sizes were added later
    by a stages-only re-run that matched it."""


OPTIONAL = ("finetune_reports", "end_tasks_beside", "backbone_flags", "seed_predictions", "update_sizes_measured")
"""Fields only some records carry (declared ``NotRequired``; the annotations are strings here, so named again)."""

REQUIRED = tuple(name for name in RunRecord.__annotations__ if name not in OPTIONAL)


@functools.cache
def _adapter(declared: type) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(declared)


def type_problems(declared: type, value: Any) -> list[str]:
    """Where ``value`` departs from the ``TypedDict`` ``declared`` at any depth (a string where a matrix holds numbers,
    a list where a field is a mapping, a missing field), checked strictly (no coercion, a bool is no number): one line
    per problem, with its location; empty where it conforms."""
    from pydantic import ValidationError

    try:
        _adapter(declared).validate_python(value, strict=True)
    except ValidationError as exc:
        return [
            f"{'.'.join(map(str, error['loc'])) or 'the value'}: {error['msg'].lower()}"
            for error in exc.errors(include_url=False, include_input=False)
        ]
    return []


def in_schema_order(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its fields in the order :class:`RunRecord` declares them, any others after: one order for a
    record read from any schema, so that whatever renders a record whole renders it alike."""
    order = [key for key in RunRecord.__annotations__ if key in record]
    return {**{key: record[key] for key in order}, **{k: v for k, v in record.items() if k not in order}}


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
    from benchmark.records.identity import INPUT_PATH_FIELDS

    out = {k: v for k, v in config.items() if k not in ("output_dir", "work_dir")}
    for key in INPUT_PATH_FIELDS:
        out[key] = portable_path(out.get(key))
    return out
