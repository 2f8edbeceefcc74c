"""Leaderboard plots of one group of records (same profile, model and sequence): A[t][k] per method,
forgetting with seed spread, held-out loss (MLM or next-token) after each domain and while each domain trains (the
stability gap), and DAS's accumulated importance per layer and unit."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmark.io import atomic_write_bytes
from benchmark.report.frame import (
    by_label,
    loss_unit,
    mean_over_seeds,
    mean_score_matrix,
    method_colours,
    reference_labels,
)
from benchmark.report.ladder import LadderReading, budget_band, budget_series, ladder_columns
from benchmark.report.stability_gap import PANELS, curve_chart
from benchmark.report.words import say

PLOTS = "plots.txt.j2"
"""The template that holds the plots' titles, axis labels and legends."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    if fig.get_layout_engine() is None:  # a figure laid out as it is drawn (constrained) keeps its own layout
        fig.tight_layout()
    atomic_write_bytes(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight"))
    _pyplot().close(fig)
    return path


def _references(records: list[dict]) -> dict[str, str]:
    """Reference label -> its role (naive continual, proposed, no DAP), in the leaderboard's order of roles."""
    return {label: role for role, label in reference_labels(records).items()}


def plot_matrices(records: list[dict], path: Path, colours: dict[str, str] | None = None) -> Path | None:
    """End-task scores at a glance: the final macro-F1 of every method on every end task (one row per method, the
    reference rows first), and the full A[t][k] of each reference row (mean over seeds; blank = not computed)."""
    groups = by_label(records)
    if not groups:
        return None
    first = next(iter(groups.values()))[0]
    tasks, domains = first["end_tasks"], first["sequence"]
    references = _references(records)
    order = [label for label in references if label in groups] + [g for g in groups if g not in references]
    plt = _pyplot()
    height = max(0.32 * len(order) + 1.8, 2.6 * max(1, len(references)))
    fig = plt.figure(figsize=(6.5 + 0.6 * len(tasks), height))
    grid = fig.add_gridspec(max(1, len(references)), 2, width_ratios=[1, 1])
    final = np.array([_final_scores(groups[label]) for label in order])
    title = say(PLOTS, "end_task_title")
    _heatmap(fig.add_subplot(grid[:, 0]), final, tasks, order, title)
    _mark_references(fig.axes[0], order, references, colours or method_colours(order))
    for i, label in enumerate(label for label in references if label in groups):
        ax = fig.add_subplot(grid[i, 1])
        _heatmap(ax, mean_score_matrix(groups[label], "macro_f1"), tasks, [f"after {d}" for d in domains], "")
        ax.set_title(say(PLOTS, "reference_matrix", label, references[label]), fontsize=9)
    fig.suptitle(say(PLOTS, "end_tasks_suptitle", len(first["end_tasks"])), fontsize=10)
    return _save(fig, path)


def _final_scores(runs: list[dict]) -> np.ndarray:
    """Each end task's final macro-F1 as the end-task table counts it: after the last domain, or for a method with
    one model per domain, that domain's own model (the diagonal)."""
    matrix = mean_score_matrix(runs, "macro_f1")
    return np.diag(matrix) if runs[0].get("capabilities", {}).get("independent_per_domain") else matrix[-1]


def _heatmap(ax, values: np.ndarray, columns: list[str], rows: list[str], title: str) -> None:
    """A matrix with its numbers written in (white on dark cells, black on light ones) and readable tick labels."""
    image = ax.imshow(values, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    for (t, k), value in np.ndenumerate(values):
        if not np.isnan(value):
            light = image.norm(value) > 0.6
            ax.text(k, t, f"{value:.0f}", ha="center", va="center", color="k" if light else "w", fontsize=8)
    ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)


def _mark_references(ax, labels: list[str], references: dict[str, str], colours: dict[str, str]) -> None:
    """One y tick per label (row ``i`` is ``labels[i]``), each in its method's colour; reference rows bold, starred."""
    ax.set_yticks(range(len(labels)), [f"★ {label}" if label in references else label for label in labels], fontsize=8)
    for tick, label in zip(ax.get_yticklabels(), labels, strict=True):
        tick.set_color(colours.get(label, "k"))
        tick.set_fontweight("bold" if label in references else "normal")


def plot_forgetting(records: list[dict], path: Path, colours: dict[str, str] | None = None) -> Path | None:
    """Forgetting per method, the held-out loss's (nats, as the tables lead with) beside the end tasks' (macro-F1
    points): a bar at the mean over seeds, a dot per seed, methods sorted by the first; methods that forget by
    construction nothing (one model per domain, joint training) are left out and named."""
    groups = by_label(records)
    kept = {label: runs for label, runs in groups.items() if all(_forgetting(r) is not None for r in runs)}
    if not kept:
        return None
    colours = colours or method_colours(list(groups))
    references = _references(records)
    order = sorted(kept, key=lambda label: np.mean([_forgetting(r) for r in kept[label]]))
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.3 * len(order) + 2.0), sharey=True)
    panels = (
        (_forgetting, say(PLOTS, "heldout_forgetting")),
        (_end_task_forgetting, say(PLOTS, "end_task_forgetting")),
    )
    for ax, (value, title) in zip(axes, panels, strict=True):
        for i, label in enumerate(order):
            values = [v for v in (value(r) for r in kept[label]) if v is not None]
            if values:
                edge = "k" if label in references else "none"
                ax.barh(i, np.mean(values), color=colours[label], alpha=0.55, edgecolor=edge, lw=1.5)
                ax.scatter(values, [i] * len(values), color=colours[label], s=14, zorder=3)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_title(title, fontsize=9)
    _mark_references(axes[0], order, references, colours)
    axes[0].invert_yaxis()  # least forgetting on top
    left_out = sorted(set(groups) - set(kept))
    fig.suptitle(say(PLOTS, "forgetting_suptitle", left_out), fontsize=9)
    return _save(fig, path)


