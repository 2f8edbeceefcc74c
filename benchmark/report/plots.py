"""Leaderboard plots of one group of records (same profile, model and sequence): A[t][k] per method,
forgetting with seed spread, held-out loss (MLM or next-token) after each domain, and DAS's accumulated importance per
layer and unit."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmark.io import atomic_write_bytes
from benchmark.report.markdown import loss_unit


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    atomic_write_bytes(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    _pyplot().close(fig)
    return path


def _by_label(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for record in records:
        out.setdefault(record["method_label"], []).append(record)
    return dict(sorted(out.items()))


def plot_matrices(records: list[dict], path: Path, metric: str = "macro_f1") -> Path | None:
    """A[t][k] of every method in one figure (a panel each), the mean over seeds; blank = not computed."""
    groups = _by_label(records)
    if not groups:
        return None
    first = next(iter(groups.values()))[0]
    tasks, domains = first["end_tasks"], first["sequence"]
    plt = _pyplot()
    ncols = min(4, len(groups))
    nrows = -(-len(groups) // ncols)
    size = 0.55 * len(tasks) + 1.5
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows), squeeze=False)
    for ax, (label, runs) in zip(axes.flat, groups.items(), strict=False):
        mean = _mean_matrix(runs, metric)
        ax.imshow(mean, cmap="viridis", vmin=0, vmax=100)
        for (t, k), value in np.ndenumerate(mean):
            if not np.isnan(value):
                ax.text(k, t, f"{value:.0f}", ha="center", va="center", color="w", fontsize=7)
        ax.set_title(f"{label}: {metric} %, mean of {len(runs)} seed(s)", fontsize=9)
        ax.set_xticks(range(len(tasks)), tasks, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(domains)), [f"after {d}" for d in domains], fontsize=7)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    return _save(fig, path)


def _mean_matrix(runs: list[dict], metric: str) -> np.ndarray:
    return _mean_over_seeds(
        [[[np.nan if v is None else 100 * v for v in row] for row in r["matrices"][metric]] for r in runs]
    )


def _mean_over_seeds(per_seed: list) -> np.ndarray:
    """Mean over the first axis ignoring NaN; an entry that is NaN in every seed stays NaN, silently."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.asarray(per_seed, dtype=float), axis=0)


def plot_forgetting(records: list[dict], path: Path) -> Path | None:
    """Forgetting rate (acc and macro-F1, points) per method: one dot per seed, a bar at the mean."""
    groups = {
        label: runs
        for label, runs in _by_label(records).items()
        if all((r["summary"].get("acc") or {}).get("forgetting") is not None for r in runs)
    }
    if not groups:
        return None
    plt = _pyplot()
    # Two stacked panels: side by side they grow too wide to read once there are a dozen methods.
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 0.7 * len(groups) + 2), 7.5), sharex=True)
    for ax, metric in zip(axes, ("acc", "macro_f1"), strict=True):
        for i, runs in enumerate(groups.values()):
            values = [100 * r["summary"][metric]["forgetting"] for r in runs]
            ax.bar(i, np.mean(values), color="#9ecae1")
            ax.scatter([i] * len(values), values, color="#08519c", zorder=3, s=18)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(groups)), list(groups), rotation=45, ha="right")
        ax.set_title(f"forgetting ({metric}); bar = mean, dots = seeds")
        ax.set_ylabel("points (positive = forgotten)")
    return _save(fig, path)


def plot_heldout_losses(records: list[dict], path: Path) -> Path | None:
    """Held-out loss of every corpus (one panel each; masked-token or next-token, as the model is) before DAP and
    after each domain, per method."""
    groups = {label: runs for label, runs in _by_label(records).items() if runs[0]["mlm_loss"]["after_domain"]}
    if not groups:
        return None
    first = next(iter(groups.values()))[0]
    columns, domains = first["mlm_loss"]["columns"], first["sequence"]
    plt = _pyplot()
    ncols = min(4, len(columns))
    nrows = -(-len(columns) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 3.2 * nrows), squeeze=False)
    x_labels = ["base", *domains]
    for ax, column in zip(axes.flat, columns, strict=False):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # up to 20 methods stay distinguishable
        for label, runs in groups.items():
            ax.plot(range(len(x_labels)), _mean_loss_curve(runs, column), marker="o", ms=3, label=label)
        ax.set_title(f"held-out {column}")
        ax.set_xticks(range(len(x_labels)), x_labels, rotation=45, ha="right", fontsize=7)
    spare = list(axes.flat)[len(columns) :]
    for ax in spare:
        ax.axis("off")
    axes.flat[0].set_ylabel("{} ({})".format(*loss_unit(first)))
    # The legend goes into a spare panel when there is one, else into the first panel.
    (spare[0] if spare else axes.flat[0]).legend(*axes.flat[0].get_legend_handles_labels(), loc="center", fontsize=7)
    return _save(fig, path)


