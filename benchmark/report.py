"""``dapbench report``: run records -> per-run tables, A[t][k] heatmaps and ``leaderboard.md``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from benchmark.config import is_fixture_profile
from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_bytes, atomic_write_text, safe_name
from benchmark.records import load_records

# (column title, getter, higher is better (None: neither), format)
Column = tuple[str, Callable[[dict], "float | None"], "bool | None", str]

LOSS_COLUMNS: list[Column] = [
    ("plasticity", lambda r: _loss_metric(r, "plasticity"), True, "num"),
    ("forgetting", lambda r: _loss_metric(r, "forgetting"), False, "num"),
    ("max forgetting", lambda r: _loss_metric(r, "max_forgetting"), False, "num"),
    ("final gain", lambda r: _loss_metric(r, "final_gain"), True, "num"),
    ("general rise", lambda r: _loss_metric(r, "general_rise"), False, "num"),
    ("CKA to base", lambda r: _final_drift(r, "cka_to_base"), None, "num"),
]
"""The headline: continual metrics of the held-out MLM loss in nats (:func:`benchmark.metrics.loss_metrics`)
and the representation drift after the last stage."""

COST_COLUMNS: list[Column] = [
    ("tokens/s", lambda r: r["timing"]["tokens_per_second"], True, "int"),
    ("peak mem (MB)", lambda r: r["timing"]["peak_memory_mb"], False, "int"),
]

END_TASK_COLUMNS: list[Column] = [
    ("final acc", lambda r: _summary(r, "acc", "final"), True, "pct"),
    ("final macro-F1", lambda r: _summary(r, "macro_f1", "final"), True, "pct"),
    ("forgetting (acc)", lambda r: _summary(r, "acc", "forgetting"), False, "pct"),
    ("forgetting (MF1)", lambda r: _summary(r, "macro_f1", "forgetting"), False, "pct"),
    ("BWT (MF1)", lambda r: _summary(r, "macro_f1", "bwt"), True, "pct"),
    ("general MLM loss", lambda r: _general_loss(r)[0], False, "num"),
]
LEADERBOARD_COLUMNS = LOSS_COLUMNS + COST_COLUMNS + END_TASK_COLUMNS

VERDICT_METRICS = (("forgetting", "F"), ("general rise", "G"), ("plasticity", "P"))
"""Loss metrics tested against the reference methods, with their one-letter codes in the verdict column."""

REFERENCE_ROLES = ("naive_continual", "no_dap")
"""Methods declare these roles (``ContinualMethod.comparison_role``); each is a paired-test reference."""

BASE_LOSS_TOLERANCE = 1e-4
"""Nats by which the base model's held-out losses may differ between records of one leaderboard group.
The same held-out batches and weights give bit-identical losses on one device; a larger difference means
the records were not measured on the same evaluation (another device or precision, changed data or masks)."""


def _summary(record: dict, metric: str, key: str) -> float | None:
    block = record["summary"].get(metric)
    return None if block is None else block.get(key)


def _loss_metric(record: dict, name: str) -> float | None:
    """A loss-based continual metric of the record (``mlm_loss.metrics``)."""
    return record["mlm_loss"]["metrics"][name]


def _final_drift(record: dict, key: str) -> float | None:
    """Representation drift of all held-out inputs after the last stage (None for records without it)."""
    stages = (record["representation"] or {"after_domain": [None]})["after_domain"]
    return None if stages[-1] is None else stages[-1]["all"][key]


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
    stem = safe_name(record["run_id"], "record run id")
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
    """One row per record with its group (profile, model, sequence, budget) and every column."""
    rows = []
    for record in records:
        row = {"group": _group(record), "method": _label(record), "seed": record["seed"]}
        for title, getter, _, _ in LEADERBOARD_COLUMNS:
            value = getter(record)
            row[title] = np.nan if value is None else float(value)
        row["trainable params"] = record["trainable_parameters"]
        row["flags"] = _flags(record["capabilities"]) + (", older code" if _options_added_since(record) else "")
        rows.append(row)
    return pd.DataFrame(rows)


def _group(record: dict) -> str:
    model = Path(record["config"]["model"]).name or record["config"]["model"]
    return (
        f"profile `{record['profile']}`, model `{model}`, sequence {' → '.join(record['sequence'])}, {_budget(record)}"
    )


def _records_by_group(records: list[dict]) -> dict[str, list[dict]]:
    """Records keyed by their leaderboard group (profile, model, sequence, budget).

    A group holds at most one record per method label and seed: two would be averaged as if they were
    two seeds. That happens when records of an older configuration (say, before a config field was added,
    which changes the run id) sit beside new ones, and it is an error that names both.
    """
    groups: dict[str, list[dict]] = {}
    seen: dict[tuple[str, str, int], str] = {}
    for record in records:
        group = _group(record)
        key = (group, _label(record), record["seed"])
        if key in seen:
            raise DapbenchError(
                f"two records of `{key[1]}` seed {key[2]} in one leaderboard group ({group}): "
                f"{seen[key]} and {record['run_id']}",
                "delete the stale record's JSON under results/ (or re-run it with the current dapbench)",
            )
        seen[key] = record["run_id"]
        groups.setdefault(group, []).append(record)
    for group, members in groups.items():
        _check_same_base_losses(group, members)
    return groups


def _check_same_base_losses(group: str, records: list[dict]) -> None:
    """Refuse a group whose records measured the base model differently (see ``BASE_LOSS_TOLERANCE``)."""
    first = records[0]
    for record in records[1:]:
        for column, value in record["mlm_loss"]["base"].items():
            expected = first["mlm_loss"]["base"].get(column)
            if expected is not None and abs(value - expected) > BASE_LOSS_TOLERANCE:
                raise DapbenchError(
                    f"base-model held-out loss of {column!r} differs within one leaderboard group ({group}):"
                    f" {expected} in {first['run_id']}, {value} in {record['run_id']} (tolerance"
                    f" {BASE_LOSS_TOLERANCE} nats), so their losses were not measured on the same evaluation",
                    "re-run the stale record with the current dapbench on the same device and precision, or keep"
                    " the two in separate results folders",
                )


def _budget(record: dict) -> str:
    """The budget that makes records comparable: DAP, fine-tuning and matrix mode."""
    dap, ft = record["config"]["dap"], record["config"]["finetune"]
    examples = ft["max_train_examples"] or "all"
    if _is_probe(ft):
        end_tasks = f"probe x {examples} ex"
    else:
        epochs = sorted(set(ft["epochs"].values())) or [ft["default_epochs"]]
        end_tasks = f"FT {'/'.join(f'{e:g}' for e in epochs)} ep x {examples} ex"
    return (
        f"DAP {dap['steps']} x {dap['batch_size']} x {dap['seq_len']}, {end_tasks}, matrix {record['config']['matrix']}"
    )


def _is_probe(ft: dict) -> bool:
    """Whether end tasks were scored by linear probe (else fine-tuned)."""
    return ft["protocol"] == "linear_probe"


def _end_task_protocol(ft: dict) -> str:
    """One header phrase for how end tasks were scored."""
    sizes = f"<= {ft['max_train_examples'] or 'all'} train / {ft['max_test_examples'] or 'all'} test examples"
    if _is_probe(ft):
        return (
            f"end tasks: linear probe (frozen model, mean-pooled last hidden states, standardised, logistic"
            f" regression C={ft.get('probe_c', 1.0)}), {sizes}"
        )
    return f"fine-tuning: lr {ft['lr']}, {sizes}"


def _options_added_since(record: dict) -> list[str]:
    """Options the method has now that its record's ``method_config`` lacks: the record was made by older code,
    whose behaviour for them this version cannot tell (its numbers may differ from a run of today's default)."""
    from benchmark.registry import default_registry

    try:
        cls = default_registry().get(record["method"])
    except DapbenchError:  # a plugin not installed here
        return []
    return sorted({f.name for f in dataclasses.fields(cls.config_cls)} - set(record.get("method_config") or {}))


def _older_code_reading(records: list[dict]) -> list[str]:
    older: dict[str, set[str]] = {}
    for record in records:
        older.setdefault(_label(record), set()).update(_options_added_since(record))
    return [
        f"- `{label}` (flag `older code`): its records predate the option(s) {', '.join(sorted(options))}; they were"
        " made with what older code did there, so re-run them before comparing with today's defaults."
        for label, options in sorted(older.items())
        if options
    ]


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


def leaderboard_markdown(
    records: list[dict], plots: dict[str, dict[str, Path]] | None = None, superseded: list[str] = ()
) -> str:
    """The generated leaderboard: per group a header, the continual (held-out loss) table with paired
    verdicts, the end-task table, its plots and a reading generated from its numbers."""
    lines = [
        "# dapbench leaderboard",
        "",
        "Generated by `dapbench report` from the run records under `results/`; do not edit by hand.",
        "Values are mean ± sample std over seeds (n seeds; no spread is shown for n = 1). ↑ higher is better,",
        "↓ lower is better.",
        "",
        "**Continual table** (held-out MLM loss, nats; L[t][k] = loss on domain k's held-out text after domain t,",
        "base = the base model's): plasticity = mean_k (base[k] − L[k][k]); forgetting = mean_{k<T−1}",
        "(L[T−1][k] − L[k][k]); max forgetting = the worst stage's mean forgetting so far; final gain = mean_k",
        "(base[k] − L_final[k]); general rise = L_final[general] − base[general]. Per-domain methods use each",
        "domain's own model as L_final and have no forgetting; joint training has only its final model.",
        "CKA to base: linear CKA between the base and the final model's mean-pooled features of the held-out",
        "inputs (1 = same geometry). Verdicts: F = forgetting, G = general rise, P = plasticity; ↓/↑ = lower/higher",
        "than the named reference on every comparison a paired t-test over seeds resolves (Benjamini-Hochberg over",
        "methods, q < 0.05).",
        "",
        "**End-task table**: scores in percent. Forgetting is n/a for per-domain methods and joint training.",
        "Flags: domain-id = needs the end task's domain id at fine-tuning; replay = stores past data;",
        "per-domain = one model per domain from the base model; joint = one model on the union of domains.",
        "",
    ]
    if superseded:
        lines += [
            f"Left out: {len(superseded)} schema-1 record(s) re-run since with the current code: "
            + ", ".join(f"`{run}`" for run in superseded),
            "",
        ]
    if not records:
        return "\n".join([*lines, "No complete run records yet.", ""])
    frame = leaderboard_frame(records)
    by_group = _records_by_group(records)
    # The most complete comparison first: groups with more runs (methods x seeds), then by name.
    order = sorted(by_group, key=lambda g: (-len(by_group[g]), g))
    parts = dict(tuple(frame.groupby("group")))
    for group in order:
        part, members = parts[group], by_group[group]
        references = _reference_labels(members)
        verdicts = _verdicts(part, references)
        lines += [f"## {group}", "", *_group_header(members), ""]
        lines += ["### Continual (held-out MLM loss, nats)", ""]
        lines += _table(part, LOSS_COLUMNS, "final gain", verdicts, trailing=tuple(COST_COLUMNS))
        lines += ["", "### End tasks", "", *_table(part, END_TASK_COLUMNS, "final macro-F1"), ""]
        lines += _plot_links((plots or {}).get(group, {}))
        lines += ["", "**Reading** (generated from the numbers above):", ""]
        lines += [*_loss_reading(part, references), *_variant_reading(part)]
        lines += [*_reading(part, members, references.get("no_dap")), ""]
    return "\n".join(lines)


def _group_header(records: list[dict]) -> list[str]:
    first = records[0]
    config = first["config"]
    seeds = sorted({r["seed"] for r in records})
    commits = sorted({(r["environment"].get("git_commit") or "unknown")[:12] for r in records})
    numerics = sorted({str((r.get("identity") or {}).get("results_version", "unrecorded")) for r in records})
    devices = sorted(
        {f"{r['environment']['device_name']}, {r['environment']['torch_threads']} torch thread(s)" for r in records}
    )
    data = hashlib.sha256(json.dumps(first["data_checksums"], sort_keys=True).encode()).hexdigest()[:10]
    dap, ft = config["dap"], config["finetune"]
    wall = sum(r["timing"]["wall_seconds"] for r in records)
    return [
        f"- model: `{config['model']}`",
        f"- data: `{config['data_root']}` (checksum of all inputs `{data}`); general held-out text:"
        f" `{config.get('general_heldout')}`",
        f"- seeds: {', '.join(map(str, seeds))}; commit(s): {', '.join(f'`{c}`' for c in commits)};"
        f" numerics version(s) (`RESULTS_VERSION`): {', '.join(numerics)}; device: {', '.join(devices)}",
        f"- DAP per domain: {dap['steps']} updates of {dap['batch_size']} x {dap['seq_len']} tokens, lr {dap['lr']};"
        f" {_end_task_protocol(ft)}, matrix `{config['matrix']}`",
        f"- compute: {len(records)} runs, {wall / 3600:.2f} h of run wall time in all (sum over runs; runs that"
        " shared the machine overlap)",
    ]


def _table(
    part: pd.DataFrame,
    columns: list[Column],
    sort_by: str,
    verdicts: dict[str, str] | None = None,
    trailing: tuple[Column, ...] = (),
) -> list[str]:
    """One row per method label: n, the columns as mean ± std, (with ``verdicts``) the paired verdicts, the
    ``trailing`` columns, trainable parameters and flags; sorted by ``sort_by``, best first."""
    arrows = {True: " ↑", False: " ↓", None: ""}
    header = ["method", "n", *(f"{title}{arrows[up]}" for title, _, up, _ in columns)]
    header += ["verdicts"] if verdicts is not None else []
    header += [f"{title}{arrows[up]}" for title, _, up, _ in trailing] + ["trainable params", "flags"]
    higher_is_better = next(up for title, _, up, _ in columns if title == sort_by)
    body = []
    for method, runs in part.groupby("method"):
        cells = [f"`{method}`", str(len(runs)), *(_fmt(runs[title], kind) for title, _, _, kind in columns)]
        if verdicts is not None:
            cells.append(verdicts.get(method, "") or "–")
        cells += [_fmt(runs[title], kind) for title, _, _, kind in trailing]
        cells += [f"{int(runs['trainable params'].iloc[0]):,}", runs["flags"].iloc[0]]
        key = runs[sort_by].mean()
        body.append((np.nan_to_num(key if higher_is_better else -key, nan=-np.inf), cells))
    body.sort(key=lambda item: -item[0])
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(c) + " |" for _, c in body),
    ]


