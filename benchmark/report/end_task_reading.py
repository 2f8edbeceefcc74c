"""The leaderboard's reading of the end-task table: seed spread, the paired tests against no DAP and against the
references that train the model, the majority class, and what each method's records say their numbers mean."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmark.protocols import protocol_caveat
from benchmark.report.escape import code, text
from benchmark.report.frame import backbone_flag, by_label
from benchmark.report.reading import column_of, paired_by, paired_runs, tie_bound
from benchmark.report.statistics import ALPHA, Comparison, GroupStatistics


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
        lines.append(
            f"- Seed spread: the largest std of final macro-F1 over {paired_runs(stats)} is {std:.2f} points; the"
            f" method means span {means.max() - means.min():.2f} points."
        )
    else:
        lines.append("- One seed per method: the seed-to-seed spread is not measured, so no difference is established.")
    if no_dap in means and len(means) > 1:
        lines += _against_no_dap(stats, no_dap, means)
    lines += _against_dap_references(stats)
    majority = records[0].get("majority_class")
    if majority:
        best = part.groupby("method")["final acc"].mean().max() * 100
        lines.append(
            f"- Always predicting each task's most frequent test label would score {100 * majority['acc']:.2f} final"
            f" accuracy and {100 * majority['macro_f1']:.2f} macro-F1 (best method: {best:.2f} / {means.max():.2f})."
        )
    caveat = protocol_caveat(records[0]["config"]["finetune"])
    if caveat:
        lines.append(f"- {caveat}")
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


def _left_out(labels: list[str], reference: str) -> str:
    """The sentence naming the rows not compared with ``reference`` because their cells do not measure the backbone."""
    if not labels:
        return ""
    return (
        f" Not compared with {code(reference)}: {', '.join(code(label) for label in labels)} (final cells that do not"
        " measure the backbone: they predict under half of a test set's classes or score at the majority class)."
    )


def _against_no_dap(stats: GroupStatistics, no_dap: str, means: pd.Series) -> list[str]:
    comparisons, unmeasured = measuring_comparisons(stats, no_dap)
    if unmeasured and not comparisons:
        return [f"- DAP vs no DAP: no verdict.{_left_out(unmeasured, no_dap)}"]
    dap = means.drop(no_dap)
    # The paired tests cover only rows of more than one seed; naming a one-seed row "best" beside verdicts it never
    # had would read as a result, so the best is taken among the rows compared below whenever there are any.
    tested = dap[dap.index.isin([c.label for c in comparisons])]
    untested = len(dap) - len(tested) if len(tested) else 0
    if untested:
        dap = tested
    which = " of more than one seed" if untested else ""
    return [
        f"- DAP vs no DAP: the best DAP method{which} ({code(dap.idxmax())}) is {dap.max() - means[no_dap]:+.2f}"
        f" points of final macro-F1 from {code(no_dap)}. Paired t-test whose standard error adds the test sample's"
        f" bootstrap error to the seeds', q < {ALPHA}: {_separation(comparisons, 'no DAP')}."
        + (f" {untested} one-seed row(s) are neither ranked nor tested." if untested else "")
        + _left_out(unmeasured, no_dap)
    ]


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
        lines.append(
            f"- Final macro-F1 against {code(reference)} (paired by {paired_by(stats)}; t-test over"
            f" {paired_runs(stats)} with the test sample's bootstrap error added, Benjamini-Hochberg over"
            f" {len(comparisons)} method{'s' * (len(comparisons) != 1)}, q < {ALPHA}):"
            f" {_separation(comparisons, 'it')}.{_left_out(unmeasured, reference)}"
        )
    return lines


def _separation(comparisons: list[Comparison], reference: str) -> str:
    """``above it X (+d); below it Y (-d); the other N are not separated from <reference>``: the resolved
    differences in final macro-F1 points, by sign."""
    above = [c for c in comparisons if c.resolved() and c.mean > 0]
    below = [c for c in comparisons if c.resolved() and c.mean < 0]

    def points(found: list[Comparison]) -> str:
        return ", ".join(f"{code(c.label)} ({100 * c.mean:+.2f})" for c in found) or "none"

    ties = [c for c in comparisons if not c.resolved()]
    if not ties:
        return f"above it {points(above)}; below it {points(below)}"
    rest = "the other one is" if len(ties) == 1 else f"the other {len(ties)} are"
    return (
        f"above it {points(above)}; below it {points(below)}; {rest} not separated from {reference}"
        f" ({tie_bound(ties, '.2f', 100)} points)"
    )


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
        shown = ", ".join(f"{span} keep {100 * v:.1f}%" for span, v in kept.items() if not np.isnan(v))
        lines.append(
            f"- {code(label)} soft-mask, measured at each domain's last step ({len(per_domain)} domain-runs): units of"
            f" importance {shown} of the update they would take unmasked."
        )
    return lines


def method_notes(records: list[dict]) -> list[str]:
    """What each method's records say its numbers mean (their ``leaderboard_note``), once per method."""
    notes = {}
    for record in records:
        if record.get("leaderboard_note"):
            notes.setdefault(record["method"], record["leaderboard_note"])
    return [f"- {code(name)}: {text(note)}" for name, note in sorted(notes.items())]