def _forgetting(record: dict) -> float | None:
    return record["lm_loss"]["metrics"].get("forgetting")


def _end_task_forgetting(record: dict) -> float | None:
    value = (record["summary"].get("macro_f1") or {}).get("forgetting")
    return None if value is None else 100 * value


def _small_multiples(records: list[dict], labels: list[str], most_columns: int, panel: tuple[float, float]):
    """A grid of panels with shared axes, one per row of ``labels`` (the reference rows first), unused panels off:
    the figure, its axes, ``(label, panel)`` in order, the reference rows by role, and the naive continual one."""
    references = _references(records)
    naive = next((label for label, role in references.items() if role == "naive_continual"), None)
    order = [label for label in references if label in labels] + [label for label in labels if label not in references]
    ncols = min(most_columns, len(order))
    nrows = -(-len(order) // ncols)
    fig, axes = _pyplot().subplots(
        nrows,
        ncols,
        figsize=(panel[0] * ncols, panel[1] * nrows + 0.8),
        sharex=True,
        sharey=True,
        squeeze=False,
        layout="constrained",  # keeps the figure's title clear of the top row (under tight_layout they overlapped)
    )
    for ax in list(axes.flat)[len(order) :]:
        ax.axis("off")
    return fig, axes, list(zip(order, axes.flat, strict=False)), references, naive


def _panel_title(ax, label: str, reference: bool, suffix: str = "") -> None:
    """A panel's row label (starred and bold for a reference row), wrapped: an option row's label can be long."""
    title = f"{label}{' ★' if reference else ''}{suffix}"
    ax.set_title(textwrap.fill(title, 30 + len(suffix) // 2), fontsize=8, fontweight="bold" if reference else "normal")


def plot_heldout_losses(records: list[dict], path: Path, colours: dict[str, str] | None = None) -> Path | None:
    """Small multiples, one panel per method (shared axes): its held-out loss averaged over the domains' sets
    (solid) and on general text (dashed) before DAP and after each domain, with the naive continual reference's
    two lines in grey behind for comparison (the full matrices are on the site and in each run's table)."""
    groups = {label: runs for label, runs in by_label(records).items() if runs[0]["lm_loss"]["after_domain"]}
    if not groups:
        return None
    first = next(iter(groups.values()))[0]
    domains = first["sequence"]
    colours = colours or method_colours(list(groups))
    fig, _, panels, references, naive = _small_multiples(records, list(groups), 6, (2.6, 2.3))
    x = range(len(domains) + 1)
    for label, ax in panels:
        if naive in groups and label != naive:
            for curve, style in zip(_summary_curves(groups[naive], domains), ("-", "--"), strict=False):
                ax.plot(x, curve, color="0.75", ls=style, lw=1.2)
        for curve, style in zip(_summary_curves(groups[label], domains), ("-", "--"), strict=False):
            ax.plot(
                x, curve, color=colours[label], ls=style, lw=2.2 if label in references else 1.6, marker="o", ms=2.5
            )
        _panel_title(ax, label, label in references)
        ax.set_xticks(list(x), ["base", *domains], rotation=60, ha="right", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(say(PLOTS, "heldout_suptitle", loss_unit(first), naive), fontsize=9)
    return _save(fig, path)


def _summary_curves(runs: list[dict], domains: list[str]) -> list[np.ndarray]:
    """Mean over seeds of the loss averaged over the domains' held-out sets per stage, then (where measured) of the
    general loss."""
    curves = [np.mean([_mean_loss_curve(runs, column) for column in domains], axis=0)]
    if "general" in runs[0]["lm_loss"]["columns"]:
        curves.append(np.asarray(_mean_loss_curve(runs, "general")))
    return curves


def _mean_loss_curve(runs: list[dict], column: str) -> list[float]:
    def value(row: dict | None) -> float:
        return np.nan if row is None else row[column]

    # A point that is empty for every seed (joint training's earlier domains) stays NaN.
    curves = [[r["lm_loss"]["base"][column], *map(value, r["lm_loss"]["after_domain"])] for r in runs]
    return list(mean_over_seeds(curves))


def plot_importance(records: list[dict], path: Path, colours: dict[str, str] | None = None) -> Path | None:
    """DAS-family methods: mean accumulated importance per layer and unit type after the last domain."""
    reports = {
        label: [r["domains"][-1]["method_report"]["importance"] for r in runs]
        for label, runs in by_label(records).items()
        if runs[0]["domains"] and "importance" in runs[0]["domains"][-1].get("method_report", {})
    }
    if not reports:
        return None
    plt = _pyplot()
    # The union of unit types, in first-seen order: DGA reports heads only, DAS heads and FFN neurons.
    units = list(dict.fromkeys(unit for seeds in reports.values() for unit in seeds[0]))
    fig, axes = plt.subplots(1, len(units), figsize=(4.5 * len(units), 3.5), squeeze=False)
    width = 0.8 / len(reports)
    for ax, unit in zip(axes.flat, units, strict=True):
        for i, (label, seeds) in enumerate(reports.items()):
            per_seed = [s[unit]["mean_per_layer"] for s in seeds if unit in s]
            if per_seed:
                means = np.mean(per_seed, axis=0)
                colour = (colours or method_colours(list(reports)))[label]
                ax.bar(np.arange(len(means)) + i * width, means, width, label=label, color=colour)
        ax.set_title(say(PLOTS, "importance_title", unit), fontsize=9)
        ax.set_xlabel("layer")
        ax.set_ylim(0, 1)
    _legend_outside(fig, axes.flat[0])
    return _save(fig, path)


def _legend_outside(fig, ax) -> None:
    """One legend for the figure, right of its panels, so that it covers no data (each method's colour once)."""
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    fig.legend(unique.values(), unique.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)


def plot_stability_plasticity(records: list[dict], path: Path, colours: dict[str, str] | None = None) -> Path | None:
    """Held-out loss: plasticity (x) against forgetting (y) per method, the mean over seeds with seed-std bars,
    every point named beside it and the reference rows as outlined stars. Axes cover the bulk of the points; a point
    beyond them (an outlier: far outside the reference rows' range) is drawn at the edge as an arrow with its value.
    Methods without forgetting are left out."""
    points = {}
    for label, runs in by_label(records).items():
        metrics = [r["lm_loss"]["metrics"] for r in runs]
        if any(m["plasticity"] is None or m["forgetting"] is None for m in metrics):
            continue
        points[label] = {key: np.array([m[key] for m in metrics], dtype=float) for key in ("plasticity", "forgetting")}
    if not points:
        return None
    colours = colours or method_colours(list(points))
    references = _references(records)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 6.5))
    xs = {label: v["plasticity"].mean() for label, v in points.items()}
    ys = {label: v["forgetting"].mean() for label, v in points.items()}
    anchors = [label for label in references if label in points]
    xlim = _bulk_limits(list(xs.values()), [xs[label] for label in anchors])
    ylim = _bulk_limits(list(ys.values()), [ys[label] for label in anchors])
    for label, v in points.items():
        _draw_point(ax, label, v, (xlim, ylim), colours[label], label in references)
    _draw_curves(ax, records, xs, ys, colours)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axhline(0, color="grey", lw=0.6)
    ax.axvline(0, color="grey", lw=0.6)
    ax.set_xlabel(say(PLOTS, "plasticity_axis"))
    ax.set_ylabel(say(PLOTS, "forgetting_axis"))
    ax.set_title(say(PLOTS, "stability_title"), fontsize=9)
    return _save(fig, path)


def _draw_curves(ax, records: list[dict], xs: dict, ys: dict, colours: dict[str, str]) -> None:
    """Each strength family's stability-plasticity curve (:func:`benchmark.report.matched.families`): a dashed line
    through its rows' mean points in plasticity order, in the colour of the method at its defaults."""
    from benchmark.report.matched import families

    for family in families(records):
        labels = [label for _, label in family.rows if label in xs]
        if len(labels) >= 2:
            ordered = sorted(labels, key=xs.get)
            colour = colours.get(family.method, "grey")
            ax.plot([xs[lab] for lab in ordered], [ys[lab] for lab in ordered], ls="--", lw=0.9, color=colour)


def _draw_point(ax, label: str, seeds: dict, limits: tuple, colour: str, reference: bool) -> None:
    """One method's mean point with seed-std bars and its name; beyond ``limits`` (an outlier) an arrow at the edge
    pointing its way, named with its value; a reference row as a large outlined star, named in bold."""
    x, y = seeds["plasticity"].mean(), seeds["forgetting"].mean()
    (xlim, ylim) = limits
    cx, cy = np.clip(x, *xlim), np.clip(y, *ylim)
    clipped = (cx, cy) != (x, y)
    if not clipped:
        std = {"xerr": _seed_std(seeds["plasticity"]), "yerr": _seed_std(seeds["forgetting"])}
        ax.errorbar(x, y, **std, fmt="none", ecolor=colour, lw=0.8, alpha=0.7)
    marker = _edge_marker(x, y, xlim, ylim) if clipped else ("*" if reference else "o")
    edge = {"edgecolors": "k" if reference else "none", "linewidths": 1.2}
    ax.scatter(cx, cy, s=220 if reference else 45, marker=marker, color=colour, zorder=3, **edge)
    name = (f"★ {label}" if reference else label) + (f" (x={x:.2f}, y={y:.2f})" if clipped else "")
    text = {"fontsize": 9 if reference else 7, "fontweight": "bold" if reference else "normal"}
    ax.annotate(name, (cx, cy), xytext=(5, 4), textcoords="offset points", color="k" if reference else colour, **text)


def _bulk_limits(values: list[float], anchors: list[float]) -> tuple[float, float]:
    """Axis limits that hold every value within the range of ``anchors`` (the reference rows') widened by that range
    on each side, with a small margin: a value beyond it is an outlier, drawn at the edge, so it cannot collapse the
    rest. Without anchors every value is held."""
    values = np.asarray(values, dtype=float)
    if anchors:
        low, high = min(anchors), max(anchors)
        width = max(high - low, 1e-3)
        values = values[(values >= low - width) & (values <= high + width)]
    low, high = float(values.min()), float(values.max())
    margin = 0.06 * max(high - low, 1e-3)
    return low - margin, high + margin


def _edge_marker(x: float, y: float, xlim: tuple, ylim: tuple) -> str:
    """The arrow marker pointing towards a point beyond the axes."""
    if x < xlim[0]:
        return "<"
    if x > xlim[1]:
        return ">"
    return "v" if y < ylim[0] else "^"


def _seed_std(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if len(values) > 1 else 0.0


def plot_mask_damping(records: list[dict], path: Path, colours: dict[str, str] | None = None) -> Path | None:
    """Soft-masking methods: the measured damping per importance bin (|update| relative to the unmasked update of
    the same units, mean over domains and seeds), then one panel per unit type with the importance histogram of the
    mask in force during the last domain; a line per method in its colour, one legend outside the panels."""
    masks = {
        label: [d["method_report"]["mask"] for r in runs for d in r["domains"] if "mask" in d.get("method_report", {})]
        for label, runs in by_label(records).items()
    }
    masks = {label: m for label, m in masks.items() if m}
    if not masks:
        return None
    colours = colours or method_colours(list(masks))
    units = list(dict.fromkeys(unit for reports in masks.values() for unit in reports[-1]["importance_histogram"]))
    plt = _pyplot()
    fig, axes = plt.subplots(1, 1 + len(units), figsize=(4.2 * (1 + len(units)), 3.8), squeeze=False)
    left, panels = axes.flat[0], list(axes.flat[1:])
    bins = len(next(iter(masks.values()))[0]["damping_per_bin"])
    centres = (np.arange(bins) + 0.5) / bins
    left.plot([0, 1], [1, 0], color="grey", ls="--", lw=0.8, label=say(PLOTS, "exact_scaling"))
    for label, reports in masks.items():
        per_bin = [[np.nan if v is None else v for v in m["damping_per_bin"]] for m in reports]
        left.plot(centres, mean_over_seeds(per_bin), marker="o", ms=3, label=label, color=colours[label])
        for ax, unit in zip(panels, units, strict=True):
            counts = reports[-1]["importance_histogram"].get(unit)
            if counts:
                share = np.asarray(counts, dtype=float) / max(sum(counts), 1)
                ax.plot(centres, share, marker=".", color=colours[label])
    left.set(xlabel=say(PLOTS, "importance_axis"), ylabel=say(PLOTS, "damping_axis"))
    left.set_ylim(-0.05, 1.1)
    left.set_title(say(PLOTS, "damping_title"), fontsize=9)
    for ax, unit in zip(panels, units, strict=True):
        ax.set(xlabel=say(PLOTS, "histogram_axis"), ylabel="share of units")
        ax.set_title(say(PLOTS, "histogram_title", unit), fontsize=9)
    _legend_outside(fig, left)
    return _save(fig, path)


def plot_continual(records: list[dict], path: Path, colours: dict[str, str] | None = None) -> Path | None:
    """The stability gap drawn (issue #90): small multiples, one panel per row that measured continual evaluation
    (``dap.eval_every``), its mean over seeds of the earlier domains' held-out loss (solid) and the general text's
    (dashed) at every measured update, a gap between domains; the naive continual reference's two lines in grey
    behind. The same seed means as the site's chart (:func:`benchmark.report.stability_gap.curve_chart`)."""
    chart = curve_chart(records)
    if not chart or not chart["rows"]:
        return None
    rows = chart["rows"]
    colours = colours or method_colours(list(rows))
    fig, axes, panels, references, naive = _small_multiples(records, list(rows), 4, (3.2, 2.4))
    for label, ax in panels:
        behind = [(rows[naive], "0.75", 1.0)] if naive in rows and label != naive else []
        for row, colour, width in [*behind, (rows[label], colours[label], 1.6)]:
            for part, style in zip(PANELS, ("-", "--"), strict=True):
                # a gap between domains is None: as a float, NaN, which matplotlib leaves undrawn
                ax.plot(
                    np.asarray(row["x"], dtype=float),
                    np.asarray(row[part], dtype=float),
                    color=colour,
                    ls=style,
                    lw=width,
                )
        _panel_title(ax, label, label in references, f" ({say('common.md.j2', 'seeds', (rows[label]['seeds'],))})")
        ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel(say(PLOTS, "continual_axis"), fontsize=8)
    title = say(PLOTS, "continual_suptitle", loss_unit(records[0]), naive)
    fig.suptitle(textwrap.fill(title, 40 * axes.shape[1]), fontsize=9)
    return _save(fig, path)


GROUP_PLOTS: dict[str, Callable[[list[dict], Path, dict[str, str] | None], Path | None]] = {
    "stability-plasticity": plot_stability_plasticity,
    "damping": plot_mask_damping,
    "matrices": plot_matrices,
    "forgetting": plot_forgetting,
    "heldout-loss": plot_heldout_losses,
    "continual": plot_continual,
    "importance": plot_importance,
}


def plot_ladder(reading: LadderReading, path, colours: dict[str, str] | None = None) -> object:
    """Each metric against the budget (tokens per domain, log scale), one small panel per metric, a line per row;
    the reference rows (no DAP, naive continual, the proposed method) drawn in colour with their 95% bootstrap band
    (:func:`benchmark.report.ladder.budget_band`), the others in grey; a row's point at a budget that did not train
    it is a mark off its line (:func:`benchmark.report.ladder.budget_series`)."""
    plt = _pyplot()
    tokens = [r.tokens_per_domain for r in reading.ladder.rungs]
    references = set(reading.ladder.references.values())
    ncols = 3
    columns = ladder_columns()
    nrows = -(-len(columns) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows), squeeze=False)
    for ax, column in zip(axes.flat, columns, strict=False):
        scale = 100.0 if column.kind == "pct" else 1.0
        for label, means in sorted(reading.means[column.title].items(), key=lambda item: item[0] in references):
            ys, flagged = budget_series(reading.ladder, label, means, scale)
            style = {"lw": 2.2, "marker": "o", "label": label, "color": (colours or {}).get(label)}
            # grey rows keep a small marker: a row trained at one rung only has no segment to draw
            style = style if label in references else {"lw": 0.8, "marker": "o", "ms": 2.5, "color": "0.65"}
            ax.plot(tokens, ys, **style)
            if label in references:  # the reference rows' 95% bootstrap band: how far apart rows must be to differ
                low, high = budget_band(reading, column, label, scale)
                ax.fill_between(tokens, low, high, color=ax.lines[-1].get_color(), alpha=0.15, lw=0)
            if flagged:
                xs, marks = zip(*flagged, strict=True)
                ax.scatter(xs, marks, marker="x", s=22, color="0.35", zorder=3, label=say(PLOTS, "untrained_mark"))
        ax.set_xscale("log")
        ax.minorticks_off()  # log-scale minor labels (3x10^4, 4x10^4, ...) overlap; the rungs are the ticks
        ax.set_xticks(tokens, [f"{t / 1000:,.0f}K" for t in tokens])
        ax.set_title(f"{column.title} ({'higher' if column.higher_is_better else 'lower'} is better)", fontsize=9)
        ax.set_xlabel(say(PLOTS, "tokens_axis"), fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(columns) :]:
        ax.axis("off")
    legend: dict[str, object] = {}
    for ax in axes.flat:  # one entry per name: the untrained mark may be drawn on a panel without reference rows
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(name, handle)
    if legend:
        fig.legend(legend.values(), legend.keys(), loc="lower right", fontsize=8, title=say(PLOTS, "references_legend"))
    return _save(fig, path)
