"""The leaderboard's reading: sentences generated from a group's numbers (never written by hand), each saying what
the seeds and the evaluation sample resolve and what they do not."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from benchmark.labels import is_row_label, join_label, label_method, split_label
from benchmark.report.escape import code
from benchmark.report.frame import END_TASK_COLUMNS, VERDICT_METRICS, loss_columns
from benchmark.report.statistics import ALPHA, Comparison, GroupStatistics, adjust_for_multiplicity
from benchmark.report.words import say

TEMPLATE = "reading.md.j2"
"""The template that holds the reading's words."""


@dataclass(frozen=True)
class MetricFinding:
    """One loss metric against one reference: the rows resolved lower and higher, and the ties with the smallest
    differences their tests resolve with 80% power (their range over the tied rows)."""

    title: str
    lower: list[Comparison]
    higher: list[Comparison]
    ties: list[Comparison]

    @property
    def bounds(self) -> tuple[float, float]:
        """The smallest and largest of the ties' resolvable differences (:func:`resolvable_range`)."""
        return resolvable_range(self.ties)


@dataclass(frozen=True)
class ReferenceFinding:
    """Every row against one reference on the verdict metrics (:data:`~benchmark.report.frame.VERDICT_METRICS`)."""

    reference: str
    tested: int
    """The most rows compared on any metric: the size of the Benjamini-Hochberg family."""
    orders: bool
    """Whether the group spans several domain orders (its tests pair (order, seed) runs)."""
    metrics: list[MetricFinding]
    alpha: float = ALPHA


def column_of(title: str):
    """The leaderboard column (loss or end-task) titled ``title``."""
    return next(c for c in loss_columns() + END_TASK_COLUMNS if c.title == title)


def verdict_cells(stats: GroupStatistics) -> dict[str, dict[tuple[str, str], list[str]]]:
    """Per method: (metric letter, arrow) -> the references it differs from on that loss metric, resolved by seeds and
    evaluation sample alike (letters from :data:`~benchmark.report.frame.VERDICT_METRICS`; ``↓`` lower)."""
    found: dict[str, dict[tuple[str, str], list[str]]] = {}
    for title, letter in VERDICT_METRICS:
        for reference in stats.references.values():
            for c in stats.comparisons(reference, column_of(title)):
                if c.resolved():
                    arrow = "↓" if c.mean < 0 else "↑"
                    found.setdefault(c.label, {}).setdefault((letter, arrow), []).append(reference)
    return found


def verdicts(stats: GroupStatistics) -> dict[str, str]:
    """Per method: which loss metrics differ from each reference, resolved by the one comparison (seeds and
    evaluation sample in one standard error), e.g. ``F↓ ncl · G↓ ncl, none``."""
    return {label: verdict_text(cells) for label, cells in verdict_cells(stats).items()}


def verdict_text(cells: dict[tuple[str, str], list[str]], name=code) -> str:
    """One row's verdict cells as a line, ``F↓ ncl · G↓ ncl, none``, each reference shown by ``name``."""
    return " · ".join(f"{letter}{arrow} {', '.join(map(name, refs))}" for (letter, arrow), refs in cells.items())


def loss_reading(stats: GroupStatistics) -> list[str]:
    """Which methods beat each reference on forgetting, general-loss rise and plasticity; the evaluation sample's
    error; the spans of forgetting and drift."""
    lines = [say(TEMPLATE, "against", found) for found in reference_findings(stats) if found.tested]
    lines += _evaluation_error(stats)
    lines += _span(stats, "forgetting", "Forgetting", "nats across methods")
    drift = stats.part.groupby("method")["CKA to base"].mean().dropna()
    if not drift.empty:
        lines.append(say(TEMPLATE, "drift", drift.min(), drift.idxmin(), drift.max(), drift.idxmax()))
    return lines


def reference_findings(stats: GroupStatistics) -> list[ReferenceFinding]:
    """Per reference of the group, every row against it on each verdict metric (:class:`ReferenceFinding`)."""
    found = []
    for reference in stats.references.values():
        metrics, tested = [], 0
        for title, _ in VERDICT_METRICS:
            comparisons = stats.comparisons(reference, column_of(title))
            tested = max(tested, len(comparisons))
            resolved = [c for c in comparisons if c.resolved()]
            lower = [c for c in resolved if np.sign(c.mean) == -1]
            higher = [c for c in resolved if np.sign(c.mean) == 1]
            metrics.append(MetricFinding(title, lower, higher, [c for c in comparisons if not c.resolved()]))
        found.append(ReferenceFinding(reference, tested, _over_orders(stats), metrics))
    return found


def _over_orders(stats: GroupStatistics) -> bool:
    return stats.part["order"].nunique() > 1


def paired_by(stats: GroupStatistics) -> str:
    """What the group's comparisons pair: the seed, or (order, seed) where the group spans several domain orders."""
    return say(TEMPLATE, "paired_by", _over_orders(stats))


def paired_runs(stats: GroupStatistics) -> str:
    """What a group's paired tests run over, in words: seeds, or (order, seed) runs."""
    return say(TEMPLATE, "paired_runs", _over_orders(stats))