def _reference_labels(records: list[dict]) -> dict[str, str]:
    """Role -> method label of the group's reference methods (by their declared ``comparison_role``,
    at default options), for the roles present."""
    from benchmark.registry import default_registry

    registry, out = default_registry(), {}
    for label in sorted({_label(r) for r in records}):
        try:
            role = getattr(registry.get(label), "comparison_role", None)
        except DapbenchError:  # a variant label (das[...]) or a plugin not installed here
            continue
        if role in REFERENCE_ROLES:
            out[role] = label
    return {role: out[role] for role in REFERENCE_ROLES if role in out}


def _verdicts(part: pd.DataFrame, references: dict[str, str], alpha: float = 0.05) -> dict[str, str]:
    """Per method: which loss metrics differ from each reference beyond seed noise, e.g. ``F↓ ncl · G↓ ncl, none``."""
    found: dict[str, dict[tuple[str, str], list[str]]] = {}
    for column, letter in VERDICT_METRICS:
        for reference in references.values():
            table = paired_against_reference(part, reference, column, scale=1.0)
            for method, row in table[(table["q"] < alpha) & (table["mean"] != 0)].iterrows():
                arrow = "↓" if row["mean"] < 0 else "↑"
                found.setdefault(method, {}).setdefault((letter, arrow), []).append(f"`{reference}`")
    return {
        method: " · ".join(f"{letter}{arrow} {', '.join(refs)}" for (letter, arrow), refs in cells.items())
        for method, cells in found.items()
    }


