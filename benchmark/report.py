"""``dapbench report``: run records -> per-run tables, A[t][k] heatmaps and ``leaderboard.md``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_bytes, atomic_write_text, read_json

# (column title, getter, higher is better, format)
LEADERBOARD_COLUMNS = [
    ("final acc", lambda r: _summary(r, "acc", "final"), True, "pct"),
    ("final macro-F1", lambda r: _summary(r, "macro_f1", "final"), True, "pct"),
    ("forgetting (acc)", lambda r: _summary(r, "acc", "forgetting"), False, "pct"),
    ("forgetting (MF1)", lambda r: _summary(r, "macro_f1", "forgetting"), False, "pct"),
    ("BWT (MF1)", lambda r: _summary(r, "macro_f1", "bwt"), True, "pct"),
    ("general MLM loss", lambda r: _general_loss(r)[0], False, "num"),
    ("Δ general vs base", lambda r: _general_loss(r)[1], False, "num"),
    ("tokens/s", lambda r: r["timing"]["tokens_per_second"], True, "int"),
    ("peak mem (MB)", lambda r: r["timing"]["peak_memory_mb"], False, "int"),
]


def load_records(results_dir: str | Path) -> list[dict]:
    """Every run record (JSON with a ``schema`` key) under ``results_dir``; corrupt files are errors."""
    root = Path(results_dir)
    if not root.is_dir():
        raise DapbenchError(f"no results directory at {root}", "run `dapbench run` first or pass --output-dir")
    records = []
    for path in sorted(root.rglob("*.json")):
        data = read_json(path, "run record")
        if isinstance(data, dict) and "schema" in data and data.get("status") == "complete":
            records.append(data)
    return records


def _summary(record: dict, metric: str, key: str) -> float | None:
    block = record["summary"].get(metric)
    return None if block is None else block.get(key)


def _general_loss(record: dict) -> tuple[float | None, float | None]:
    losses = record["mlm_loss"]
    if "general" not in losses["columns"]:
        return None, None
    after = losses["after_domain"][-1]["general"]
    return after, after - losses["base"]["general"]


def matrix_frame(record: dict, metric: str) -> pd.DataFrame:
    """A[t][k] as a table: rows = after domain t, columns = end task k."""
    domains = record["sequence"]
    values = [[np.nan if v is None else v for v in row] for row in record["matrices"][metric]]
    return pd.DataFrame(values, index=[f"after {d}" for d in domains], columns=record["end_tasks"])


def write_run_tables(record: dict, out_dir: Path) -> list[Path]:
    """CSV + Markdown tables of every matrix and the MLM-loss matrix, and a heatmap PNG per metric."""
    written = []
    stem = record["run_id"]
    for metric in ("acc", "macro_f1"):
        frame = matrix_frame(record, metric)
        for suffix, text in ((".csv", frame.to_csv()), (".md", frame.to_markdown(floatfmt=".4f"))):
            path = out_dir / "tables" / f"{stem}-{metric}{suffix}"
            atomic_write_text(path, text)
            written.append(path)
        written.append(
            _heatmap(
                frame,
                f"{record['method']} seed {record['seed']}: {metric}",
                out_dir / "plots" / f"{stem}-{metric}.png",
            )
        )
    losses = mlm_loss_frame(record)
    path = out_dir / "tables" / f"{stem}-mlm_loss.md"
    atomic_write_text(path, losses.to_markdown(floatfmt=".4f"))
    return [*written, path]


def mlm_loss_frame(record: dict) -> pd.DataFrame:
    """Held-out MLM loss per corpus (columns) before DAP and after each domain (rows)."""
    losses = record["mlm_loss"]
    # Joint training has a model only after the last domain: the other rows stay empty.
    rows = [losses["base"], *(row or {} for row in losses["after_domain"])]
    index = ["base", *[f"after {d}" for d in record["sequence"]]]
    return pd.DataFrame(rows, index=index)[losses["columns"]]


def _heatmap(frame: pd.DataFrame, title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 * frame.shape[1] + 2, 0.7 * frame.shape[0] + 1.5))
    image = ax.imshow(100 * frame.to_numpy(dtype=float), cmap="viridis", vmin=0, vmax=100)
    ax.set_xticks(range(frame.shape[1]), frame.columns, rotation=45, ha="right")
    ax.set_yticks(range(frame.shape[0]), frame.index)
    for (i, j), value in np.ndenumerate(frame.to_numpy(dtype=float)):
        if not math.isnan(value):
            ax.text(j, i, f"{100 * value:.1f}", ha="center", va="center", color="w", fontsize=8)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="%")
    fig.tight_layout()
    atomic_write_bytes(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return path


def leaderboard_frame(records: list[dict]) -> pd.DataFrame:
    """One row per (profile, model, sequence, method): mean ± std over seeds with n."""
    rows = []
    for record in records:
        label = record.get("method_label", record["method"])
        row = {"group": _group(record), "method": label, "seed": record["seed"]}
        for title, getter, _, _ in LEADERBOARD_COLUMNS:
            value = getter(record)
            row[title] = np.nan if value is None else float(value)
        row["trainable params"] = record["trainable_parameters"]
        row["flags"] = _flags(record["capabilities"])
        rows.append(row)
    return pd.DataFrame(rows)


def _group(record: dict) -> str:
    model = Path(record["config"]["model"]).name or record["config"]["model"]
    return f"profile `{record['profile']}`, model `{model}`, sequence {' → '.join(record['sequence'])}"


def _flags(caps: dict) -> str:
    names = {
        "needs_domain_id_at_finetune": "domain-id",
        "stores_past_data": "replay",
        "independent_per_domain": "per-domain",
        "joint_training": "joint",
        "pretrains": None,
    }
    flags = [label for key, label in names.items() if label and caps.get(key)]
    if not caps.get("pretrains", True):
        flags.append("no-DAP")
    return ", ".join(flags) or "–"


def _fmt(values: pd.Series, kind: str) -> str:
    values = values.dropna()
    if values.empty:
        return "n/a"
    scale = 100 if kind == "pct" else 1
    mean, std = scale * values.mean(), scale * values.std(ddof=1) if len(values) > 1 else 0.0
    if kind == "int":
        return f"{mean:,.0f}"
    digits = 2 if kind == "pct" else 3
    if len(values) == 1:  # a single seed has no spread to show
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def leaderboard_markdown(records: list[dict]) -> str:
    """The generated leaderboard: one table per group, sorted by final macro-F1."""
    lines = [
        "# dapbench leaderboard",
        "",
        "Generated by `dapbench report` from the run records under `results/`; do not edit by hand.",
        "Scores are percentages, mean ± sample std over seeds (n seeds; no spread is shown for n = 1).",
        "↑ higher is better, ↓ lower is better.",
        "Forgetting is n/a for per-domain methods (each task is scored with its own domain's model).",
        "",
    ]
    if not records:
        return "\n".join([*lines, "No complete run records yet.", ""])
    frame = leaderboard_frame(records)
    for group, part in frame.groupby("group", sort=True):
        header = ["method", "n"] + [f"{t} {'↑' if up else '↓'}" for t, _, up, _ in LEADERBOARD_COLUMNS]
        header += ["trainable params", "flags"]
        body = []
        for method, runs in part.groupby("method"):
            cells = [f"`{method}`", str(len(runs))]
            cells += [_fmt(runs[t], kind) for t, _, _, kind in LEADERBOARD_COLUMNS]
            cells += [f"{int(runs['trainable params'].iloc[0]):,}", runs["flags"].iloc[0]]
            body.append((runs["final macro-F1"].mean(), cells))
        body.sort(key=lambda item: -np.nan_to_num(item[0], nan=-1))
        lines += [f"## {group}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cells) + " |" for _, cells in body]
        lines.append("")
    return "\n".join(lines)


def write_report(output_dir: str | Path) -> dict[str, int]:
    """Regenerate every table, plot and ``leaderboard.md`` from the records under ``output_dir/results``."""
    out = Path(output_dir)
    records = load_records(out / "results")
    files = [path for record in records for path in write_run_tables(record, out / "results")]
    atomic_write_text(out / "leaderboard.md", leaderboard_markdown(records))
    return {"records": len(records), "files": len(files) + 1}
