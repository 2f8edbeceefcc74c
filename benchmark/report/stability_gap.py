"""The stability gap in a group's leaderboard section and site page (issue #90): for every row whose records measured
continual evaluation (``dap.eval_every``), how deep the earlier domains' and the general held-out loss dipped during
each domain, how much of the dips the domains won back and in how many updates half of a dip was
(:func:`benchmark.metrics.stability_gap`); each row's depth against the naive continual reference through the
calibrated comparison (paired by seed and order, Benjamini-Hochberg over the rows per measure), and whether those
verdicts agree with, or reverse, the end-of-run verdicts on the same sets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from benchmark.metrics import stability_gap
from benchmark.report.comparison import benjamini_hochberg, paired_test
from benchmark.report.reading import column_of
from benchmark.report.words import say, say_lines

TEMPLATE = "stability_gap.md.j2"
"""The template that holds the section's words."""

MEASURES = {"earlier_depth": "earlier domains", "general_depth": "general text"}
"""The depths read, by what they are the depth of."""

ENDS = {"earlier_depth": "forgetting", "general_depth": "general rise"}
"""The end-of-domain metric each depth is read beside: what a run that finished the domain shows of the same sets."""


def _depths(records: list[dict]) -> dict[str, dict[tuple, dict[str, float]]]:
    """Label -> (seed, order) -> its depths, for the records with curves."""
    out: dict[str, dict[tuple, dict[str, float]]] = {}
    for record in records:
        gap = stability_gap(record)
        if gap is not None:
            key = (record["seed"], tuple(record["sequence"]))
            out.setdefault(record["method_label"], {})[key] = gap
    return out


def _part_cells(gaps, measure: str) -> dict:
    """One part's table cells over a row's runs (``measure``: ``{part}_depth``), means over the runs: the depth, the
    share of the dips won back by their domains' ends, the updates to win back half of a dip (over the runs where
    one did), and how many of the runs' dips never did (:func:`benchmark.metrics.stability_gap`)."""
    part = measure.removesuffix("_depth")
    gaps = [gap for gap in gaps if measure in gap]

    def mean(key: str) -> float | None:
        values = [gap[key] for gap in gaps if gap.get(key) is not None]
        return float(np.mean(values)) if values else None

    return {
        "depth": mean(measure),
        "won_back": mean(f"{part}_won_back"),
        "updates": mean(f"{part}_half_recovery_updates"),
        "unrecovered": sum(gap[f"{part}_unrecovered"] for gap in gaps),
    }


def stability_gap_markdown(
    records: list[dict], reference: str | None, at_the_end: Mapping[str, Sequence] | None = None
) -> list[str]:
    """The group's stability-gap lines (none where no record measured curves). ``at_the_end``: the group's
    comparisons with ``reference`` on the end-of-domain metrics (:data:`ENDS`'s values -> objects with ``label``,
    ``mean`` and ``resolved()``), to say whether the gap reorders a verdict they state."""
    depths = _depths(records)
    if not depths:
        return []
    lines = say_lines(TEMPLATE, "intro", list(MEASURES.values()))
    for label, runs in sorted(depths.items()):
        lines.append(say(TEMPLATE, "row", label, len(runs), [_part_cells(runs.values(), m) for m in MEASURES]))
    cost = evaluation_cost(records)
    lines += ["", say(TEMPLATE, "cost", cost)] if cost else []
    found = depth_verdicts(depths, reference)
    lines += ["", *(say(TEMPLATE, "verdicts", reference, MEASURES[m], rows) for m, rows in found.items())]
    if found and at_the_end:
        lines += [say(TEMPLATE, "reordering", reference, _reorderings(found, at_the_end))]
    return [*lines, ""]


def evaluation_cost(records: list[dict]) -> dict | None:
    """What the continual evaluation cost the group's runs with curves: its seconds as a share of each run's wall
    time (the lowest and highest share, over the runs whose own timing holds the DAP phase that measured the curves: a
    re-scored record's time is its end tasks'), with the ``dap.eval_every`` and ``dap.eval_chunks`` they used; None
    where no such run."""
    shares, settings = [], set()
    for record in records:
        seconds = sum(domain["curve"]["seconds"] for domain in record["domains"] if domain.get("curve"))
        timing = record["timing"]
        if seconds and timing.get("phase_seconds", {}).get("dap", 0.0) >= seconds and timing["wall_seconds"] > 0:
            shares.append(seconds / timing["wall_seconds"])
            dap = record["config"]["dap"]
            settings.add((dap["eval_every"], dap["eval_chunks"]))
    if not shares:
        return None
    return {"low": min(shares), "high": max(shares), "runs": len(shares), "settings": sorted(settings)}


def group_stability_gap(stats) -> list[str]:
    """A group's stability-gap lines (:func:`stability_gap_markdown`) against its naive continual reference, with that
    reference's end-of-run comparisons (``stats``: the group's
    :class:`~benchmark.report.statistics.GroupStatistics`); the leaderboard and the site show the same lines, derived
    once per group."""
    return list(stats.derived("stability_gap", lambda: _group_lines(stats)))  # a copy: callers may extend it