def _loss_reading(part: pd.DataFrame, references: dict[str, str], alpha: float = 0.05) -> list[str]:
    """Reading lines: which methods beat each reference on forgetting, general-loss rise and plasticity."""
    lines = []
    words = {
        "forgetting": ("less forgetting", "more forgetting"),
        "general rise": ("a smaller general-loss rise", "a larger general-loss rise"),
        "plasticity": ("less plasticity", "more plasticity"),
    }
    for reference in references.values():
        clauses, tested = [], 0
        for column, _ in VERDICT_METRICS:
            table = paired_against_reference(part, reference, column, scale=1.0)
            tested = max(tested, len(table))
            significant = table[(table["q"] < alpha) & (table["mean"] != 0)]
            for sign, word in zip((-1, 1), words[column], strict=True):
                rows = significant[np.sign(significant["mean"]) == sign]
                names = ", ".join(f"`{m}` ({d:+.3f})" for m, d in rows["mean"].items()) or "none"
                clauses.append(f"{word}: {names}")
        if tested:
            lines.append(
                f"- Against `{reference}` (held-out loss, paired by seed, t-test, Benjamini-Hochberg over {tested}"
                f" methods per metric, q < {alpha}; difference in nats): " + "; ".join(clauses) + "."
            )
    spread = part.groupby("method")["forgetting"].std(ddof=1).max()
    means = part.groupby("method")["forgetting"].mean().dropna()
    if len(means) > 1 and not np.isnan(spread):
        lines.append(
            f"- Forgetting spans {means.min():.3f} (`{means.idxmin()}`) to {means.max():.3f} (`{means.idxmax()}`)"
            f" nats across methods; the largest seed std is {spread:.3f}."
        )
    drift = part.groupby("method")["CKA to base"].mean().dropna()
    if not drift.empty:
        lines.append(
            f"- Representation drift after the last stage: CKA to the base model from {drift.min():.3f}"
            f" (`{drift.idxmin()}`) to {drift.max():.3f} (`{drift.idxmax()}`); methods without it in their records"
            " predate the measurement."
        )
    return lines


