"""Uncertainty of a group's numbers: the seeds, and the evaluation sample they were measured on.

A method's number is a mean over seeds, each measured on a fixed held-out sample (chunks of text, masked once per
draw) and a fixed end-task test set. Its uncertainty has two parts: the spread over seeds, and the evaluation
sample's own error, which the seed spread does not contain (every seed is measured on the same sample). The second
comes from a bootstrap over the evaluation sample: held-out chunks resampled with replacement (one resample of each
held-out set, shared by every record of the group, so differences between methods stay paired) for the loss
metrics, and end-task test examples for the end-task scores. Per method and column the leaderboard shows the mean
and the combined standard error sqrt(s^2 / n + SE_eval^2); a difference from a reference is resolved when the one
comparison of :mod:`benchmark.report.comparison` rejects no difference: a paired t-test whose standard error holds
both parts (Benjamini-Hochberg over the methods tested, q < 0.05).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pandas as pd

from benchmark.metrics import loss_metric_arrays, mean_regret, served_losses
from benchmark.report.comparison import ALPHA, Test, benjamini_hochberg, paired_test
from benchmark.report.frame import format_number, oracle_partners

T = TypeVar("T")

REPLICATES = 1000
"""Bootstrap resamples of the evaluation sample (its standard error from 1000 resamples)."""


def named_generator(*names: str) -> np.random.Generator:
    """A random generator seeded by ``names`` alone (a ladder, a rung, a metric, a row): a reading drawn from it
    depends on nothing else the report holds, so adding a record to one row or rung leaves every other row's
    resamples, and every reading that does not include that record, as they were."""
    return np.random.default_rng(int(hashlib.sha256("\x1f".join(names).encode()).hexdigest()[:12], 16))


class EvaluationSample:
    """Bootstrap replicates of every record's loss metrics and end-task summaries over the group's shared evaluation
    sample (held-out chunks, test examples); records without per-chunk losses or predictions (schema < 3) have
    none."""

    def __init__(self, records: list[dict], key: str, replicates: int = REPLICATES, chunk_limit: int | None = None):
        self.rng = named_generator(key)
        self.replicates, self.chunk_limit = replicates, chunk_limit
        self._chunk_weights: dict[str, np.ndarray] = {}
        self._example_weights: dict[str, np.ndarray] = {}
        self._served: dict[str, np.ndarray] = {}
        self.values = {r["run_id"]: {**self._loss_replicates(r), **self._score_replicates(r)} for r in records}
        for run_id, oracle in oracle_partners(records, lambda record: "").items():
            if run_id in self._served and oracle["run_id"] in self._served:
                self.values[run_id]["regret"] = mean_regret(self._served[run_id], self._served[oracle["run_id"]])

    def of(self, run_id: str, metric: str) -> np.ndarray | None:
        """The replicates (length B) of ``metric`` (a loss metric name, or ``acc/final``-style summary) of a record."""
        return self.values.get(run_id, {}).get(metric)

    # -- held-out losses -------------------------------------------------------------------------
    def _weights(self, cache: dict[str, np.ndarray], name: str, size: int) -> np.ndarray:
        if name not in cache:
            picks = self.rng.integers(0, size, (self.replicates, size))
            cache[name] = np.stack([np.bincount(row, minlength=size) for row in picks]).astype(float)
        return cache[name]

    def _loss_replicates(self, record: dict) -> dict[str, np.ndarray]:
        losses = record["lm_loss"]
        chunks = losses.get("chunks")
        if not chunks:
            return {}
        columns = [*record["sequence"], "general"]
        base = np.full((self.replicates, len(columns)), np.nan)
        after = np.full((self.replicates, len(record["sequence"]), len(columns)), np.nan)
        for j, column in enumerate(columns):
            if column not in chunks["counts"]:
                continue
            counts = np.asarray(chunks["counts"][column], dtype=float)[: self.chunk_limit]
            weights = self._weights(self._chunk_weights, column, len(counts))
            tokens = weights @ counts
            base[:, j] = weights @ np.asarray(chunks["base"][column][: self.chunk_limit]) / tokens
            for t, row in enumerate(chunks["after_domain"]):
                if row is not None:
                    after[:, t, j] = weights @ np.asarray(row[column][: self.chunk_limit]) / tokens
        caps = record["capabilities"]
        domains = after[:, :, : len(record["sequence"])]
        self._served[record["run_id"]] = served_losses(domains, caps.get("independent_per_domain", False))
        arrays = loss_metric_arrays(
            base,
            after,
            independent_per_domain=caps.get("independent_per_domain", False),
            final_row_only=caps.get("joint_training", False),
            has_general="general" in chunks["counts"],
        )
        return {name: value for name, value in arrays.items() if value is not None}

    # -- end-task scores -------------------------------------------------------------------------
    def _score_replicates(self, record: dict) -> dict[str, np.ndarray]:
        predictions, labels = record.get("predictions"), record.get("test_labels")
        if not predictions or not labels:
            return {}
        tasks = record["end_tasks"]
        weights = {task: self._weights(self._example_weights, task, len(labels[task]["labels"])) for task in tasks}
        return score_replicates(record, weights, self.replicates)


def score_replicates(record: dict, weights: dict[str, np.ndarray], replicates: int) -> dict[str, np.ndarray]:
    """A record's end-task summaries (``acc/final``, ``macro_f1/forgetting``, ...) under each row of every task's
    example ``weights``: the scores of every computed cell recomputed from its test predictions, summarised."""
    size = len(record["sequence"])
    cells = {score: np.full((replicates, size, size), np.nan) for score in ("acc", "macro_f1")}
    later = record.get("seed_predictions") or {}
    for cell, predicted in record["predictions"].items():
        t, k = map(int, cell.split("/"))
        task = record["test_labels"][record["end_tasks"][k]]
        labels, sample = np.asarray(task["labels"]), weights[record["end_tasks"][k]]
        # a cell fine-tuned several times scores the mean of its fine-tunes on every resample of its test examples
        each = [
            weighted_scores(labels, np.asarray(p), task["classes"], sample) for p in [predicted, *later.get(cell, [])]
        ]
        cells["acc"][:, t, k] = np.mean([acc for acc, _ in each], axis=0)
        cells["macro_f1"][:, t, k] = np.mean([f1 for _, f1 in each], axis=0)
    out = {}
    for score, matrix in cells.items():
        out.update({f"{score}/{key}": value for key, value in _summaries(matrix, record["capabilities"]).items()})
    return out


def weighted_scores(labels: np.ndarray, predicted: np.ndarray, classes: int, weights: np.ndarray):
    """Accuracy and macro-F1 (over every class of the task, absent classes scoring 0, as
    :func:`benchmark.metrics.macro_f1`) under each row of example ``weights`` (B x N): one bootstrap replicate each."""
    truth, guess = np.eye(classes)[labels], np.eye(classes)[predicted]
    correct = weights @ (labels == predicted).astype(float)
    accuracy = correct / weights.sum(axis=1)
    hits = weights @ (truth * guess)
    precision_den, recall_den = weights @ guess, weights @ truth
    denominator = precision_den + recall_den
    f1 = np.divide(2 * hits, denominator, out=np.zeros_like(hits), where=denominator > 0)
    return accuracy, f1.mean(axis=1)


def _summaries(matrix: np.ndarray, caps: dict) -> dict[str, np.ndarray]:
    """Final average, forgetting and backward transfer of B replicated matrices (as ``summarize_matrix``)."""
    size = matrix.shape[1]
    diagonal = matrix[:, np.arange(size), np.arange(size)]
    per_domain, joint = caps.get("independent_per_domain", False), caps.get("joint_training", False)
    out = {"final": (diagonal if per_domain else matrix[:, -1, :]).mean(axis=1)}
    if size >= 2 and not per_domain and not joint:
        out["forgetting"] = (diagonal[:, :-1] - matrix[:, -1, :-1]).mean(axis=1)
        out["bwt"] = -out["forgetting"]
    return {k: v for k, v in out.items() if not np.isnan(v).any()}


# ----------------------------------------------------------------------------------------------
# Intervals and paired comparisons
# ----------------------------------------------------------------------------------------------
def combined_se(values: pd.Series, replicates: list[np.ndarray | None]) -> float | None:
    """sqrt(s^2 / n + SE_eval^2) of a mean over seeds: ``values`` one per seed, ``replicates`` each seed's bootstrap
    replicates (None where unknown: then only the seed part, and None for a single seed)."""
    n = len(values)
    seed_var = float(values.var(ddof=1)) / n if n > 1 else 0.0
    if any(r is None for r in replicates):
        return math.sqrt(seed_var) if n > 1 else None
    eval_var = float(np.var(np.mean(replicates, axis=0), ddof=1))
    return math.sqrt(seed_var + eval_var)


@dataclass
class Comparison:
    """A method's per-seed difference from a reference on one column (seeds both ran), decided by the one
    comparison of :mod:`benchmark.report.comparison`: a paired t-test whose standard error holds the seeds' spread
    and the evaluation sample's own error, Benjamini-Hochberg over the family (``q``)."""

    label: str
    n: int
    mean: float
    std: float
    test: Test
    se_eval: float | None = None
    q: float = 1.0

    @property
    def p(self) -> float:
        """The test's two-sided p-value."""
        return self.test.p

    def resolved(self, alpha: float = ALPHA) -> bool:
        """Whether the difference is resolved: the test rejects no difference after the family's correction."""
        return self.mean != 0 and self.q < alpha

    def resolvable(self) -> float:
        """The smallest |difference| the test resolves with 80% power (what a tie can rule out)."""
        return self.test.resolvable()


