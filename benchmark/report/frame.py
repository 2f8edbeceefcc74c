"""Records -> one table row per record: its group, method label, seed and every leaderboard column.

Everything a row needs comes from the record itself (its comparison role, its flags), never from the plugins
installed where the report runs, so the same records always give the same leaderboard.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from benchmark.families import FAMILIES, MASKED_LM, ModelFamily
from benchmark.metrics import (
    GATE_DECISIONS,
    LOSS_METRIC_REGISTRY,
    mean_regret,
    record_backbone_flags,
    record_loss_metrics,
    untrained_groups,
)
from benchmark.metrics import (
    served_losses as served,
)
from benchmark.report.groups import order_of, pairing_unit


@dataclass(frozen=True)
class Column:
    """A leaderboard column: its title, how a record gives its value, whether higher is better (None: neither) and
    how it is shown (``num`` nats with 3 decimals, ``pct`` percent, ``int``)."""

    title: str
    value: Callable[[dict], float | None]
    higher_is_better: bool | None
    kind: str
    metric: str | None = None
    """The name of the replicated metric behind it (held-out loss metric or end-task summary), if any."""


def column_header(column: Column) -> str:
    """A column's table header: its title and the arrow of its better direction (none where neither is better)."""
    arrow = {True: " ↑", False: " ↓", None: ""}[column.higher_is_better]
    return f"{column.title}{arrow}"


def record_family(record: dict) -> ModelFamily | None:
    """The family of the record's base model (:mod:`benchmark.families`; records made before the field existed are
    of masked models); None for a family this process has not registered (a plugin's, not imported)."""
    return FAMILIES.find(record.get("model_kind", MASKED_LM.name))


def is_decoder(record: dict) -> bool:
    """Whether the record's base model scores text left to right (a causal LM: its held-out losses are next-token
    losses per token, so their exponent is a perplexity)."""
    family = record_family(record)
    return bool(family and family.scores_continuations)


def loss_unit(record: dict) -> tuple[str, str]:
    """What the record's held-out losses measure, and their unit, as its family says them."""
    family = record_family(record)
    return family.heldout_reading if family else (f"held-out loss ({record['model_kind']} model)", "nats")


GENERATED_WORLD = "synthetic"
"""The profile whose data are generated (:mod:`benchmark.data.synthetic`), not real text."""


def tokens_per_domain(record: dict) -> int:
    """The DAP tokens a record's method trained on per domain (updates x sequences x tokens)."""
    dap = record["config"]["dap"]
    return int(dap["steps"]) * int(dap["batch_size"]) * int(dap["seq_len"])


def _loss_metric(name: str) -> Callable[[dict], float | None]:
    """A stored loss metric; one a record predates (a metric added since) is computed from its stored held-out losses
    (``benchmark.metrics.record_loss_metrics``), never a KeyError."""

    def value(record: dict) -> float | None:
        stored = record["lm_loss"]["metrics"]
        return stored[name] if name in stored else record_loss_metrics(record).get(name)

    return value


def _summary(score: str, key: str) -> Callable[[dict], float | None]:
    def value(record: dict) -> float | None:
        block = record["summary"].get(score)
        return None if block is None else block.get(key)

    return value


def _final_drift(record: dict) -> float | None:
    """Linear CKA of all held-out inputs' features to the base model's after the last stage (None without it)."""
    stages = (record["representation"] or {"after_domain": [None]})["after_domain"]
    return None if stages[-1] is None else stages[-1]["all"]["cka_to_base"]


def _general_loss(record: dict) -> float | None:
    losses = record["lm_loss"]
    return losses["after_domain"][-1]["general"] if "general" in losses["columns"] else None


def loss_columns() -> list[Column]:
    """The headline: every registered loss metric (:data:`benchmark.metrics.LOSS_METRIC_REGISTRY`, in nats, in
    registration order) and the representation drift after the last stage; read at every call, so a metric
    registered by a plugin shows too."""
    metrics = [
        Column(m.title, _loss_metric(m.name), m.higher_is_better, "num", m.name) for m in LOSS_METRIC_REGISTRY.values()
    ]
    return [*metrics, Column("CKA to base", _final_drift, None, "num")]


COST_COLUMNS = [
    Column("tokens/s", lambda r: r["timing"]["tokens_per_second"], True, "int"),
    Column("peak mem (MB)", lambda r: r["timing"]["peak_memory_mb"], False, "int"),
]

END_TASK_COLUMNS = [
    Column("final acc", _summary("acc", "final"), True, "pct", "acc/final"),
    Column("final macro-F1", _summary("macro_f1", "final"), True, "pct", "macro_f1/final"),
    Column("forgetting (acc)", _summary("acc", "forgetting"), False, "pct", "acc/forgetting"),
    Column("forgetting (MF1)", _summary("macro_f1", "forgetting"), False, "pct", "macro_f1/forgetting"),
    Column("BWT (MF1)", _summary("macro_f1", "bwt"), True, "pct", "macro_f1/bwt"),
    Column("general loss", _general_loss, False, "num"),
]