def _variant_reading(part: pd.DataFrame) -> list[str]:
    """Reading lines: each option variant against every measured label one option closer to the method's defaults
    (``das[ablation=no_contrast]`` against ``das``; ``das[ablation=random_importance,mask_target=update]`` against
    ``das[mask_target=update]``, the matched control, and ``das[ablation=random_importance]``), on the
    held-out-loss metrics, paired by seed: what each option changes, everything else equal."""
    lines = []
    labels = set(part["method"])
    for variant in sorted(m for m in labels if "[" in m):
        for parent in (p for p in option_parents(variant) if p in labels):
            subset = part[part["method"].isin([parent, variant])]
            cells = []
            for column, _ in VERDICT_METRICS:
                table = paired_against_reference(subset, parent, column, scale=1.0)
                cells += [f"{column} {row['mean']:+.3f} (p={row['p']:.2g})" for _, row in table.iterrows()]
            if cells:
                lines.append(f"- `{variant}` against `{parent}` (paired by seed, nats): " + ", ".join(cells) + ".")
    return lines


def option_parents(label: str) -> list[str]:
    """The labels one option closer to the defaults: ``das[a=1,b=2]`` -> ``das[b=2]``, ``das[a=1]``; ``das[a=1]`` ->
    ``das``. Options keep their order (:meth:`~benchmark.method.MethodDeclaration.variant` writes them in field
    order), so a parent is spelled as its own records label it."""
    name, _, rest = label.partition("[")
    options = rest.removesuffix("]").split(",")
    parents = []
    for dropped in range(len(options)):
        kept = options[:dropped] + options[dropped + 1 :]
        parents.append(f"{name}[{','.join(kept)}]" if kept else name)
    return parents