def compare(
    part: pd.DataFrame, reference: str, column: str, sample: EvaluationSample | None = None, metric: str | None = None
) -> list[Comparison]:
    """Every method's comparison with ``reference`` on ``column`` (methods sharing at least two seeds with it), with
    Benjamini-Hochberg q-values over the methods."""
    wide = part.pivot_table(index="pair", columns="method", values=column)  # (order, seed) pairs
    runs = part.set_index(["method", "pair"])["run_id"]
    out = []
    for method in (m for m in wide.columns if m != reference) if reference in wide else []:
        found = paired_difference(wide, runs, method, reference, sample, metric)
        if found is not None:
            diff, se_eval, test = found
            out.append(Comparison(method, len(diff), float(diff.mean()), float(diff.std(ddof=1)), test, se_eval))
    adjust_for_multiplicity(out)
    return sorted(out, key=lambda c: -c.mean)


def paired_difference(wide: pd.DataFrame, runs: pd.Series, method: str, reference: str, sample=None, metric=None):
    """``method`` minus ``reference`` over the (order, seed) pairs both ran (``wide``: one column per method,
    ``runs``: run ids by method and pair): the per-pair differences, the evaluation sample's standard error of
    their mean (None without ``sample`` and ``metric``) and the one comparison's test; None below two pairs."""
    pairs = wide[[method, reference]].dropna()
    if len(pairs) < 2:
        return None
    diff = (pairs[method] - pairs[reference]).to_numpy()
    se_eval = None
    if sample is not None and metric is not None:
        mine, theirs = [runs[(method, s)] for s in pairs.index], [runs[(reference, s)] for s in pairs.index]
        se_eval = evaluation_se(sample, metric, mine, theirs)
    return diff, se_eval, paired_test(diff, se_eval)