def _group_lines(stats) -> list[str]:
    naive = stats.references.get("naive_continual")
    at_the_end = {metric: stats.comparisons(naive, column_of(metric)) for metric in ENDS.values()} if naive else None
    return stability_gap_markdown(stats.records, naive, at_the_end)


def depth_verdicts(depths: dict, reference: str | None) -> dict[str, list[tuple]]:
    """Per measure, each row's depth against the reference's, paired by seed and order, as (label, test, resolved):
    q < 0.05 after Benjamini-Hochberg over the rows of one measure."""
    if reference not in depths:
        return {}
    out = {}
    for measure in MEASURES:
        tests = {}
        for label, runs in sorted(depths.items()):
            if label == reference:
                continue
            theirs = depths[reference]
            shared = [key for key in runs if measure in runs[key] and measure in theirs.get(key, {})]
            found = paired_test(np.array([runs[k][measure] - theirs[k][measure] for k in shared]))
            if found is not None:
                tests[label] = found
        if tests:
            qs = dict(zip(tests, benjamini_hochberg([t.p for t in tests.values()]), strict=True))
            out[measure] = [(label, test, qs[label] < 0.05) for label, test in tests.items()]
    return out


def _reorderings(found: dict[str, list[tuple]], at_the_end: Mapping[str, Sequence]) -> list[tuple]:
    """Per measure, the rows tested both ways grouped by how the two verdicts against the reference relate:
    (the depth's measure, the end-of-domain metric, {relation: [labels]}) with relations ``same`` (both resolved, one
    direction), ``reversed`` (both resolved, opposite directions: the gap reorders the verdict), ``end only`` and
    ``during only`` (one resolved), ``neither``."""
    out = []
    for measure, rows in found.items():
        end = {c.label: c for c in at_the_end.get(ENDS[measure], ())}
        relations: dict[str, list[str]] = {"same": [], "reversed": [], "end only": [], "during only": [], "neither": []}
        for label, test, resolved in rows:
            if label not in end:
                continue
            during = np.sign(test.mean) if resolved else 0
            after = np.sign(end[label].mean) if end[label].resolved() else 0
            relations[_relation(during, after)].append(label)
        out.append((MEASURES[measure], ENDS[measure], relations))
    return out


def _relation(during: float, after: float) -> str:
    """How a depth verdict (``during``: its resolved sign, 0 for a tie) relates to the end-of-domain one."""
    if during and after:
        return "same" if during == after else "reversed"
    return "end only" if after else "during only" if during else "neither"


PANELS = {"earlier": "earlier domains (mean)", "general": "general text"}
"""The continual-evaluation chart's panels: the held-out sets whose loss a later domain's training can raise."""


def curve_chart(records: list[dict]) -> dict | None:
    """The group page's continual-evaluation chart (None where no record measured curves): per row, the mean over its
    seeds of each panel's held-out loss at every measured update, on one axis of updates since the first domain
    (a gap between domains, where the earlier domains' set grows by one)."""
    by_label: dict[str, list[dict]] = {}
    for record in records:
        if any(domain.get("curve") for domain in record["domains"]):
            by_label.setdefault(record["method_label"], []).append(record)
    if not by_label:
        return None
    rows = {label: _mean_curves(runs) for label, runs in sorted(by_label.items())}
    return {"panels": PANELS, "rows": {label: row for label, row in rows.items() if row is not None}}


def _mean_curves(runs: list[dict]) -> dict | None:
    """One row's curves: x (updates since the first domain, None between domains) and each panel's seed mean."""
    per_run = [_run_curves(record) for record in runs]
    grids = {tuple(x) for x, _ in per_run}
    if len(grids) != 1:  # runs of one row measured at other updates: no mean is drawn
        return None
    x = list(per_run[0][0])
    out: dict = {"x": x, "seeds": len(runs)}
    for part in PANELS:
        columns = [values[part] for _, values in per_run]
        out[part] = [
            None if any(c[i] is None for c in columns) else round(float(np.mean([c[i] for c in columns])), 5)
            for i in range(len(x))
        ]
    return out


def _run_curves(record: dict) -> tuple[list, dict[str, list]]:
    """A run's curve points on one axis: each stage's measured updates offset by the updates before it."""
    x: list = []
    values: dict[str, list] = {part: [] for part in PANELS}
    offset = 0
    for t, domain in enumerate(record["domains"]):
        curve = domain.get("curve")
        if not curve:
            continue
        earlier = [name for name in record["sequence"][:t] if name in curve["losses"]]
        if x:
            x.append(None)  # a gap between domains
            for part in PANELS:
                values[part].append(None)
        for i, step in enumerate(curve["steps"]):
            x.append(offset + step)
            mean = float(np.mean([curve["losses"][n][i] for n in earlier])) if earlier else None
            values["earlier"].append(mean)
            values["general"].append(curve["losses"]["general"][i] if "general" in curve["losses"] else None)
        offset += curve["steps"][-1]
    return x, values