def _plot_links(plots: dict[str, Path]) -> list[str]:
    titles = {
        "stability-plasticity": "stability vs plasticity (held-out loss)",
        "damping": "soft-mask damping and importance histogram",
        "matrices": "A[t][k] per method (mean over seeds)",
        "forgetting": "forgetting per method",
        "mlm-loss": "held-out MLM loss after each domain",
        "importance": "DAS importance per layer",
    }
    links = [f"[{titles.get(kind, kind)}]({path.as_posix()})" for kind, path in plots.items()]
    return [f"Plots: {' · '.join(links)}; per-run A[t][k] heatmaps in `results/plots/`."] if links else []


def _spread_reading(part: pd.DataFrame, means: pd.Series) -> list[str]:
    """Whether the seed spread of final macro-F1 resolves the differences between method means."""
    span = means.max() - means.min()
    if part.groupby("method").size().max() > 1:
        std = (part.groupby("method")["final macro-F1"].std(ddof=1) * 100).max()
        verdict = "exceeds" if std >= span / 2 else "is below half of"
        return [
            f"- Seed spread: the largest std of final macro-F1 over seeds is {std:.2f} points and the method means "
            f"span {span:.2f} points; the spread {verdict} the span, so only differences well above {std:.2f} points "
            f"are resolved."
        ]
    return [
        f"- One seed per method: seed-to-seed spread is not measured, so differences between methods (their "
        f"final macro-F1 spans {span:.2f} points) are not established."
    ]