def all_columns() -> list[Column]:
    """Every leaderboard column: :func:`loss_columns`, the cost and the end-task columns."""
    return loss_columns() + COST_COLUMNS + END_TASK_COLUMNS


def format_number(value: float, kind: str) -> str:
    """A column's value as the tables show it: ``int`` with thousands separators, ``pct`` with 2 decimals, nats with
    3."""
    if kind == "int":
        return f"{value:,.0f}"
    return f"{value:.{2 if kind == 'pct' else 3}f}"


def by_label(records: list[dict]) -> dict[str, list[dict]]:
    """The records of each method label (a row's seeds), labels sorted."""
    out: dict[str, list[dict]] = {}
    for record in records:
        out.setdefault(record["method_label"], []).append(record)
    return dict(sorted(out.items()))


def mean_over_seeds(per_seed: list) -> np.ndarray:
    """Mean over the first axis ignoring NaN; an entry that is NaN in every seed stays NaN, silently."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.asarray(per_seed, dtype=float), axis=0)


def mean_score_matrix(runs: list[dict], metric: str) -> np.ndarray:
    """A row's end-task matrix A[t][k] of ``metric`` in percent, the mean over its seeds (NaN: not computed)."""
    return mean_over_seeds(
        [[[np.nan if v is None else 100 * v for v in row] for row in r["matrices"][metric]] for r in runs]
    )


VERDICT_METRICS = (("forgetting", "F"), ("general rise", "G"), ("plasticity", "P"))
"""Loss metrics tested against the reference methods, with their one-letter codes in the verdict column."""

FLAGS = {
    "needs_domain_id_at_finetune": "domain-id",
    "stores_past_data": "replay",
    "independent_per_domain": "per-domain",
    "joint_training": "joint",
    "retrains_on_seen": "oracle",
}


def flags(capabilities: dict) -> str:
    """The record's capability flags as the tables show them (``per-domain``, ``no-DAP``, ...)."""
    out = [label for key, label in FLAGS.items() if capabilities.get(key)]
    if not capabilities.get("pretrains", True):
        out.append("no-DAP")
    return ", ".join(out) or "–"


def untrained_flag(records: list[dict]) -> str:
    """The table flag of a row whose declared groups (or weights, or gates) did not learn in any of its records:
    ``untrained: prompts ≤ 2.0e-04`` (relative update size), ``untrained: gate decisions ≤ 1.8%`` (share changed)."""
    stalled = untrained_groups([stage for record in records for stage in record["domains"]])
    return ", ".join(f"untrained: {group} ≤ {_amount(group, size)}" for group, size in sorted(stalled.items()))


def final_cells(record: dict) -> list[str]:
    """The cells (``"t/k"``) a record's final end-task score averages: the last row, or for a per-domain method each
    domain's own model, the diagonal."""
    last = len(record["sequence"]) - 1
    if record["capabilities"].get("independent_per_domain"):
        return [f"{k}/{k}" for k in range(last + 1)]
    return [f"{last}/{k}" for k in range(last + 1)]


def backbone_flag(records: list[dict], beside: str | None = None) -> str:
    """The table flag of a row some of whose final end-task cells (under its own protocol, or the one ``beside`` it)
    do not measure the backbone (:func:`benchmark.metrics.backbone_problem`): ``not measuring the backbone: 9 of 18
    final cells``; empty where every cell measures it. The report states no end-task verdict for such a row."""
    flags = [record_backbone_flags(r, beside) for r in records]
    if not any(flags):
        return ""
    cells = [(found, cell) for r, found in zip(records, flags, strict=True) for cell in final_cells(r)]
    flagged = sum(cell in found for found, cell in cells)
    return f"not measuring the backbone: {flagged} of {len(cells)} final cells" if flagged else ""


def _amount(group: str, value: float) -> str:
    return f"{100 * value:.1f}%" if group == GATE_DECISIONS else f"{value:.1e}"


REGRET = Column("mean regret", lambda record: None, False, "num", "regret")
"""Mean regret against the group's oracle of the same seed and order (:func:`benchmark.metrics.mean_regret`); a
column only of groups that hold an oracle (:func:`group_loss_columns`), its values set by :func:`leaderboard_frame`."""


def group_loss_columns(part: pd.DataFrame) -> list[Column]:
    """The continual table's columns for one group's rows: :func:`loss_columns`, and :data:`REGRET` where the group
    holds an oracle."""
    has_regret = REGRET.title in part and part[REGRET.title].notna().any()
    return [*loss_columns(), REGRET] if has_regret else loss_columns()


def group_columns(part: pd.DataFrame) -> list[Column]:
    """Every column of one group's tables: :func:`group_loss_columns`, the cost and the end-task columns."""
    return group_loss_columns(part) + COST_COLUMNS + END_TASK_COLUMNS


