"""Rankings across a budget ladder (issue #46): do a group's verdicts hold when the methods train longer?

A ladder is a set of leaderboard groups that differ in nothing but the DAP budget (``dap.steps``): the same model,
data, evaluation and end-task protocol, found in the records themselves, so any family of rungs (the ``mini``,
``mini-4x`` and ``mini-pass`` profiles, or a user's ``--set dap.steps=`` series) is read alike. Per metric, the rows
the rungs share are ranked at each rung and compared between consecutive rungs (and bottom against top) by Kendall's
tau, with a bias-corrected bootstrap interval that resamples the rows compared, each method's seeds and the held-out
chunks (or test examples) the metric was measured on (the choice of rows is the largest part of a few-row tau's
error), and the one-sided p-value of Kendall's test that tau is above 0 beside it. A pairwise verdict (method A better
than B) at a rung is the report's one comparison (:mod:`benchmark.report.comparison`: paired by seed, the evaluation
sample's error added, Benjamini-Hochberg over every pair of the rung on that metric); between rungs it keeps, flips
(resolved both times, opposite ways) or appears (resolved only at the larger budget). A row flagged
untrained at either of two rungs (:func:`benchmark.report.frame.untrained_flag`: its own parameters or gates did not
learn) is left out of their comparison, as the short answer leaves it out: its rank measures a method that did not
train, and the section names it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from benchmark.protocols import PROTOCOLS
from benchmark.report.comparison import ALPHA, benjamini_hochberg, welch_test
from benchmark.report.frame import END_TASK_COLUMNS, Column, by_label, loss_columns, tokens_per_domain, untrained_flag
from benchmark.report.statistics import REPLICATES, GroupStatistics, named_generator, paired_difference


def ladder_columns() -> list[Column]:
    """The metrics a ladder reads: every loss and end-task column with a direction and a replicated metric."""
    return [c for c in loss_columns() + END_TASK_COLUMNS if c.metric and c.higher_is_better is not None]


BOOTSTRAP = REPLICATES
"""Joint resamples of seeds and evaluation sample per ladder (one per evaluation-sample replicate)."""


@dataclass
class Rung:
    """One group of a ladder: its statistics and its budget."""

    stats: GroupStatistics
    key: str
    steps: int
    tokens_per_domain: int
    untrained: dict[str, str] = field(default_factory=dict)
    """Per row flagged untrained at this budget, its flag (``untrained: gate decisions ≤ 2.3%``)."""


@dataclass
class Ladder:
    """Groups that differ only in their DAP budget, smallest first."""

    rungs: list[Rung]
    key: str
    references: dict[str, str] = field(default_factory=dict)

    def labels(self) -> list[str]:
        """The method rows every rung has."""
        shared = set.intersection(*(set(r.stats.part["method"]) for r in self.rungs))
        return sorted(shared)

    def measured(self) -> list[str]:
        """The method rows any rung has: two rungs are compared over the rows both have, so a top rung that holds
        fewer rows so far does not shrink the comparison of the rungs below it."""
        return sorted(set.union(*(set(r.stats.part["method"]) for r in self.rungs)))

    def pairs(self) -> list[tuple[int, int]]:
        """The rung pairs a ladder compares: consecutive rungs, and bottom to top where there are more than two."""
        last = len(self.rungs) - 1
        return [(i, i + 1) for i in range(last)] + ([(0, last)] if last > 1 else [])

    def _both(self, i: int, j: int) -> set[str]:
        return set(self.rungs[i].stats.part["method"]) & set(self.rungs[j].stats.part["method"])

    def shared(self, i: int, j: int) -> list[str]:
        """The method rows rungs ``i`` and ``j`` both have and compare: those flagged untrained at either are left
        out (:meth:`left_out`)."""
        return sorted(self._both(i, j) - set(self.left_out(i, j)))

    def left_out(self, i: int, j: int) -> dict[str, list[str]]:
        """The rows rungs ``i`` and ``j`` both have but do not compare, each with its untrained flags (rung by rung,
        with the rung's budget), because one of the two budgets did not train it."""
        pair = (self.rungs[i], self.rungs[j])
        out: dict[str, list[str]] = {}
        for label in sorted(self._both(i, j)):
            flags = [f"{r.untrained[label]} at {r.steps} updates" for r in pair if label in r.untrained]
            if flags:
                out[label] = flags
        return out


def find_ladders(sections: list[tuple]) -> list[Ladder]:
    """The ladders among a leaderboard's ``(group, statistics, plots)`` sections: two or more groups whose payloads
    are equal once ``dap.steps`` is left out, and with it the end-task settings the groups' protocol does not read
    (a top rung that also fine-tunes beside its probe, ``finetune.beside``, at its own rate, is scored alike by the
    probe). Parts of a group split by domain orders are left out."""
    by_key: dict[str, list[Rung]] = {}
    for group, stats, _ in sections:
        if group.orders:
            continue
        payload = json.loads(json.dumps(group.payload))
        dap = payload.get("config", {}).get("dap", {})
        steps = int(group.records[0]["config"]["dap"]["steps"])
        dap.pop("steps", None)
        _keep_what_the_protocol_reads(payload.get("config", {}), group.records[0]["config"]["finetune"])
        key = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
        untrained = {label: flag for label, rows in by_label(group.records).items() if (flag := untrained_flag(rows))}
        rung = Rung(stats, group.key, steps, tokens_per_domain(group.records[0]), untrained)
        by_key.setdefault(key, []).append(rung)
    ladders = []
    for key, rungs in sorted(by_key.items()):
        if len({r.steps for r in rungs}) >= 2:
            rungs = sorted(rungs, key=lambda r: r.steps)
            ladders.append(Ladder(rungs, key, rungs[-1].stats.references))
    return ladders


def _keep_what_the_protocol_reads(config: dict, finetune: dict) -> None:
    """Drop from a group payload's ``finetune`` section what its end-task protocol does not read (every setting is
    kept for a protocol that does not say what it reads, or one not installed here)."""
    protocol = PROTOCOLS.find(finetune.get("protocol", "finetune"))
    reads = protocol.reads if protocol is not None else None
    if reads is not None and "finetune" in config:
        config["finetune"] = {k: v for k, v in config["finetune"].items() if k in reads}


def replicates(stats: GroupStatistics, label: str, column: Column, rng: np.random.Generator) -> np.ndarray | None:
    """``BOOTSTRAP`` replicates of ``label``'s mean on ``column``: each a mean over a resample of its seeds, each
    seed's value taken from one bootstrap replicate of the evaluation sample (its point value where it has none)."""
    rows = stats.part[stats.part["method"] == label].dropna(subset=[column.title])
    if rows.empty:
        return None
    values = []
    for run_id, point in zip(rows["run_id"], rows[column.title], strict=True):
        sampled = stats.sample.of(run_id, column.metric)
        values.append(np.full(BOOTSTRAP, point) if sampled is None else sampled)
    table = np.stack(values)  # seeds x replicates
    picks = rng.integers(0, len(table), (BOOTSTRAP, len(table)))
    return table[picks, np.arange(BOOTSTRAP)[:, None]].mean(axis=1)


def kendall_tau(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of two rankings of the same rows, along the last axis (one tau per leading index): the sum over
    row pairs of sign(a_i - a_j) sign(b_i - b_j), normalised by the pairs each ranking does not tie."""
    sa = np.sign(a[..., :, None] - a[..., None, :])
    sb = np.sign(b[..., :, None] - b[..., None, :])
    denominator = np.sqrt((sa**2).sum(axis=(-2, -1)) * (sb**2).sum(axis=(-2, -1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sa * sb).sum(axis=(-2, -1)) / denominator


@dataclass
class TauResult:
    """Kendall's tau of one metric between two rungs, over the rows both have, with its bias-corrected bootstrap
    interval (rows, seeds and evaluation sample resampled) and Kendall's one-sided p-value of tau > 0."""

    column: str
    rungs: tuple[int, int]
    rows: int
    tau: float
    low: float
    high: float
    p: float = float("nan")

    def above_zero(self) -> bool:
        """Whether tau is distinguishable from 0 (Kendall's test, one-sided, at the report's level)."""
        return self.p < ALPHA


@dataclass
class Verdict:
    """A pairwise verdict on one metric between two rungs: kept, flipped or appeared."""

    column: str
    better: str
    worse: str
    change: str
    rungs: tuple[int, int]


@dataclass
class LadderReading:
    """Everything the leaderboard says about one ladder."""

    ladder: Ladder
    taus: list[TauResult]
    verdicts: list[Verdict]
    means: dict[str, dict[str, list[float | None]]]
    """Per column title and row label, its mean at each rung (None where the rung lacks it)."""
    samples: dict[str, list[dict[str, np.ndarray | None]]] = field(default_factory=dict)
    """Per column title and rung, each row's bootstrap replicates of its mean (:func:`replicates`; None where the
    rung lacks the row): what the taus' intervals and the verdicts are computed from."""


def read_ladder(ladder: Ladder) -> LadderReading:
    """Tau per metric between consecutive rungs (and bottom to top), and every pairwise verdict that kept, flipped or
    appeared between consecutive rungs, each over the rows the two rungs share and compare (:meth:`Ladder.shared`)."""
    labels = ladder.measured()
    columns = ladder_columns()
    # each row's resamples drawn from its own generator: a record added to one rung leaves the others' readings as
    # they were (one shared generator would shift every later draw)
    samples = {
        c.title: [
            {lab: replicates(r.stats, lab, c, named_generator(ladder.key, r.key, c.title, lab)) for lab in labels}
            for r in ladder.rungs
        ]
        for c in columns
    }
    means = {c.title: {lab: [_mean(r.stats, lab, c) for r in ladder.rungs] for lab in labels} for c in columns}
    pairs = ladder.pairs()
    compared = {pair: ladder.shared(*pair) for pair in pairs}
    taus, verdicts = [], []
    for column in columns:
        for i, j in pairs:
            rng = named_generator(ladder.key, "tau rows", column.title, str(i), str(j))
            taus += rank_agreement(column, samples[column.title], means[column.title], (i, j, rng), compared[i, j])
        for i, j in pairs[: len(ladder.rungs) - 1]:
            before, after = (rung_verdicts(ladder.rungs[k].stats, column, compared[i, j]) for k in (i, j))
            verdicts += _verdicts(column, before, after, (i, j))
    return LadderReading(ladder, taus, verdicts, means, samples)


def _mean(stats: GroupStatistics, label: str, column: Column) -> float | None:
    rows = stats.part[stats.part["method"] == label][column.title].dropna()
    return None if rows.empty else float(rows.mean())


def rank_agreement(
    column: Column, samples: list[dict], means: dict, where: tuple, compared: list[str]
) -> list[TauResult]:
    """Kendall's tau of ``column`` between rungs ``where[:2]`` over the ``compared`` rows that both measure (none for
    fewer than 3), its bias-corrected bootstrap interval from each row's replicates (``samples[k][row]``) with the rows
    resampled too (``where[2]``: the generator), and Kendall's one-sided p-value of tau > 0."""
    from scipy.stats import kendalltau, norm

    i, j, rng = where
    rows = [lab for lab in compared if means[lab][i] is not None and means[lab][j] is not None]
    if len(rows) < 3:
        return []
    a, b = np.array([means[r][i] for r in rows]), np.array([means[r][j] for r in rows])
    point = float(kendall_tau(a, b))
    p = float(kendalltau(a, b, alternative="greater").pvalue)
    before, after = (np.stack([samples[k][r] for r in rows], axis=1) for k in (i, j))  # replicates x rows
    picks = rng.integers(0, len(rows), before.shape)  # the rows resampled too: which rows were chosen is chance
    drawn = kendall_tau(np.take_along_axis(before, picks, 1), np.take_along_axis(after, picks, 1))
    drawn = drawn[np.isfinite(drawn)]  # a replicate in which one rung ties every row has no tau
    if not len(drawn) or np.isnan(point):
        return [TauResult(column.title, (i, j), len(rows), point, np.nan, np.nan, p)]
    # bias-corrected percentiles: the bootstrap of a few-row tau leans toward 0, so its plain percentiles can leave
    # the point outside; z0 measures that lean and shifts the percentiles back (Efron's BC interval)
    below = np.clip((np.sum(drawn < point) + 0.5 * np.sum(drawn == point)) / len(drawn), 1e-6, 1 - 1e-6)
    z0 = norm.ppf(below)
    low, high = np.percentile(drawn, 100 * norm.cdf(2 * z0 + norm.ppf([0.025, 0.975])))
    return [TauResult(column.title, (i, j), len(rows), point, float(min(low, point)), float(max(high, point)), p)]


def rung_verdicts(stats: GroupStatistics, column: Column, rows: list[str]) -> dict[tuple[str, str], bool]:
    """At one rung, every pair of ``rows`` whose difference on ``column`` is resolved, by the report's one comparison
    (paired by seed and order, the evaluation sample's error added; Welch's test where the two share fewer than two
    runs), Benjamini-Hochberg over all the pairs: ``(a, b) -> True`` where ``a`` is better, False where worse."""
    part = stats.part.dropna(subset=[column.title])
    wide = part.pivot_table(index="pair", columns="method", values=column.title)
    runs = part.set_index(["method", "pair"])["run_id"]
    present = [r for r in rows if r in wide]
    tests = {}
    for a, b in combinations(present, 2):
        found = paired_difference(wide, runs, a, b, stats.sample, column.metric)
        tests[a, b] = found[2] if found else welch_test(wide[a].dropna().to_numpy(), wide[b].dropna().to_numpy())
    tests = {pair: test for pair, test in tests.items() if test is not None}
    qs = benjamini_hochberg([test.p for test in tests.values()])
    return {
        pair: (test.mean > 0) == bool(column.higher_is_better)
        for (pair, test), q in zip(tests.items(), qs, strict=True)
        if q < ALPHA and test.mean != 0
    }


def _verdicts(column: Column, before: dict, after: dict, rungs: tuple[int, int]) -> list[Verdict]:
    out = []
    for (a, b), better_now in after.items():
        was = before.get((a, b))
        better, worse = (a, b) if better_now else (b, a)
        change = "appeared" if was is None else "kept" if was == better_now else "flipped"
        out.append(Verdict(column.title, better, worse, change, rungs))
    return out


def budget_series(ladder: Ladder, label: str, means: list, scale: float) -> tuple[list[float], list[tuple]]:
    """A row's line against the budget, and its points at rungs that flag it untrained, drawn apart as marks: a
    line through them would read as a method's trend over budgets at which it did not train (rungs without the
    row, or a mean the metric lacks, are gaps)."""
    line, flagged = [], []
    for rung, mean in zip(ladder.rungs, means, strict=True):
        value = np.nan if mean is None else mean * scale
        if label in rung.untrained:
            flagged += [] if np.isnan(value) else [(rung.tokens_per_domain, value)]
            value = np.nan
        line.append(value)
    return line, flagged


def budget_band(reading: LadderReading, column: Column, label: str, scale: float) -> tuple[list[float], list[float]]:
    """A row's 95% bootstrap interval at each rung (over seeds and the evaluation sample, from the replicates the
    taus and verdicts use), NaN where the rung lacks the row or flags it untrained, as :func:`budget_series` gaps."""
    low, high = [], []
    for rung, drawn in zip(reading.ladder.rungs, reading.samples[column.title], strict=True):
        values = drawn.get(label)
        if values is None or label in rung.untrained or not np.isfinite(values).any():
            low.append(np.nan)
            high.append(np.nan)
            continue
        lo, hi = np.nanpercentile(values, [2.5, 97.5]) * scale
        low.append(float(lo))
        high.append(float(hi))
    return low, high