def _mean_loss_curve(runs: list[dict], column: str) -> list[float]:
    def value(row: dict | None) -> float:
        return np.nan if row is None else row[column]

    # A point that is empty for every seed (joint training's earlier domains) stays NaN.
    curves = [[r["mlm_loss"]["base"][column], *map(value, r["mlm_loss"]["after_domain"])] for r in runs]
    return list(_mean_over_seeds(curves))


def plot_importance(records: list[dict], path: Path) -> Path | None:
    """DAS-family methods: mean accumulated importance per layer and unit type after the last domain."""
    reports = {
        label: [r["domains"][-1]["method_report"]["importance"] for r in runs]
        for label, runs in _by_label(records).items()
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
                ax.bar(np.arange(len(means)) + i * width, means, width, label=label)
        ax.set_title(f"{unit}: mean importance after the last domain")
        ax.set_xlabel("layer")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_stability_plasticity(records: list[dict], path: Path) -> Path | None:
    """Held-out loss: plasticity (x) against forgetting (y) per method, mean with seed-std error bars; the
    marker's area grows with the general-loss rise. Methods without forgetting (per-domain, joint) are left out."""
    points = {}
    for label, runs in _by_label(records).items():
        metrics = [r["mlm_loss"]["metrics"] for r in runs]
        if any(m["plasticity"] is None or m["forgetting"] is None for m in metrics):
            continue
        values = {key: np.array([m[key] for m in metrics], dtype=float) for key in metrics[0]}
        points[label] = values
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)
    rises = [np.nanmean(v["general_rise"]) for v in points.values() if not np.all(np.isnan(v["general_rise"]))]
    largest = max([abs(r) for r in rises] + [1e-9])
    for label, v in points.items():
        rise = np.nanmean(v["general_rise"]) if not np.all(np.isnan(v["general_rise"])) else 0.0
        x, y = v["plasticity"], v["forgetting"]
        ax.errorbar(x.mean(), y.mean(), xerr=_seed_std(x), yerr=_seed_std(y), fmt="none", ecolor="grey", lw=0.8)
        ax.scatter(
            x.mean(), y.mean(), s=30 + 600 * max(rise, 0.0) / largest, alpha=0.75, label=f"{label} ({rise:+.3f})"
        )
    ax.set_xlabel("plasticity: mean_k base[k] − L[k][k] (nats, → better)")
    ax.set_ylabel("forgetting: mean_k L[T−1][k] − L[k][k] (nats, ↓ better)")
    ax.set_title("stability vs plasticity (marker area ∝ general-loss rise, in the legend)", fontsize=9)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, path)


def _seed_std(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if len(values) > 1 else 0.0


def plot_mask_damping(records: list[dict], path: Path) -> Path | None:
    """Soft-masking methods: the measured damping per importance bin (|update| relative to the unmasked
    update of the same units, mean over domains and seeds) and the importance histogram of the mask in force
    during the last domain, per unit type."""
    masks = {
        label: [d["method_report"]["mask"] for r in runs for d in r["domains"] if "mask" in d.get("method_report", {})]
        for label, runs in _by_label(records).items()
    }
    masks = {label: m for label, m in masks.items() if m}
    if not masks:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    bins = len(next(iter(masks.values()))[0]["damping_per_bin"])
    centres = (np.arange(bins) + 0.5) / bins
    left.plot([0, 1], [1, 0], color="grey", ls="--", lw=0.8, label="1 − I (an exactly scaled update)")
    for label, reports in masks.items():
        per_bin = [[np.nan if v is None else v for v in m["damping_per_bin"]] for m in reports]
        left.plot(centres, _mean_over_seeds(per_bin), marker="o", ms=3, label=label)
        last = reports[-1]["importance_histogram"]
        for unit, counts in last.items():
            share = np.asarray(counts, dtype=float) / max(sum(counts), 1)
            right.plot(centres, share, marker=".", label=f"{label}: {unit}")
    left.set_xlabel("accumulated importance I of the unit (bin centre)")
    left.set_ylabel("|update| / |unmasked update|")
    left.set_ylim(-0.05, 1.1)
    left.set_title("measured damping of soft-masked units", fontsize=9)
    left.legend(fontsize=7)
    right.set_xlabel("importance I (bin centre)")
    right.set_ylabel("share of units")
    right.set_title("importance histogram of the mask (one seed's last domain)", fontsize=9)
    right.legend(fontsize=6)
    return _save(fig, path)


GROUP_PLOTS: dict[str, Callable[[list[dict], Path], Path | None]] = {
    "stability-plasticity": plot_stability_plasticity,
    "damping": plot_mask_damping,
    "matrices": plot_matrices,
    "forgetting": plot_forgetting,
    "heldout-loss": plot_heldout_losses,
    "importance": plot_importance,
}