def _reading(part: pd.DataFrame, records: list[dict], no_dap: str | None = None) -> list[str]:
    """Facts a reader should weigh about the end tasks, computed from the group's numbers (not hand-written);
    ``no_dap`` is the label of the group's no-DAP reference, if it has one."""
    means = part.groupby("method")["final macro-F1"].mean() * 100
    lines = _spread_reading(part, means)
    if no_dap in means:
        dap = means.drop(no_dap)
        if not dap.empty:
            best = dap.idxmax()
            lines.append(
                f"- DAP vs no DAP: the best DAP method (`{best}`) is {dap.max() - means[no_dap]:+.2f} points of final "
                f"macro-F1 from `{no_dap}`; {int((dap > means[no_dap]).sum())} of {len(dap)} DAP methods are above it."
            )
        lines += _against_no_dap(part, no_dap)
    general = part.groupby("method")["general rise"].mean().dropna()
    trained = general.drop(no_dap, errors="ignore") if no_dap else general
    if not trained.empty:
        lines.append(
            f"- General knowledge: after the last domain the general held-out MLM loss rose by {trained.min():.3f} "
            f"(`{trained.idxmin()}`) to {trained.max():.3f} (`{trained.idxmax()}`) nats over the base model."
        )
    same = _same_scores_as_no_dap(records, no_dap) if no_dap else []
    if same:
        lines.append(
            f"- {len(same)} of {len({_label(r) for r in records}) - 1} DAP methods score exactly what `{no_dap}` scores"
            f" on every end task ({', '.join(f'`{m}`' for m in same)}): their end-task models make the same"
            " predictions, so at this budget the end tasks do not separate them."
        )
    majority = records[0]["majority_class"]
    if majority:
        best = part.groupby("method")["final acc"].mean().max() * 100
        lines.append(
            f"- Always predicting each task's most frequent test label would score {100 * majority['acc']:.2f} "
            f"final accuracy and {100 * majority['macro_f1']:.2f} macro-F1 (best method: {best:.2f} / "
            f"{means.max():.2f}); scores near these mean the end-task models learned little."
        )
    if _is_probe(records[0]["config"]["finetune"]):
        lines.append(
            "- The end tasks are scored by a linear probe on the frozen model's mean-pooled features. A base"
            " model whose pooled features were trained for sentence similarity (the `small` model is"
            " all-MiniLM-L6-v2 with an MLM head) already suits the probe, so DAP's drift of those features (CKA"
            " to base) can cost probe accuracy even where the held-out losses show domain knowledge gained: read"
            " the end-task table with the continual table, not instead of it."
        )
    lines += _mask_reading(records)
    lines += _method_notes(records)
    lines += _older_code_reading(records)
    return lines


