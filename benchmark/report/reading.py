"""The leaderboard's reading: sentences generated from a group's numbers (never written by hand), each saying what
the seeds and the evaluation sample resolve and what they do not."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmark.report.escape import code, text
from benchmark.report.frame import END_TASK_COLUMNS, LOSS_COLUMNS, VERDICT_METRICS
from benchmark.report.statistics import ALPHA, Comparison, GroupStatistics, adjust_for_multiplicity

WORDS = {
    "forgetting": ("less forgetting", "more forgetting"),
    "general rise": ("a smaller general-loss rise", "a larger general-loss rise"),
    "plasticity": ("less plasticity", "more plasticity"),
}


def _column(title: str):
    return next(c for c in LOSS_COLUMNS + END_TASK_COLUMNS if c.title == title)


def verdicts(stats: GroupStatistics) -> dict[str, str]:
    """Per method: which loss metrics differ from each reference, resolved by seeds and evaluation sample alike,
    e.g. ``F↓ ncl · G↓ ncl, none``."""
    found: dict[str, dict[tuple[str, str], list[str]]] = {}
    for title, letter in VERDICT_METRICS:
        for reference in stats.references.values():
            for c in stats.comparisons(reference, _column(title)):
                if c.resolved():
                    arrow = "↓" if c.mean < 0 else "↑"
                    found.setdefault(c.label, {}).setdefault((letter, arrow), []).append(code(reference))
    return {
        label: " · ".join(f"{letter}{arrow} {', '.join(refs)}" for (letter, arrow), refs in cells.items())
        for label, cells in found.items()
    }


def loss_reading(stats: GroupStatistics) -> list[str]:
    """Which methods beat each reference on forgetting, general-loss rise and plasticity; the evaluation sample's
    error; the spans of forgetting and drift."""
    lines = []
    for reference in stats.references.values():
        clauses, tested = [], 0
        for title, _ in VERDICT_METRICS:
            comparisons = stats.comparisons(reference, _column(title))
            tested = max(tested, len(comparisons))
            resolved = [c for c in comparisons if c.resolved()]
            for sign, word in zip((-1, 1), WORDS[title], strict=True):
                names = ", ".join(f"{code(c.label)} ({c.mean:+.3f})" for c in resolved if np.sign(c.mean) == sign)
                clauses.append(f"{word}: {names or 'none'}")
            seed_only = [c for c in comparisons if c.q_seed < ALPHA and c.mean != 0 and not c.resolved()]
            if seed_only:
                clauses.append(
                    f"{title} resolved by the seeds but not by the evaluation sample: "
                    + ", ".join(f"{code(c.label)} ({c.mean:+.3f} ± {_se(c)})" for c in seed_only)
                )
        if tested:
            lines.append(
                f"- Against {code(reference)} (held-out loss, nats; paired by {paired_by(stats)}, t-test, and bootstrap"
                f" over the held-out chunks; Benjamini-Hochberg over {tested} method{'s' * (tested != 1)} per metric;"
                f" both q < {ALPHA}): " + "; ".join(clauses) + "."
            )
    lines += _evaluation_error(stats)
    lines += _span(stats, "forgetting", "Forgetting", "nats across methods")
    drift = stats.part.groupby("method")["CKA to base"].mean().dropna()
    if not drift.empty:
        lines.append(
            f"- Representation drift after the last stage: CKA to the base model from {drift.min():.3f}"
            f" ({code(drift.idxmin())}) to {drift.max():.3f} ({code(drift.idxmax())})."
        )
    return lines


def paired_by(stats: GroupStatistics) -> str:
    """What the group's comparisons pair: the seed, or (order, seed) where the group spans several domain orders."""
    return "(order, seed)" if stats.part["order"].nunique() > 1 else "seed"


def _runs(stats: GroupStatistics) -> str:
    return "(order, seed) runs" if paired_by(stats) != "seed" else "seeds"


def _spread_name(stats: GroupStatistics) -> str:
    # A multi-order part's spread mixes orders and seeds: name it so it is not read as seed noise alone.
    return "std over (order, seed) runs" if paired_by(stats) != "seed" else "seed std"


def _se(c: Comparison) -> str:
    return "?" if c.se_eval is None else f"{c.se_eval:.3f}"