def adjust_for_multiplicity(family: list[Comparison]) -> None:
    """Set the Benjamini-Hochberg q-values of ``family`` (the comparisons read together, e.g. every method against
    one reference on one metric)."""
    for comparison, q in zip(family, benjamini_hochberg([c.p for c in family]), strict=True):
        comparison.q = q


def evaluation_se(sample: EvaluationSample, metric: str, mine: list[str], theirs: list[str]) -> float | None:
    """The evaluation sample's standard error of the mean paired difference ``mine`` - ``theirs`` (the spread of
    that difference over the group's shared bootstrap resamples); None where a record has no replicates."""
    a = [sample.of(run, metric) for run in mine]
    b = [sample.of(run, metric) for run in theirs]
    if any(x is None for x in a + b):
        return None
    return float(np.std(np.mean(a, axis=0) - np.mean(b, axis=0), ddof=1))


class GroupStatistics:
    """Everything the leaderboard says about one group's numbers: its rows, its evaluation sample's replicates, its
    reference methods, and (computed once each) the paired comparisons with them."""

    def __init__(self, part: pd.DataFrame, records: list[dict], key: str, references: dict[str, str]):
        self.part, self.records, self.references = part, records, references
        self.sample = EvaluationSample(records, key)
        self._cache: dict[tuple[str, str], list[Comparison]] = {}
        self._derived: dict[str, object] = {}

    def comparisons(self, reference: str, column) -> list[Comparison]:
        """Every method against ``reference`` on ``column`` (a :class:`~benchmark.report.frame.Column`)."""
        key = (reference, column.title)
        if key not in self._cache:
            self._cache[key] = compare(self.part, reference, column.title, self.sample, column.metric)
        return self._cache[key]

    def derived(self, name: str, compute: Callable[[], T]) -> T:
        """``compute()``, called once per group under ``name``: a reading that several outputs show (the leaderboard
        and the site) is derived from the statistics once."""
        if name not in self._derived:
            self._derived[name] = compute()
        return self._derived[name]  # type: ignore[return-value]

    def interval(self, label: str, column) -> tuple[float, float | None, int] | None:
        """Mean, combined standard error (None for one seed without a known evaluation error) and n of ``label`` on
        ``column``; None where it has no value."""
        rows = self.part[self.part["method"] == label].dropna(subset=[column.title])
        if rows.empty:
            return None
        scale = 100.0 if column.kind == "pct" else 1.0
        replicates = [self.sample.of(run, column.metric) if column.metric else None for run in rows["run_id"]]
        se = combined_se(rows[column.title] * scale, [None if r is None else r * scale for r in replicates])
        return float(rows[column.title].mean() * scale), se, len(rows)

    def cell(self, label: str, column) -> str:
        """``label``'s value on ``column`` as the tables show it: mean ± combined SE (``n/a`` without a value)."""
        found = self.interval(label, column)
        if found is None:
            return "n/a"
        mean, se, _ = found
        if column.kind == "int":
            return format_number(mean, column.kind)
        return format_number(mean, column.kind) + ("" if se is None else f" ± {format_number(se, column.kind)}")

    def evaluation_errors(self, columns) -> list[float]:
        """The evaluation-sample standard errors of every paired difference from the references on ``columns``."""
        return [
            c.se_eval
            for reference in self.references.values()
            for column in columns
            for c in self.comparisons(reference, column)
            if c.se_eval is not None
        ]