def _mask_reading(records: list[dict]) -> list[str]:
    """For methods that record their soft-mask's measured damping: how much of their update units keep, by
    importance, as a mean over domains and seeds."""
    by_label: dict[str, list[list[float | None]]] = {}
    for record in records:
        for domain in record.get("domains", []):
            mask = (domain.get("method_report") or {}).get("mask")
            if mask:
                by_label.setdefault(f"{_label(record)}", []).append(mask["damping_per_bin"])
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
            f"- `{label}` soft-mask, measured at each domain's last step ({len(per_domain)} domain-runs): units of"
            f" importance {shown} of the update they would take unmasked."
        )
    return lines


def _method_notes(records: list[dict]) -> list[str]:
    """What a method says its numbers mean (its ``leaderboard_note``), once per method in the group."""
    from benchmark.registry import default_registry

    notes = []
    for name in sorted({r["method"] for r in records}):
        try:
            note = getattr(default_registry().get(name), "leaderboard_note", "")
        except DapbenchError:  # a plugin not installed here
            continue
        if note:
            notes.append(f"- `{name}`: {note}")
    return notes


def paired_against_reference(
    part: pd.DataFrame, reference: str, column: str = "final macro-F1", scale: float = 100.0
) -> pd.DataFrame:
    """Each method's per-seed difference from ``reference`` on the seeds both ran, with a paired test.

    Columns: ``n`` shared seeds, ``mean`` and ``std`` of the difference (``column`` x ``scale``: points
    for scores, nats for losses with ``scale=1``), ``p`` (two-sided
    paired t-test over seeds) and ``q`` (Benjamini-Hochberg adjusted over the methods tested).
    Methods sharing fewer than two seeds with the reference are left out (no spread to test against).
    """
    from scipy.stats import false_discovery_control, ttest_rel

    wide = part.pivot_table(index="seed", columns="method", values=column) * scale
    rows = {}
    methods = wide.columns.drop(reference) if reference in wide else []
    for method in methods:
        pairs = wide[[method, reference]].dropna()
        if len(pairs) < 2:
            continue
        diff = pairs[method] - pairs[reference]
        std = diff.std(ddof=1)
        if std == 0:  # identical on every seed: a t statistic is undefined
            p = 1.0 if diff.iloc[0] == 0 else 0.0
        else:
            p = float(ttest_rel(pairs[method], pairs[reference]).pvalue)
        rows[method] = {"n": len(pairs), "mean": diff.mean(), "std": std, "p": p}
    table = pd.DataFrame.from_dict(rows, orient="index", columns=["n", "mean", "std", "p"])
    table["q"] = false_discovery_control(table["p"].to_numpy()) if len(table) else []
    return table.sort_values("mean", ascending=False)


def _against_no_dap(part: pd.DataFrame, no_dap: str, alpha: float = 0.05) -> list[str]:
    """A reading line: which methods differ from the no-DAP reference ``no_dap`` beyond seed-to-seed noise
    (final macro-F1)."""
    table = paired_against_reference(part, no_dap)
    if table.empty:
        return []

    def names(rows: pd.DataFrame) -> str:
        return ", ".join(f"`{m}` ({d:+.2f})" for m, d in rows["mean"].items()) or "none"

    significant = table[table["q"] < alpha]
    seeds = "/".join(str(n) for n in sorted(set(table["n"].astype(int))))
    return [
        f"- End tasks against `{no_dap}`, paired by seed (t-test over {seeds} seeds, Benjamini-Hochberg over"
        f" {len(table)} methods, q < {alpha}): consistently above it {names(significant[significant['mean'] > 0])};"
        f" consistently below it {names(significant[significant['mean'] < 0])}. The seeds do not separate the other "
        f"{len(table) - len(significant)} from no DAP (with so few seeds only large or very steady differences pass, "
        "and a steady difference can still be too small to matter: read the sizes)."
    ]