def _evaluation_error(stats: GroupStatistics) -> list[str]:
    errors = stats.evaluation_errors([_column(title) for title, _ in VERDICT_METRICS])
    if not errors:
        return ["- The evaluation sample's own error is unknown for these records (made before per-chunk losses)."]
    return [
        f"- Evaluation sample: the standard error of a paired difference from a reference that the held-out sample"
        f" alone causes is {np.median(errors):.4f} nats at the median and {max(errors):.4f} at most (bootstrap over"
        " held-out chunks); intervals are ± the combined standard error of seeds and sample."
    ]


def _span(stats: GroupStatistics, column: str, name: str, unit: str) -> list[str]:
    spread = stats.part.groupby("method")[column].std(ddof=1).max()
    means = stats.part.groupby("method")[column].mean().dropna()
    if len(means) < 2 or np.isnan(spread):
        return []
    return [
        f"- {name} spans {means.min():.3f} ({code(means.idxmin())}) to {means.max():.3f} ({code(means.idxmax())})"
        f" {unit}; the largest {_spread_name(stats)} is {spread:.3f}."
    ]


def option_parents(label: str) -> list[str]:
    """The labels one option closer to the defaults: ``das[a=1,b=2]`` -> ``das[b=2]``, ``das[a=1]``; ``das[a=1]`` ->
    ``das`` (labels write options in one canonical order, so a parent is spelled as its own records label it)."""
    name, _, rest = label.partition("[")
    options = rest.removesuffix("]").split(",")
    parents = []
    for dropped in range(len(options)):
        kept = options[:dropped] + options[dropped + 1 :]
        parents.append(f"{name}[{','.join(kept)}]" if kept else name)
    return parents


def variant_reading(stats: GroupStatistics) -> list[str]:
    """Each option variant against every measured label one option closer to the method's defaults, paired by seed,
    on the held-out-loss metrics: what each option changes, everything else equal. The pairs of a group are read
    together, so their q-values are Benjamini-Hochberg over every pair of the group, per metric."""
    cells = _pair_family(stats, _variant_pairs(stats))
    return _family_lines(stats, cells, "Each option against its parent", "option pair")


def sibling_reading(stats: GroupStatistics) -> list[str]:
    """Two methods under the same options (``das[schedule.name=wsd]`` against ``ncl[schedule.name=wsd]``), paired by
    seed, on the held-out-loss metrics: whether a method's difference survives an option both share. Its own family
    of tests: q-values are Benjamini-Hochberg over every such pair of the group, per metric."""
    cells = _pair_family(stats, _sibling_pairs(stats))
    return _family_lines(stats, cells, "Methods under the same options", "method pair")


def _pair_family(stats: GroupStatistics, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], list]:
    """(label, reference) -> [(metric title, comparison)] for ``pairs``, the q-values corrected over all of them."""
    subsets = {(label, ref): stats.part[stats.part["method"].isin([ref, label])] for label, ref in pairs}
    cells: dict[tuple[str, str], list[tuple[str, Comparison]]] = {}
    for title, _ in VERDICT_METRICS:
        family = []
        for (label, ref), subset in subsets.items():
            for c in _pair(stats, subset, ref, _column(title)):
                cells.setdefault((label, ref), []).append((title, c))
                family.append(c)
        adjust_for_multiplicity(family)  # replaces each lone pair's q (compare's) by the family's
    return cells


def _family_lines(stats: GroupStatistics, cells: dict, name: str, unit: str) -> list[str]:
    if not cells:
        return []
    header = (
        f"- {name} (held-out loss, nats; paired by {paired_by(stats)}; Benjamini-Hochberg"
        f" over the {len(cells)} {unit}{'s' * (len(cells) != 1)} per metric; p and q of the t-test over"
        f" {_runs(stats)}, resolved when that q and the held-out bootstrap's q are both < {ALPHA}):"
    )
    return [header] + [
        f"  - {code(label)} against {code(ref)}: " + ", ".join(_variant_cell(title, c) for title, c in found) + "."
        for (label, ref), found in cells.items()
    ]


def _variant_pairs(stats: GroupStatistics) -> list[tuple[str, str]]:
    labels = set(stats.part["method"])
    return [
        (variant, parent)
        for variant in sorted(m for m in labels if "[" in m)
        for parent in option_parents(variant)
        if parent in labels
    ]