def served_losses(record: dict) -> np.ndarray:
    """T x T: the held-out loss of domain k of the model that serves it after stage t (NaN where none is measured),
    as :func:`benchmark.metrics.served_losses` reads a record's L[t][k]."""
    domains, rows = record["sequence"], record["lm_loss"]["after_domain"]
    after = np.full((len(domains), len(domains)), np.nan)
    for t, row in enumerate(rows):
        for k, domain in enumerate(domains):
            if row is not None and row.get(domain) is not None:
                after[t, k] = row[domain]
    return served(after, record["capabilities"].get("independent_per_domain", False))


def oracle_partners(records: list[dict], group_of: Callable[[dict], str]) -> dict[str, dict]:
    """Each record's oracle: the record of the same group, seed and domain order whose method re-trains on every
    domain seen (``Capabilities.retrains_on_seen``); keyed by the record's run id, absent where the group has none.
    Joint training has none: its one model, trained on every domain at the sequence's budget, is the oracle's last
    stage itself (the same run), so its regret would be 0 by construction, not a measurement."""
    oracles = {(group_of(r), pairing_unit(r)): r for r in records if r["capabilities"].get("retrains_on_seen", False)}
    regretful = [r for r in records if not r["capabilities"].get("joint_training", False)]
    found = {r["run_id"]: oracles.get((group_of(r), pairing_unit(r))) for r in regretful}
    return {run_id: oracle for run_id, oracle in found.items() if oracle is not None}


def leaderboard_frame(records: list[dict], group_of: Callable[[dict], str] | None = None) -> pd.DataFrame:
    """One row per record: ``group`` (``group_of(record)``, else the group key of its own content), ``method`` (its
    label), ``seed``, ``run_id``, every column of :func:`all_columns`, trainable parameters and flags."""
    if group_of is None:
        from benchmark.report.groups import group_records

        groups, _ = group_records(records)
        keys = {id(r): g.key for g in groups for r in g.records}
        group_of = lambda record: keys.get(id(record), "left out")  # noqa: E731 - a lookup, named once
    rows, columns, oracles = [], all_columns(), oracle_partners(records, group_of)
    for record in records:
        row = {"group": group_of(record), "method": record["method_label"], "seed": record["seed"]}
        row["order"], row["pair"] = order_of(record), pairing_unit(record)
        row["run_id"] = record["run_id"]
        for column in columns:
            value = column.value(record)
            row[column.title] = np.nan if value is None else float(value)
        oracle = oracles.get(record["run_id"])
        if oracle is not None:
            row[REGRET.title] = float(mean_regret(served_losses(record), served_losses(oracle)))
        row["trainable params"] = record["trainable_parameters"]
        row["flags"] = flags(record["capabilities"])
        rows.append(row)
    return pd.DataFrame(rows)


REFERENCE_ROLES = ("naive_continual", "proposed", "no_dap")
"""The leaderboard's reference roles, in the order its readings and verdicts name them."""


def reference_labels(records: list[dict]) -> dict[str, str]:
    """Role -> method label of the group's reference methods (:data:`REFERENCE_ROLES`), as the records declare them
    (only records at the method's default options carry a role; ``dapbench migrate`` writes it into records made
    before their method declared one): the records alone decide, never the plugins installed where the report runs."""
    out = {}
    for record in sorted(records, key=lambda r: r["method_label"]):
        if record.get("comparison_role") in REFERENCE_ROLES:
            out.setdefault(record["comparison_role"], record["method_label"])
    return {role: out[role] for role in REFERENCE_ROLES if role in out}


def method_colours(labels: list[str]) -> dict[str, str]:
    """One colour per method label, the same on every page and plot of a report: :func:`palette`'s colours in sorted
    label order, then evenly spaced hues for any label beyond them."""
    import colorsys

    colours = list(palette())
    ordered = sorted(set(labels))
    for i in range(max(0, len(ordered) - len(colours))):
        red, green, blue = colorsys.hls_to_rgb((i * 0.618034) % 1.0, 0.45, 0.65)
        colours.append("#" + "".join(f"{round(255 * c):02x}" for c in (red, green, blue)))
    return dict(zip(ordered, colours, strict=False))


@functools.cache
def palette() -> tuple[str, ...]:
    """Distinct colours that read on white: Plotly's D3 palette first, then, from its other qualitative palettes
    (pale colours left out), always the colour farthest from every one chosen so far, so that the first colours of a
    long list stay as far apart as a list that long allows."""
    from plotly.colors import hex_to_rgb, qualitative

    def luminance(rgb) -> float:
        return (0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]) / 255

    names = ("D3", "T10", "Dark24", "Alphabet", "Light24", "Bold", "Vivid", "Safe", "Prism")
    pool = [c.lower() for name in names for c in getattr(qualitative, name) if c.startswith("#")]
    pool = [c for c in dict.fromkeys(pool) if luminance(hex_to_rgb(c)) <= 0.62]
    chosen = [c.lower() for c in qualitative.D3]
    rgb = {c: np.array(hex_to_rgb(c), dtype=float) for c in pool + chosen}
    rest = [c for c in pool if c not in chosen]
    while rest:
        far = max(rest, key=lambda c: min(np.linalg.norm(rgb[c] - rgb[d]) for d in chosen))
        chosen.append(far)
        rest.remove(far)
    return tuple(chosen)