def resolvable_range(ties: list[Comparison], scale: float = 1.0) -> tuple[float, float]:
    """What the ties of a family could have resolved: the smallest and largest difference their tests find with 80%
    power, times ``scale`` (``equal within X`` where X is small, ``too few seeds`` where it is large)."""
    bounds = [c.resolvable() * scale for c in ties]
    return min(bounds), max(bounds)


def _evaluation_error(stats: GroupStatistics) -> list[str]:
    errors = stats.evaluation_errors([column_of(title) for title, _ in VERDICT_METRICS])
    if not errors and stats.part["method"].nunique() < 2:
        return [say(TEMPLATE, "evaluation_error", "one row")]
    if not errors and all(r["lm_loss"].get("chunks") for r in stats.records):
        return [say(TEMPLATE, "evaluation_error", "no pair")]
    if not errors:
        return [say(TEMPLATE, "evaluation_error", "unknown")]
    return [say(TEMPLATE, "evaluation_error", "measured", np.median(errors), max(errors))]


def _span(stats: GroupStatistics, column: str, name: str, unit: str) -> list[str]:
    spread = stats.part.groupby("method")[column].std(ddof=1).max()
    means = stats.part.groupby("method")[column].mean().dropna()
    if len(means) < 2 or np.isnan(spread):
        return []
    low, high = means.min(), means.max()
    return [say(TEMPLATE, "span", name, unit, low, means.idxmin(), high, means.idxmax(), _over_orders(stats), spread)]


def option_parents(label: str) -> list[str]:
    """The labels one option closer to the defaults: ``das[a=1,b=2]`` -> ``das[b=2]``, ``das[a=1]``; ``das[a=1]`` ->
    ``das`` (labels write options in one canonical order, so a parent is spelled as its own records label it)."""
    name, options = split_label(label)
    return [join_label(name, options[:dropped] + options[dropped + 1 :]) for dropped in range(len(options))]


def variant_reading(stats: GroupStatistics) -> list[str]:
    """Each option variant against every measured label one option closer to the method's defaults, paired by seed,
    on the held-out-loss metrics: what each option changes, everything else equal. The pairs of a group are read
    together, so their q-values are Benjamini-Hochberg over every pair of the group, per metric."""
    cells = _pair_family(stats, _variant_pairs(stats))
    return _family_lines(stats, cells, "variants")


def sibling_reading(stats: GroupStatistics) -> list[str]:
    """Two methods under the same options (``das[schedule.name=wsd]`` against ``ncl[schedule.name=wsd]``), paired by
    seed, on the held-out-loss metrics: whether a method's difference survives an option both share. Its own family
    of tests: q-values are Benjamini-Hochberg over every such pair of the group, per metric."""
    cells = _pair_family(stats, _sibling_pairs(stats))
    return _family_lines(stats, cells, "siblings")


def _pair_family(stats: GroupStatistics, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], list]:
    """(label, reference) -> [(metric title, comparison)] for ``pairs``, the q-values corrected over all of them."""
    subsets = {(label, ref): stats.part[stats.part["method"].isin([ref, label])] for label, ref in pairs}
    cells: dict[tuple[str, str], list[tuple[str, Comparison]]] = {}
    for title, _ in VERDICT_METRICS:
        family = []
        for (label, ref), subset in subsets.items():
            for c in _pair(stats, subset, ref, column_of(title)):
                cells.setdefault((label, ref), []).append((title, c))
                family.append(c)
        adjust_for_multiplicity(family)  # replaces each lone pair's q (compare's) by the family's
    return cells


def _family_lines(stats: GroupStatistics, cells: dict, kind: str) -> list[str]:
    """A family's header and a line per pair (``kind``: ``variants`` or ``siblings``)."""
    if not cells:
        return []
    header = say(TEMPLATE, "family_header", kind, len(cells), _over_orders(stats), ALPHA)
    return [header] + [say(TEMPLATE, "pair_line", label, ref, found) for (label, ref), found in cells.items()]


def _variant_pairs(stats: GroupStatistics) -> list[tuple[str, str]]:
    labels = set(stats.part["method"])
    return [
        (variant, parent)
        for variant in sorted(m for m in labels if is_row_label(m))
        for parent in option_parents(variant)
        if parent in labels
    ]


def _sibling_pairs(stats: GroupStatistics) -> list[tuple[str, str]]:
    """(label, reference) for every two labels with the same non-default options and different methods; the
    reference is the one whose method comes first among the group's references (``ncl``, ``das``, ``none``), else
    by name."""
    rank = {label: i for i, label in enumerate(stats.references.values())}
    by_options: dict[str, list[str]] = {}
    for label in sorted(m for m in set(stats.part["method"]) if is_row_label(m)):
        by_options.setdefault(",".join(split_label(label)[1]), []).append(label)
    pairs = []
    for siblings in by_options.values():
        ordered = sorted(siblings, key=lambda label: (rank.get(label_method(label), len(rank)), label))
        pairs += [(label, ref) for i, ref in enumerate(ordered) for label in ordered[i + 1 :]]
    return pairs


def _pair(stats: GroupStatistics, subset: pd.DataFrame, parent: str, column) -> list[Comparison]:
    from benchmark.report.statistics import compare

    return compare(subset, parent, column.title, stats.sample, column.metric)
