"""Re-derive a committed run record from scratch and compare every number it reports.

``dapbench reproduce RECORD`` rebuilds the record's configuration, checks that the data on this
machine is the data the record was made from (checksums), runs the method and seed again in a fresh
work directory and lists every reported number that differs by more than its kind's tolerance. Every
numeric field of a record is classified (:data:`KIND_RULES`): a result of some kind (scores, held-out losses and
the metrics derived from them, per-chunk loss sums, representation drift, what a method reports about itself,
training-loss logs, exact counts) or, with a stated reason, not a result (compute cost, settings); a field that
no rule classifies fails ``tests/test_reproduce.py``, so a field added later is never left out of the
comparison. The CI key-number check uses the same comparison.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from benchmark.config import RunConfig, profile_config
from benchmark.errors import DapbenchError
from benchmark.records.schema import CHUNK_SUM_DECIMALS, RunRecord

PATH_FIELDS = ("model", "data_root", "general_heldout", "general_corpus")


@dataclass(frozen=True)
class Tolerance:
    """Largest absolute difference accepted per kind of number."""

    score: float
    """Accuracy / F1 entries and their summaries (fractions in [0, 1])."""
    loss: float
    """Held-out MLM losses, the loss metrics derived from them and logged training losses (nats per token);
    per-chunk loss sums get this per masked token of the chunk."""
    drift: float = 0.002
    """Representation drift: cosine, linear CKA and anisotropy (unitless, in [-1, 1])."""
    report: float = 0.002
    """What a method reports about itself (importance summaries, measured damping; unitless). A histogram of unit
    counts (DAS's importance per bin) is compared as the share of its units up to each bin edge, and its unit count
    exactly: a unit whose importance sits on an edge crosses it under another CPU's float kernels, which moves one
    count from a bin to the next however small the difference of the importance itself."""

    def __post_init__(self):
        for kind in ("score", "loss", "drift", "report"):
            value = getattr(self, kind)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise DapbenchError(
                    f"--{kind}-tolerance {value!r} is not a finite number >= 0",
                    f"pass --{kind}-tolerance as the largest accepted absolute difference, e.g. 0.01",
                )

    def allowed(self, kind: str, size: int = 1) -> float:
        """The tolerance of a number of ``kind`` (``size``: the masked tokens behind a per-chunk sum, the units of a
        histogram whose cumulative count up to a bin edge it is)."""
        if kind == "exact":
            return 0.0
        if kind == "chunk":
            # a sum stored to CHUNK_SUM_DECIMALS: any difference at all may show as one unit of its last place
            return max(self.loss * size, 10.0**-CHUNK_SUM_DECIMALS) if self.loss > 0 else 0.0
        if kind == "histogram":
            return self.report * size
        return getattr(self, kind)


CI_TOLERANCE = Tolerance(score=0.01, loss=0.005)
"""Tolerance of the CI key-number check and the default of ``dapbench reproduce``.

Measured on the 2-core development CPU: four runs of the ``ci`` profile (1, 2 and 1 torch threads, and a
second checkout) gave every number identical (0 difference in 123 numbers; records round losses to 1e-5).
The tolerance is therefore not for run-to-run noise here but for other CPUs' float kernels: about one
changed prediction per end task for scores (1/120 test examples = 0.0083 -> 0.01) and 0.005 nats for
held-out MLM losses (~0.1% of a loss of ~5). It stays tight enough to catch behaviour changes: one extra
DAP update per domain (``dap.steps`` 10 -> 11) moves the MLM losses by up to 0.065.
"""
DEFAULT_TOLERANCE = CI_TOLERANCE


@dataclass(frozen=True)
class Reproduction:
    """The outcome of :func:`reproduce`: the new record, where it was written, and what differs."""

    record: RunRecord
    path: Path
    threads: int | None
    recorded_threads: int | None
    """The CPU thread count the reproduced record was made with (None for accelerator records)."""
    tolerance: object
    compared: int
    mismatches: list
    largest: dict[str, tuple[str, float]]
    kernels: str = ""
    """:func:`kernels_line` of the reproduced record."""

    @property
    def ok(self) -> bool:
        """Whether every number matched within the tolerance."""
        return not self.mismatches

    def lines(self) -> list[str]:
        """What ``dapbench reproduce`` prints of it: where the new record went, the comparison, the verdict."""
        record = self.record
        out = [f"reproduced {record['method_label']} seed {record['seed']} -> {self.path}"]
        if self.threads:
            out.append(f"CPU threads: {self.threads} (the record's: {self.recorded_threads})")
        out += [self.kernels] if self.kernels else []
        out.append(f"{self.compared} numbers compared, {len(self.mismatches)} outside tolerance {self.tolerance}")
        out += [f"  largest {kind} difference: {diff:.5f} ({name})" for kind, (name, diff) in self.largest.items()]
        out += [f"  {mismatch}" for mismatch in self.mismatches]
        differ = f" ({len(self.mismatches)} number(s) differ)" if self.mismatches else ""
        return [*out, f"verdict: {'REPRODUCED' if self.ok else 'NOT REPRODUCED'}{differ}"]


@dataclass(frozen=True)
class StagesReproduction:
    """The outcome of :func:`reproduce_stages`: how the re-run's stages compared with the record's, and the record
    with update sizes added (written to ``path``) where it lacked them and every stage number matched."""

    record: RunRecord
    """The record as it stands after the re-run: with the re-run's update sizes where they were missing and matched,
    else the record as it was."""
    path: Path | None
    """Where the record with added update sizes was written (None: nothing was added or the stages differ)."""
    threads: int | None
    tolerance: Tolerance
    compared: int
    mismatches: list
    largest_loss_difference: float
    kernels: str = ""
    """:func:`kernels_line` of the record."""

    @property
    def ok(self) -> bool:
        """Whether every stage number matched within the tolerance."""
        return not self.mismatches

    def lines(self) -> list[str]:
        """What ``dapbench reproduce --stages-only`` prints of it: the comparison, what was written, the verdict."""
        out = [f"CPU threads: {self.threads}"] if self.threads else []
        out += [self.kernels] if self.kernels else []
        out.append(f"{self.compared} stage numbers compared, {len(self.mismatches)} outside tolerance {self.tolerance}")
        out.append(f"  largest loss difference: {self.largest_loss_difference:.5f}")
        out += [f"  {mismatch}" for mismatch in self.mismatches]
        if self.path:
            out.append(f"update sizes added -> {self.path} (copy it over the record to keep them)")
        elif self.ok:
            out.append("update sizes: the record has them for every trained stage (or trains none); nothing written")
        return [*out, f"verdict: {'STAGES REPRODUCED' if self.ok else 'STAGES NOT REPRODUCED'}"]


NOT_RESULTS = MappingProxyType(
    {
        "timing/*": "compute cost: it depends on the machine and its load, not on the code's numerics",
        "domains/*/train_seconds": "compute cost",
        "domains/*/tokens_per_second": "compute cost",
        "domains/*/step_seconds": "compute cost",
        "domains/*/phase_seconds/*": "compute cost",
        "domains/*/peak_memory_mb": "compute cost (memory)",
        "domains/*/curve/seconds": "compute cost (of the continual evaluation)",
        "environment/*": "facts about the machine that ran it",
        "schema": "the record format",
        "seed": "part of the run id (checked when the record is read)",
        "config/*": "settings, part of the run id (checked when the record is read)",
        "method_config/*": "settings, part of the run id",
        "identity/*": "what the run id hashed (checked when the record is read)",
        "predictions/*": "single test predictions: the scores made of them are compared, within the score tolerance",
        "end_tasks_beside/*/predictions/*": "single test predictions of the protocol beside: its scores are compared",
        "seed_predictions/*": "single test predictions of further fine-tunes: the mean scores are compared",
        "end_tasks_beside/*/seed_predictions/*": "single test predictions of further fine-tunes beside: likewise",
        "test_labels/*": "data (its checksum is part of the run id)",
        "update_sizes_measured/*": "how update sizes measured later were added: the check of that re-run, not a result",
    }
)
"""Numeric fields of a record that are not results, and why reproduce does not compare them (read-only: the
classification of a path is cached, :func:`kind_of`)."""

KIND_RULES = (
    ("summary/*", "score"),
    ("matrices/*", "score"),
    ("end_tasks_beside/*/summary/*", "score"),
    ("end_tasks_beside/*/matrices/*", "score"),
    ("majority_class/*", "score"),
    ("lm_loss/chunks/counts/*", "exact"),
    ("lm_loss/chunks/*", "chunk"),
    ("lm_loss/*", "loss"),
    ("representation/*", "drift"),
    ("domains/*/representation/*", "drift"),
    ("domains/*/lm_loss/*", "loss"),
    ("domains/*/method_report/*importance_histogram/*", "histogram"),
    ("domains/*/method_report/*", "report"),
    ("domains/*/update_sizes/*/parameters", "exact"),
    ("domains/*/update_sizes/*", "report"),
    ("finetune_reports/*", "report"),
    ("domains/*/loss_log/*/step", "exact"),
    ("domains/*/loss_log/*", "loss"),
    ("domains/*/curve/steps/*", "exact"),
    ("domains/*/curve/losses/*", "loss"),
    ("domains/*/steps", "exact"),
    ("domains/*/tokens", "exact"),
    ("domains/*/trainable_parameters", "exact"),
    ("trainable_parameters", "exact"),
)
"""The kind (a :class:`Tolerance` field, or ``exact``/``chunk``/``histogram``) of every reported number, by path
pattern; the first matching pattern decides. A ``histogram`` number is one bin's count of a list of unit counts per
bin (compared cumulatively: :func:`compare_records`)."""


@dataclass(frozen=True)
class Mismatch:
    """One reported number that differs beyond its tolerance (or exists in only one record)."""

    name: str
    expected: float | None
    actual: float | None
    allowed: float

    def __str__(self) -> str:
        def show(value: float | None) -> str:
            return "missing" if value is None else f"{value:.5f}"

        return f"{self.name}: expected {show(self.expected)}, got {show(self.actual)} (tolerance {self.allowed})"


def numeric_fields(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """Every number of a record as ``(path, value)``, the path's parts joined by ``/`` (booleans are not numbers)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numeric_fields(item, f"{path}/{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from numeric_fields(item, f"{path}/{index}")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path, value


def kind_of(path: str) -> str | None:
    """The kind of the number at ``path``; None for a field that is not a result (:data:`NOT_RESULTS`). A path no
    rule covers is a named error: a new field must be classified before it can be compared."""
    kind = _kind_of_path(path)
    if kind is _UNCLASSIFIED:
        raise DapbenchError(
            f"the record field {path} is neither a result kind nor listed as not a result",
            "classify it in benchmark.records.reproduce.KIND_RULES or NOT_RESULTS",
        )
    return kind


_INDEX = re.compile(r"/\d+(?=/|$)")
"""A list index (or numeric key) in a path. No pattern holds a digit, so an index is only ever matched by ``*``
and every index may be read as ``0``: a record's hundred thousand paths come down to a few hundred shapes."""
_UNCLASSIFIED = "unclassified"


@functools.lru_cache(maxsize=1 << 16)  # a comparison asks for each of a record's paths once per record compared
def _kind_of_path(path: str) -> str | None:
    return _kind_of_shape(_INDEX.sub("/0", path))


@functools.lru_cache(maxsize=4096)
def _kind_of_shape(shape: str) -> str | None:
    if any(fnmatch.fnmatchcase(shape, pattern) for pattern in NOT_RESULTS):
        return None
    return next((kind for pattern, kind in KIND_RULES if fnmatch.fnmatchcase(shape, pattern)), _UNCLASSIFIED)


def key_numbers(record: dict) -> dict[str, float]:
    """Every number a record reports about results, by path (see :data:`KIND_RULES`)."""
    # a field that is not a result as a whole (its test predictions, its settings) is not walked at all
    walked = {k: v for k, v in record.items() if not (isinstance(v, dict | list) and f"{k}/*" in NOT_RESULTS)}
    return {path: value for path, value in numeric_fields(walked) if kind_of(path) is not None}


MEASURED_LATER = ("update_sizes", "curve")
"""Per-stage fields that records made before they were measured do not carry (issue #45's update sizes), or that a
run measures only when asked (issue #90's ``curve``, ``dap.eval_every``, not part of the run id): a record without
one is compared on every number it does carry, so a re-run with curves added reproduces it; one that carries it is
compared on it too."""


def compare_records(expected: dict, actual: dict, tolerance: Tolerance) -> list[Mismatch]:
    """The numbers of ``actual`` that differ from ``expected`` by more than their kind's tolerance, and those that
    exist in only one of them (but for a :data:`MEASURED_LATER` field of a stage that ``expected`` predates).

    A histogram's bins are compared as cumulative counts (its units up to and including each bin), within the
    ``report`` tolerance times the expected histogram's units, and its last bin's (every unit) exactly: a unit that
    crosses one edge changes one cumulative count by one, where the bins it left and entered would both differ."""
    want, got = key_numbers(expected), key_numbers(actual)
    got = {name: value for name, value in got.items() if not _predated(expected, name)}
    want, got = _cumulative_histograms(want), _cumulative_histograms(got)
    units = _histogram_units(want)
    mismatches = []
    for name in sorted(set(want) | set(got)):
        allowed = _allowed(tolerance, name, expected, actual, units)
        a, b = want.get(name), got.get(name)
        if a is None or b is None or not _within(a, b, allowed):
            shown = f"{name} (units up to this bin)" if kind_of(name) == "histogram" else name
            mismatches.append(Mismatch(shown, a, b, allowed))
    return mismatches


def _allowed(tolerance: Tolerance, name: str, expected: dict, actual: dict, units: dict[str, tuple[int, int]]) -> float:
    """The tolerance of the number at ``name`` (``units``: each histogram's last bin and unit count)."""
    kind = kind_of(name)
    if kind == "histogram":
        histogram, _, index = name.rpartition("/")
        last, count = units.get(histogram, (-1, 0))
        return tolerance.allowed("exact" if int(index) == last else kind, count)
    return tolerance.allowed(kind, _chunk_tokens(expected, actual, name))


def _bins(numbers: dict[str, float]) -> list[tuple[str, int, str]]:
    """The histogram bins among ``numbers`` as (histogram path, bin index, path), in bin order."""
    names = [name for name in numbers if kind_of(name) == "histogram"]
    return sorted((name.rpartition("/")[0], int(name.rpartition("/")[2]), name) for name in names)


def _cumulative_histograms(numbers: dict[str, float]) -> dict[str, float]:
    """``numbers`` with each histogram bin's count replaced by the count of its histogram's units up to that bin."""
    out, running = dict(numbers), {}
    for histogram, _, name in _bins(numbers):
        running[histogram] = out[name] = running.get(histogram, 0) + numbers[name]
    return out


def _histogram_units(cumulative: dict[str, float]) -> dict[str, tuple[int, int]]:
    """Per histogram of cumulative counts: its last bin's index and its unit count (that bin's cumulative count)."""
    return {histogram: (index, int(cumulative[name])) for histogram, index, name in _bins(cumulative)}


def _predated(expected: dict, path: str) -> bool:
    """Whether ``path`` is a :data:`MEASURED_LATER` field of a stage whose ``expected`` record does not carry it."""
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "domains" or parts[2] not in MEASURED_LATER:
        return False
    stages = expected.get("domains") or []
    index = int(parts[1])
    return index >= len(stages) or parts[2] not in stages[index]


def stage_numbers(domains: list[dict], chunk_counts: dict | None, chunk_rows: list | None) -> dict:
    """The part of a record that its stages alone make (no end task): each stage's entry (held-out losses, drift,
    loss log, method report, update sizes, counts) and the held-out chunk sums after each stage, as record paths."""
    part: dict[str, Any] = {"domains": domains}
    if chunk_counts is not None and chunk_rows is not None:
        part["lm_loss"] = {"chunks": {"counts": chunk_counts, "after_domain": chunk_rows}}
    return part


def compare_stages(
    record: dict, stages: list[dict], tolerance: Tolerance, own_domain_only: bool = False
) -> tuple[int, list[Mismatch]]:
    """How many stage numbers of ``record`` a stages-only re-run's statistics ``stages`` (one per trained or
    evaluated stage, in order, as the runner's progress files hold them) were compared on, and those that differ
    beyond ``tolerance``; stages of other domains, or a different count of them, is a named error. With
    ``own_domain_only`` (a re-run that evaluated each stage on its own domain's set alone), the record is compared on
    what such a re-run makes: :func:`own_domain_view`."""
    recorded = [stage["domain"] for stage in record["domains"]]
    rerun = [stage["domain"] for stage in stages]
    if recorded != rerun:
        raise DapbenchError(
            f"the re-run's stages ({', '.join(rerun) or 'none'}) are not the record's"
            f" ({', '.join(recorded) or 'none'})",
            "re-run the record with the configuration it names (dapbench reproduce without --stages-only shows more)",
        )
    chunks = (record.get("lm_loss") or {}).get("chunks")
    rows = [row for row in (chunks or {}).get("after_domain") or [] if row is not None]
    domains = record["domains"]
    if own_domain_only:  # the rows of the stages run, in order (a pool's one stage holds the last domain's row)
        rows = [{s["domain"]: row[s["domain"]]} for s, row in zip(domains, rows, strict=False)]
        domains = own_domain_view(domains)
    want = stage_numbers(domains, chunks and chunks["counts"], chunks and rows)
    got = stage_numbers(
        _stage_entries(stages),
        chunks and chunks["counts"],
        chunks and [stage["lm_loss_chunks"] for stage in stages],
    )
    compared = set(key_numbers(want)) | {name for name in key_numbers(got) if not _predated(want, name)}
    return len(compared), compare_records(want, got, tolerance)


def own_domain_view(domains: list[dict]) -> list[dict]:
    """A record's stage entries as a re-run that evaluated each stage on its own domain's held-out set alone makes
    them: that set's loss, no drift and no continual-evaluation curve (every other number, the logged training losses
    among them, as they are). Each stage's model is still checked: its own domain's loss and chunk sums are functions
    of all of its weights."""
    return [
        {**{k: v for k, v in stage.items() if k not in OTHER_SETS}, "lm_loss": _own_loss(stage)} for stage in domains
    ]


OTHER_SETS = ("representation", "curve")
"""A stage's fields measured on held-out sets besides its own domain's, which an own-domain re-run does not make."""


def _own_loss(stage: dict) -> dict:
    return {stage["domain"]: stage["lm_loss"][stage["domain"]]} if "lm_loss" in stage else {}


def largest_loss_difference(record: dict, stages: list[dict], own_domain_only: bool = False) -> float:
    """The largest |difference| of a held-out or logged training loss between ``record``'s stages and a re-run's
    (``own_domain_only``: on what :func:`own_domain_view` keeps)."""
    domains = own_domain_view(record["domains"]) if own_domain_only else record["domains"]
    largest = largest_differences({"domains": domains}, {"domains": _stage_entries(stages)})
    return round(largest["loss"][1], 6) if "loss" in largest else 0.0  # records keep losses to 5 decimals


def _stage_entries(stages: list[dict]) -> list[dict]:
    """The runner's stage statistics as a record's ``domains`` entries hold them (chunk sums go to ``lm_loss``)."""
    return [{k: v for k, v in stage.items() if k != "lm_loss_chunks"} for stage in stages]


def with_measured_update_sizes(record: dict, stages: list[dict], facts: dict[str, Any]) -> dict:
    """``record`` with every stage's ``update_sizes`` taken from a matching stages-only re-run's ``stages`` where it
    lacked them, and ``update_sizes_measured`` (``facts``: the re-run's commit, threads, numbers compared, largest
    loss difference) saying so; ``record`` itself unchanged, and returned as it is where no stage lacked them."""
    missing = [
        t for t, stage in enumerate(record["domains"]) if "update_sizes" not in stage and stages[t].get("trained")
    ]
    if not missing:
        return record
    domains = [
        {**stage, "update_sizes": stages[t]["update_sizes"]} if t in missing else stage
        for t, stage in enumerate(record["domains"])
    ]
    return {**record, "domains": domains, "update_sizes_measured": facts}


def _within(a: float, b: float, allowed: float) -> bool:
    """``|a - b| <= allowed``, where the difference of two decimals as stored (6.26022 - 6.26021) may come out a
    few units in the last place above what it is; a zero tolerance stays exact equality."""
    slack = 4 * math.ulp(max(abs(a), abs(b))) if allowed > 0 else 0.0
    return abs(a - b) <= allowed + slack


def _chunk_tokens(expected: dict, actual: dict, path: str) -> int:
    """The masked tokens behind a per-chunk loss sum (``lm_loss/chunks/<row...>/<set>/<chunk>``); 1 otherwise."""
    parts = path.split("/")
    if kind_of(path) != "chunk":
        return 1
    chunks = expected["lm_loss"].get("chunks") or actual["lm_loss"].get("chunks")
    counts = chunks["counts"].get(parts[-2])
    return max(1, counts[int(parts[-1])]) if counts and int(parts[-1]) < len(counts) else 1


def largest_differences(expected: dict, actual: dict) -> dict[str, tuple[str, float]]:
    """Per kind (``score``, ``loss``, ...): the number present in both records that moved most, and by how much.

    What a tolerance is measured from: run the same record twice (or on two machines) and read these.
    """
    want, got = _cumulative_histograms(key_numbers(expected)), _cumulative_histograms(key_numbers(actual))
    largest: dict[str, tuple[str, float]] = {}
    for name in sorted(set(want) & set(got)):
        kind = kind_of(name)
        diff = abs(want[name] - got[name])
        if kind not in largest or diff > largest[kind][1]:
            largest[kind] = (name, diff)
    return largest


def recorded_cpu_threads(record: dict) -> int | None:
    """The CPU thread count a CPU record was made with; None for accelerator or older records.

    Float summation order depends on it, so the same CPU with the same count gives the same numbers.
    Measured (mini NCL record made with 1 thread, re-run with 2): held-out losses within 1e-5, but
    the linear probe flipped about one test prediction in 7 of 21 cells (macro-F1 up to 0.0125 on SciERC).
    """
    environment = record.get("environment", {})
    return environment.get("torch_threads") if environment.get("device") == "cpu" else None


def kernels_line(record: dict, here: str) -> str:
    """Which CPU float kernels made ``record`` and which re-run it (``here``), and what a difference means; empty for
    accelerator records."""
    environment = record.get("environment", {})
    if environment.get("device") != "cpu":
        return ""
    theirs = environment.get("cpu_kernels")
    line = f"CPU float kernels: {here} (the record's: {theirs or 'not recorded'})"
    if theirs != here:
        line += (
            "; other kernels round some sums differently, so numbers that amplify rounding (DAS's reference-code"
            " importance, a unit on a histogram's bin edge) may differ: re-run on a CPU of the record's kind to tell"
            " a behaviour change from rounding"
        )
    return line


@contextlib.contextmanager
def cpu_threads(count: int) -> Iterator[None]:
    """Limit torch and the BLAS/OpenMP pools that scikit-learn uses to ``count`` threads, then restore."""
    import torch
    from threadpoolctl import threadpool_limits

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        with threadpool_limits(limits=count):
            yield
    finally:
        torch.set_num_threads(previous)


def reproduction_config(
    record: dict, output_dir: str | Path, paths: dict[str, str | None], work_dir: str | Path | None = None
) -> RunConfig:
    """The record's configuration for one fresh run of its method and seed under ``output_dir`` (its work files in
    ``work_dir``, by default ``<output_dir>/.dapbench``).

    Paths given in ``paths`` replace the recorded ones; ``shared:`` locations resolve under this machine's
    shared assets folder; a recorded location that does not exist here (a ``local:`` name from another
    machine) falls back to the profile's default, and the input checksums decide later whether that is
    the same input.
    """
    from benchmark.config import PROFILES
    from benchmark.records.schema import resolve_portable

    config = RunConfig.from_dict(record["config"])
    defaults = profile_config(config.profile) if config.profile in PROFILES else None
    replaced = {}
    for name in PATH_FIELDS:
        given, recorded = paths.get(name), resolve_portable(getattr(config, name))
        if given:
            replaced[name] = given
        elif recorded and _missing_here(recorded) and defaults is not None:
            replaced[name] = getattr(defaults, name)
        else:
            replaced[name] = recorded
    out = Path(output_dir)
    return dataclasses.replace(
        config,
        **replaced,
        methods=(record["method"],),
        seeds=(record["seed"],),
        output_dir=str(out),
        work_dir=str(work_dir or out / ".dapbench"),
    )


def _missing_here(location: str) -> bool:
    """Whether a recorded input location names nothing on this machine (hub ids are taken as present)."""
    return location.startswith("local:") or (Path(location).is_absolute() and not Path(location).exists())


def check_data(record: dict, checksums: dict[str, str]) -> None:
    """Fail with the list of differing inputs if this machine's data is not the record's."""
    recorded = record.get("data_checksums", {})
    differing = sorted(k for k in recorded if checksums.get(k) != recorded[k])
    if differing:
        raise DapbenchError(
            f"the data here differs from the data of the record: {', '.join(differing)}",
            "pass the record's inputs: --model, --data-root, --general-heldout, --general-corpus (a record names"
            " inputs outside the shared assets only as local:<name>)",
        )
