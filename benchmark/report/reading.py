"""The leaderboard's reading: sentences generated from a group's numbers (never written by hand), each saying what
the seeds and the evaluation sample resolve and what they do not."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmark.report.escape import code
from benchmark.report.frame import END_TASK_COLUMNS, VERDICT_METRICS, loss_columns
from benchmark.report.statistics import ALPHA, Comparison, GroupStatistics, adjust_for_multiplicity

WORDS = {
    "forgetting": ("less forgetting", "more forgetting"),
    "general rise": ("a smaller general-loss rise", "a larger general-loss rise"),
    "plasticity": ("less plasticity", "more plasticity"),
}


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
    lines = []
    for reference in stats.references.values():
        clauses, tested = [], 0
        for title, _ in VERDICT_METRICS:
            comparisons = stats.comparisons(reference, column_of(title))
            tested = max(tested, len(comparisons))
            resolved = [c for c in comparisons if c.resolved()]
            for sign, word in zip((-1, 1), WORDS[title], strict=True):
                names = ", ".join(f"{code(c.label)} ({c.mean:+.3f})" for c in resolved if np.sign(c.mean) == sign)
                clauses.append(f"{word}: {names or 'none'}")
            ties = [c for c in comparisons if not c.resolved()]
            if ties:
                clauses.append(f"{title} not separated: {len(ties)} ({tie_bound(ties, '.3f')})")
        if tested:
            lines.append(
                f"- Against {code(reference)} (held-out loss, nats; paired by {paired_by(stats)}; t-test whose standard"
                f" error adds the held-out sample's bootstrap error to the seeds'; Benjamini-Hochberg over {tested}"
                f" method{'s' * (tested != 1)} per metric, q < {ALPHA}): " + "; ".join(clauses) + "."
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


def paired_runs(stats: GroupStatistics) -> str:
    """What a group's paired tests run over, in words: seeds, or (order, seed) runs."""
    return "(order, seed) runs" if paired_by(stats) != "seed" else "seeds"


def _spread_name(stats: GroupStatistics) -> str:
    # A multi-order part's spread mixes orders and seeds: name it so it is not read as seed noise alone.
    return "std over (order, seed) runs" if paired_by(stats) != "seed" else "seed std"


def tie_bound(ties: list[Comparison], fmt: str, scale: float = 1.0) -> str:
    """What the ties of a family could have resolved: the smallest difference each test finds with 80% power, as a
    range over the tied rows (``equal within X`` where X is small, ``too few seeds`` where it is large)."""
    bounds = [c.resolvable() * scale for c in ties]
    low, high = min(bounds), max(bounds)
    span = f"{low:{fmt}}" if f"{low:{fmt}}" == f"{high:{fmt}}" else f"{low:{fmt}}-{high:{fmt}}"
    return f"their seeds resolve differences of {span} with 80% power"


def _se(c: Comparison) -> str:
    return "?" if c.se_eval is None else f"{c.se_eval:.3f}"


def _evaluation_error(stats: GroupStatistics) -> list[str]:
    errors = stats.evaluation_errors([column_of(title) for title, _ in VERDICT_METRICS])
    if not errors and stats.part["method"].nunique() < 2:
        return ["- The group holds one row: there is no paired difference to put an evaluation-sample error on."]
    if not errors and all(r["lm_loss"].get("chunks") for r in stats.records):
        return [
            "- No row shares two seeds with a reference yet: there is no paired difference to put an"
            " evaluation-sample error on."
        ]
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
            for c in _pair(stats, subset, ref, column_of(title)):
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
        f" {paired_runs(stats)} with the held-out sample's bootstrap error added, resolved when q < {ALPHA}):"
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
    return f"{title} {c.mean:+.3f} (p={c.p:.2g}, q={c.q:.2g}, eval SE {_se(c)}){mark}"


def _pair(stats: GroupStatistics, subset: pd.DataFrame, parent: str, column) -> list[Comparison]:
    from benchmark.report.statistics import compare

    return compare(subset, parent, column.title, stats.sample, column.metric)