def _sibling_pairs(stats: GroupStatistics) -> list[tuple[str, str]]:
    """(label, reference) for every two labels with the same non-default options and different methods; the
    reference is the one whose method comes first among the group's references (``ncl``, ``das``, ``none``), else
    by name."""
    rank = {label: i for i, label in enumerate(stats.references.values())}
    by_options: dict[str, list[str]] = {}
    for label in sorted(m for m in set(stats.part["method"]) if "[" in m):
        by_options.setdefault(label.partition("[")[2], []).append(label)
    pairs = []
    for siblings in by_options.values():
        ordered = sorted(siblings, key=lambda label: (rank.get(label.partition("[")[0], len(rank)), label))
        pairs += [(label, ref) for i, ref in enumerate(ordered) for label in ordered[i + 1 :]]
    return pairs


def _variant_cell(title: str, c: Comparison) -> str:
    mark = "" if c.resolved() else " (not resolved)"
    return f"{title} {c.mean:+.3f} (p={c.p_seed:.2g}, q={c.q_seed:.2g}, eval SE {_se(c)}){mark}"


def _pair(stats: GroupStatistics, subset: pd.DataFrame, parent: str, column) -> list[Comparison]:
    from benchmark.report.statistics import compare

    return compare(subset, parent, column.title, stats.sample, column.metric)


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
            f"- Seed spread: the largest std of final macro-F1 over {_runs(stats)} is {std:.2f} points; the method"
            f" means span {means.max() - means.min():.2f} points."
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
    if records[0]["config"]["finetune"].get("protocol") == "linear_probe":
        lines.append(
            "- End tasks are scored by a linear probe on the frozen model's mean-pooled features: a base model whose"
            " pooled features suit the probe can lose probe accuracy to DAP's drift (CKA to base) even where the"
            " held-out losses show domain knowledge gained. Read the end-task table with the continual table."
        )
    return lines + mask_reading(records) + method_notes(records)


def _against_no_dap(stats: GroupStatistics, no_dap: str, means: pd.Series) -> list[str]:
    comparisons = stats.comparisons(no_dap, _column("final macro-F1"))
    dap = means.drop(no_dap)
    # The paired tests cover only rows of more than one seed; naming a one-seed row "best" beside verdicts it never
    # had would read as a result, so the best is taken among the rows compared below whenever there are any.
    tested = dap[dap.index.isin([c.label for c in comparisons])]
    untested = len(dap) - len(tested) if len(tested) else 0
    if untested:
        dap = tested
    above = [c for c in comparisons if c.resolved() and c.mean > 0]
    below = [c for c in comparisons if c.resolved() and c.mean < 0]

    which = " of more than one seed" if untested else ""
    return [
        f"- DAP vs no DAP: the best DAP method{which} ({code(dap.idxmax())}) is {dap.max() - means[no_dap]:+.2f}"
        f" points of final macro-F1 from {code(no_dap)}. Resolved by seeds (paired t-test) and test sample"
        f" (bootstrap over test examples) alike, q < {ALPHA}: above it {_points(above)}; below it {_points(below)};"
        f" the other {len(comparisons) - len(above) - len(below)} are not separated from no DAP."
        + (f" {untested} one-seed row(s) are neither ranked nor tested." if untested else "")
    ]


def _against_dap_references(stats: GroupStatistics) -> list[str]:
    """Final macro-F1 against each reference that trains the model (naive continual training, the paper's method),
    with the same two tests as against no DAP: a part without a no-DAP row (one over several domain orders) still
    gets its end-task differences tested, and every part says which methods beat NCL and DAS on end tasks."""
    lines = []
    for role, reference in stats.references.items():
        if role == "no_dap":
            continue
        comparisons = stats.comparisons(reference, _column("final macro-F1"))
        if not comparisons:
            continue
        above = [c for c in comparisons if c.resolved() and c.mean > 0]
        below = [c for c in comparisons if c.resolved() and c.mean < 0]
        lines.append(
            f"- Final macro-F1 against {code(reference)} (paired by {paired_by(stats)}; t-test over {_runs(stats)}"
            f" and bootstrap over test examples, Benjamini-Hochberg over {len(comparisons)}"
            f" method{'s' * (len(comparisons) != 1)}, both q < {ALPHA}): above it {_points(above)}; below it"
            f" {_points(below)}; the other {len(comparisons) - len(above) - len(below)} are not separated from it."
        )
    return lines


def _points(found: list[Comparison]) -> str:
    return ", ".join(f"{code(c.label)} ({100 * c.mean:+.2f})" for c in found) or "none"


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