def _label(record: dict) -> str:
    return record["method_label"]


def _same_scores_as_no_dap(records: list[dict], no_dap: str) -> list[str]:
    """DAP methods whose scored entries (final row or diagonal) equal the no-DAP baseline's (label ``no_dap``),
    every seed."""
    reference = {r["seed"]: r["matrices"]["acc"] for r in records if _label(r) == no_dap}
    by_label: dict[str, list[dict]] = {}
    for record in records:
        if _label(record) != no_dap:
            by_label.setdefault(_label(record), []).append(record)

    same = []
    for label, runs in sorted(by_label.items()):
        pairs = [(r, reference.get(r["seed"])) for r in runs]
        if all(ref is not None for _, ref in pairs) and all(
            _entries(r["matrices"]["acc"]) == _entries(ref, like=r["matrices"]["acc"]) for r, ref in pairs
        ):
            same.append(label)
    return same


def _entries(matrix: list[list[float | None]], like: list[list[float | None]] | None = None) -> list[float]:
    """The entries of ``matrix`` at the positions where ``like`` (default: itself) has a score."""
    shape = like or matrix
    return [matrix[t][k] for t, row in enumerate(shape) for k, v in enumerate(row) if v is not None]


def write_report(output_dir: str | Path) -> dict[str, int]:
    """Regenerate every table, plot and ``leaderboard.md`` from the records under ``output_dir/results``."""
    out = Path(output_dir)
    loaded = [r for r in load_records(out / "results") if not is_fixture_profile(r["profile"])]
    records, superseded = drop_superseded(loaded)
    groups = _records_by_group(records)  # checked before anything is written
    files = [path for record in records for path in write_run_tables(record, out / "results")]
    plots = _group_plots(groups, out)
    files += [path for group in plots.values() for path in group.values()]
    atomic_write_text(out / "leaderboard.md", leaderboard_markdown(records, plots, superseded))
    _remove_stale(out / "results", {(out / f).resolve() for f in files})
    return {"records": len(records), "files": len(files) + 1}


def _remove_stale(results: Path, written: set[Path]) -> None:
    """Delete the generated tables and plots that no current record or group produced (a record deleted or
    superseded since the last report), so the folders hold exactly what the leaderboard is made of."""
    for folder, pattern in (("tables", "*.csv"), ("tables", "*.md"), ("plots", "*.png")):
        for path in (results / folder).glob(pattern):
            if path.resolve() not in written:
                path.unlink()


def drop_superseded(records: list[dict]) -> tuple[list[dict], list[str]]:
    """Records without the migrated schema-1 records that a re-run of the same method label and seed in the same
    leaderboard group replaces (schema-1 ids hashed paths, so a re-run gets a new id and both files exist); and
    the run ids of the dropped ones, which the leaderboard names."""
    current = {(_group(r), _label(r), r["seed"]) for r in records if r["identity"] is not None}
    dropped = [r for r in records if r["identity"] is None and (_group(r), _label(r), r["seed"]) in current]
    ids = {id(r) for r in dropped}
    return [r for r in records if id(r) not in ids], sorted(r["run_id"] for r in dropped)


def _group_plots(groups: dict[str, list[dict]], out: Path) -> dict[str, dict[str, Path]]:
    """Every group plot, as paths relative to ``out`` (where leaderboard.md links them from)."""
    from benchmark.plots import GROUP_PLOTS

    plots: dict[str, dict[str, Path]] = {}
    for group, members in groups.items():
        slug = hashlib.sha256(group.encode()).hexdigest()[:8]
        model = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(members[0]["config"]["model"]).name).lstrip(".") or "model"
        stem = f"{safe_name(members[0]['profile'], 'record profile')}-{model}-{slug}"
        for kind, plot in GROUP_PLOTS.items():
            relative = Path("results") / "plots" / f"{stem}-{kind}.png"
            if plot(members, out / relative) is not None:
                plots.setdefault(group, {})[kind] = relative
    return plots
