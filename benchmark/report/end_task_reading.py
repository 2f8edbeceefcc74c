"""The leaderboard's reading of the end-task table: seed spread, the paired tests against no DAP and against the
references that train the model, the majority class, and what each method's records say their numbers mean."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from benchmark.protocols import protocol_caveat
from benchmark.report.frame import backbone_flag, by_label
from benchmark.report.reading import column_of, resolvable_range
from benchmark.report.statistics import ALPHA, Comparison, GroupStatistics
from benchmark.report.words import say

TEMPLATE = "end_tasks.md.j2"
"""The template that holds the end-task reading's words."""


@dataclass(frozen=True)
class Separation:
    """A family of final macro-F1 comparisons with one reference: the rows resolved above and below it, and the ties
    with the smallest differences (points) their tests resolve with 80% power, as a range over the tied rows."""

    above: list[Comparison]
    below: list[Comparison]
    ties: list[Comparison]
    compared: int

    @property
    def bounds(self) -> tuple[float, float]:
        """The smallest and largest of the ties' resolvable differences, in points (:func:`resolvable_range`)."""
        return resolvable_range(self.ties, 100)


def separation(comparisons: list[Comparison]) -> Separation:
    """The resolved differences of ``comparisons`` by sign, and their ties."""
    above = [c for c in comparisons if c.resolved() and c.mean > 0]
    below = [c for c in comparisons if c.resolved() and c.mean < 0]
    return Separation(above, below, [c for c in comparisons if not c.resolved()], len(comparisons))


def _over_orders(stats: GroupStatistics) -> bool:
    return stats.part["order"].nunique() > 1


def end_task_reading(stats: GroupStatistics) -> list[str]:
    """Facts a reader should weigh about the end tasks: seed spread, DAP against no DAP and every method against the
    references that train the model (both tests each), the majority class, and what each method's record says its
    numbers mean."""
    part, records = stats.part, stats.records
    no_dap = stats.references.get("no_dap")
    means = part.groupby("method")["final macro-F1"].mean() * 100
    lines = []
    if part.groupby("method").size().max() > 1:
        std = (part.groupby("method")["final macro-F1"].std(ddof=1) * 100).max()
        lines.append(say(TEMPLATE, "seed_spread", _over_orders(stats), std, means.max() - means.min()))
    else:
        lines.append(say(TEMPLATE, "one_seed"))
    if no_dap in means and len(means) > 1:
        lines += _against_no_dap(stats, no_dap, means)
    lines += _against_dap_references(stats)
    majority = records[0].get("majority_class")
    if majority:
        best = part.groupby("method")["final acc"].mean().max() * 100
        lines.append(say(TEMPLATE, "majority", 100 * majority["acc"], 100 * majority["macro_f1"], best, means.max()))
    caveat = protocol_caveat(records[0]["config"]["finetune"])
    if caveat:
        lines.append(say(TEMPLATE, "caveat", caveat))
    return lines + mask_reading(records) + method_notes(records)


def measuring_comparisons(stats: GroupStatistics, reference: str) -> tuple[list[Comparison], list[str]]:
    """Every final macro-F1 comparison with ``reference`` whose two rows' final cells all measure the backbone, and
    the labels of the rows left out because theirs (or the reference's) do not (:func:`backbone_flag`): the report
    states no end-task verdict from such cells."""
    comparisons = stats.comparisons(reference, column_of("final macro-F1"))
    rows = by_label(stats.records)
    if backbone_flag(rows.get(reference, [])):
        return [], [c.label for c in comparisons]
    flagged = {c.label for c in comparisons if backbone_flag(rows[c.label])}
    return [c for c in comparisons if c.label not in flagged], sorted(flagged)


def _against_no_dap(stats: GroupStatistics, no_dap: str, means: pd.Series) -> list[str]:
    comparisons, unmeasured = measuring_comparisons(stats, no_dap)
    if unmeasured and not comparisons:
        return [say(TEMPLATE, "no_dap_unmeasured", unmeasured, no_dap)]
    dap = means.drop(no_dap)
    # The paired tests cover only rows of more than one seed; naming a one-seed row "best" beside verdicts it never
    # had would read as a result, so the best is taken among the rows compared below whenever there are any.
    tested = dap[dap.index.isin([c.label for c in comparisons])]
    untested = len(dap) - len(tested) if len(tested) else 0
    if untested:
        dap = tested
    gap = dap.max() - means[no_dap]
    found = separation(comparisons)
    return [say(TEMPLATE, "against_no_dap", dap.idxmax(), gap, no_dap, ALPHA, found, untested, unmeasured)]


def _against_dap_references(stats: GroupStatistics) -> list[str]:
    """Final macro-F1 against each reference that trains the model (naive continual training, the paper's method),
    with the same two tests as against no DAP: a part without a no-DAP row (one over several domain orders) still
    gets its end-task differences tested, and every part says which methods beat NCL and DAS on end tasks."""
    lines = []
    for role, reference in stats.references.items():
        if role == "no_dap":
            continue
        comparisons, unmeasured = measuring_comparisons(stats, reference)
        if not comparisons and not unmeasured:
            continue
        found = separation(comparisons)
        lines.append(say(TEMPLATE, "against_reference", reference, _over_orders(stats), ALPHA, found, unmeasured))
    return lines


def mask_reading(records: list[dict]) -> list[str]:
    """For methods that record their soft-mask's measured damping: how much of their update units keep, by
    importance, as a mean over domains and seeds."""
    by_label: dict[str, list[list[float | None]]] = {}
    for record in records:
        for domain in record.get("domains", []):
            mask = (domain.get("method_report") or {}).get("mask")
            if mask:
                by_label.setdefault(record["method_label"], []).append(mask["damping_per_bin"])
    lines = []
    for label, per_domain in sorted(by_label.items()):
        bins = np.array([[np.nan if v is None else v for v in row] for row in per_domain], dtype=float)
        with np.errstate(all="ignore"):
            kept = {
                "0.0-0.5": np.nanmean(bins[:, :5]),
                "0.5-0.9": np.nanmean(bins[:, 5:9]),
                "0.9-1.0": np.nanmean(bins[:, 9]),
            }
        shown = [(span, v) for span, v in kept.items() if not np.isnan(v)]
        lines.append(say(TEMPLATE, "mask", label, len(per_domain), shown))
    return lines


def method_notes(records: list[dict]) -> list[str]:
    """What each method's records say its numbers mean (their ``leaderboard_note``), once per method."""
    notes = {}
    for record in records:
        if record.get("leaderboard_note"):
            notes.setdefault(record["method"], record["leaderboard_note"])
    return [say(TEMPLATE, "method_note", name, note) for name, note in sorted(notes.items())]
