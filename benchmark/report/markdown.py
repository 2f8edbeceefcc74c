"""The leaderboard as Markdown: headers that state what a group's records share, tables with combined intervals and
verdicts, links to plots, the reading. Every string that comes from a record is escaped
(:mod:`benchmark.report.escape`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from benchmark.metrics import GATES_UNLEARNED_BELOW, UNTRAINED_BELOW
from benchmark.protocols import protocol_phrase
from benchmark.report.beside import beside_markdown
from benchmark.report.escape import code, text
from benchmark.report.frame import (
    COST_COLUMNS,
    END_TASK_COLUMNS,
    Column,
    all_columns,
    backbone_flag,
    column_header,
    group_loss_columns,
    is_decoder,
    loss_unit,
    untrained_flag,
)
from benchmark.report.group_text import generated_world_note, group_reading, run_matrices
from benchmark.report.groups import Group, LeftOut, order_of
from benchmark.report.ladder import LadderReading
from benchmark.report.matched import matched_markdown
from benchmark.report.reading import verdicts
from benchmark.report.speed import machine_counts, mixed_machines_flag
from benchmark.report.stability_gap import group_stability_gap
from benchmark.report.statistics import GroupStatistics
from benchmark.report.words import say, say_lines

LADDER = "ladder.md.j2"
"""The template that holds the budget ladder's words."""

PAGE = "leaderboard.md.j2"
"""The template that holds the leaderboard's own words."""


LEFT_OUT_KINDS = ("incomplete", "superseded")
"""The kinds of left-out record, in the order the leaderboard lists them (their words: ``leaderboard.md.j2``)."""


def leaderboard_markdown(
    sections: list[tuple[Group, GroupStatistics, dict[str, str]]],
    left_out: list[LeftOut] = (),
    ladders: list = (),
    answer: list[str] = (),
) -> str:
    """The whole leaderboard: ``sections`` are each group with its statistics and its plots (kind -> link);
    ``ladders`` the lines of each budget ladder's section (:func:`ladder_markdown`); ``answer``
    the short answer's (:func:`benchmark.report.answer.short_answer`, made once per report)."""
    lines = [*say_lines(PAGE, "header", UNTRAINED_BELOW, GATES_UNLEARNED_BELOW), "", *answer]
    known = {record["method"] for group, _, _ in sections for record in group.records}
    if not sections:
        lines.append(say(PAGE, "no_records"))
    for group, stats, plots in sections:
        lines += [say(PAGE, "group_title", group.title), "", *group_header(group, known), ""]
        lines += [say(PAGE, "continual_title", loss_unit(group.records[0])), ""]
        lines += table(stats, group_loss_columns(stats.part), "final gain", verdicts(stats), trailing=COST_COLUMNS)
        lines += ["", say(PAGE, "end_tasks_title"), "", *table(stats, END_TASK_COLUMNS, "final macro-F1"), ""]
        lines += beside_markdown(group.records)
        lines += order_tables(stats)
        lines += matched_markdown(stats.part, group.records)
        lines += group_stability_gap(stats)
        lines += plot_links(plots)
        lines += ["", say(PAGE, "reading_title"), "", *group_reading(stats), ""]
    if ladders:
        lines += [say(PAGE, "ladders_title"), ""]
        for section in ladders:
            lines += section
    if left_out:
        lines += [say(PAGE, "left_out_title"), ""]
        for kind in LEFT_OUT_KINDS:
            named = [s for s in left_out if s.kind == kind]
            if named:
                lines += [say(PAGE, "left_out_kind", len(named), kind), ""]
                lines += [say(PAGE, "left_out_row", s) for s in named]
                lines.append("")
    return "\n".join(lines) + "\n"


def group_header(group: Group, known: Iterable[str] = ()) -> list[str]:
    """What the group's records share, read from the records (and the full canonical configuration, folded); with
    ``known``, the methods of every record the report reads, which of them this group has no record of."""
    records, first = group.records, group.records[0]
    config = first["config"]
    seeds = sorted({r["seed"] for r in records})
    orders = sorted({order_of(r) for r in records})
    commits = sorted({(r["environment"].get("git_commit") or "unknown")[:12] for r in records})
    versions = sorted({f"{r['method']} v{(r.get('identity') or {}).get('method_version', '?')}" for r in records})
    dap, ft = config["dap"], config["finetune"]
    wall = sum(r["timing"]["wall_seconds"] for r in records)
    shared = {
        "key": group.key,
        "runs": len(records),
        "labels": len({r["method_label"] for r in records}),
        "seeds": seeds,
        "orders": orders,
        "results_version": group.results_version,
        "versions": versions,
    }
    beside = ft.get("beside")  # how the cells were scored beside the group's own protocol, if they were
    beside_phrase = beside and protocol_phrase({**ft, "protocol": beside})
    return [
        say(PAGE, "group_line", shared),
        say(PAGE, "inputs_line", config, _digest(group.payload["inputs"])),
        say(PAGE, "dap_line", dap),
        *_decoder_line(first),
        *_generated_world_line(first),
        *_absent_methods_line(group, known),
        say(PAGE, "end_tasks_line", protocol_phrase(ft), beside_phrase, config["matrix"]),
        say(PAGE, "made_line", commits, "; ".join(machine_counts(records)), wall / 3600),
        "",
        say(PAGE, "settings_summary"),
        "",
        "```json",
        json.dumps(group.payload["config"], indent=1, sort_keys=True).replace("```", "'''"),
        "```",
        "</details>",
    ]


def _generated_world_line(record: dict) -> list[str]:
    note = generated_world_note(record)
    return [f"- **{note.replace(': ', '**: ', 1)}"] if note else []


def _absent_methods_line(group: Group, known: Iterable[str]) -> list[str]:
    # A method the report has records of elsewhere but not in this group is said so, never left out silently: it may
    # be refused for the group's settings (docs/running.md says which and why) or not run yet; in a part of several
    # domain orders, it may have been run over fewer orders. Read from the records alone, never from what is
    # installed: the leaderboard is a function of the records (an installed plugin changes no line of it).
    absent = sorted(set(known) - {r["method"] for r in group.records})
    if not absent:
        return []
    return [say(PAGE, "absent_line", absent, len(group.orders) > 1)]


def _decoder_line(record: dict) -> list[str]:
    # the base model is part of the group's settings, so every record of the group has the same base losses
    if not is_decoder(record):
        return []
    base = record["lm_loss"]["base"]
    return [say(PAGE, "decoder_line", [(k, math.exp(base[k])) for k in record["lm_loss"]["columns"]])]


ORDER_COLUMNS = ("forgetting", "general rise", "final gain", "final macro-F1")
"""The columns shown per domain order in a group run over several orders."""


def order_tables(stats: GroupStatistics) -> list[str]:
    """For a group run over several domain orders: per method, each order's mean over seeds of the headline columns,
    and the spread (std) of those order means; empty for a group of one order."""
    part = stats.part
    orders = sorted(part["order"].unique())
    if len(orders) < 2:
        return []
    lines = [*say_lines(PAGE, "orders_intro"), ""]
    for title in (t for t in ORDER_COLUMNS if t in part):
        means = part.pivot_table(index="method", columns="order", values=title, aggfunc="mean")
        scale = 100.0 if next(c for c in all_columns() if c.title == title).kind == "pct" else 1.0
        lines += say_lines(PAGE, "order_table_header", title, orders)
        lines.append("|---" * (len(orders) + 2) + "|")
        for label, row in means.iterrows():
            cells = ["–" if pd.isna(row.get(o)) else f"{row[o] * scale:.3f}" for o in orders]
            spread = row.dropna().std(ddof=1) * scale if row.notna().sum() > 1 else float("nan")
            lines.append(
                f"| {code(label)} | " + " | ".join(cells) + f" | {'–' if pd.isna(spread) else f'{spread:.3f}'} |"
            )
        lines.append("")
    return lines


def _digest(value) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:10]


def table(
    stats: GroupStatistics,
    columns: list[Column],
    sort_by: str,
    verdicts: dict[str, str] | None = None,
    trailing: list[Column] = (),
) -> list[str]:
    """One row per method label: n, the columns as mean ± combined SE, the verdicts, the ``trailing`` columns,
    trainable parameters and flags; sorted by ``sort_by``, best first."""
    header = ["method", "n", *(column_header(c) for c in columns)]
    header += ["verdicts"] if verdicts is not None else []
    header += [column_header(c) for c in trailing] + ["trainable params", "flags"]
    ranked = next(c for c in columns if c.title == sort_by)
    body = []
    for label, runs in stats.part.groupby("method"):
        cells = [code(label), str(len(runs)), *(stats.cell(label, c) for c in columns)]
        cells += [verdicts.get(label, "–")] if verdicts is not None else []
        cells += [stats.cell(label, c) for c in trailing]
        cells += [f"{int(runs['trainable params'].iloc[0]):,}", text(_flags(runs["flags"].iloc[0], stats, label))]
        key = runs[sort_by].mean()
        body.append((np.nan_to_num(key if ranked.higher_is_better else -key, nan=-np.inf), cells))
    body.sort(key=lambda item: -item[0])
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(c) + " |" for _, c in body),
    ]


def _flags(capabilities: str, stats: GroupStatistics, label: str) -> str:
    """A row's capability flags and, where its records say so, what it did not train (over all its records), that
    its end-task cells do not measure the backbone and that its tokens/s mix machines."""
    records = [r for r in stats.records if r["method_label"] == label]
    found = (capabilities, untrained_flag(records), backbone_flag(records), mixed_machines_flag(records))
    shown = [f for f in found if f and f != "–"]
    return ", ".join(shown) or "–"


def plot_links(plots: dict[str, str]) -> list[str]:
    """One line of links to the group's plots (paths relative to the leaderboard)."""
    return [say(PAGE, "plot_links", plots)] if plots else []


def run_tables(record: dict) -> str:
    """A record's page as Markdown: its label, seed and run id, then :func:`run_matrices`."""
    return "\n".join([*say_lines(PAGE, "run_heading", record), "", *run_matrices(record)])


def ladder_markdown(reading: LadderReading, plot: str | None) -> list[str]:
    """The leaderboard's section on one ladder: its rungs, tau per metric and rung pair, the rows left out as untrained,
    the verdicts that changed, and the plot (words: ``templates/ladder.md.j2``)."""
    ladder, rungs = reading.ladder, reading.ladder.rungs
    lines = [say(LADDER, "heading", ladder), "", say(LADDER, "groups_line", ladder, len(ladder.labels()))]
    if not reading.taus:
        lines += [say(LADDER, "no_tau"), ""]
    else:
        lines += say_lines(LADDER, "tau_intro")
    lines += [say(LADDER, "tau_row", t, rungs) for t in reading.taus]
    lines += [""] if reading.taus else []
    left = {(i, j): rows for i, j in ladder.pairs() if (rows := ladder.left_out(i, j))}  # both have, not compared
    lines += [say(LADDER, "left_out", rungs[i], rungs[j], rows) for (i, j), rows in left.items()]
    lines += [""] if left else []
    for i in range(len(rungs) - 1):
        changes = [v for v in reading.verdicts if v.rungs == (i, i + 1)]
        counts = {kind: sum(v.change == kind for v in changes) for kind in ("kept", "flipped", "appeared")}
        lines.append(say(LADDER, "verdict_counts", rungs[i], rungs[i + 1], counts))
        lines += [say(LADDER, "flipped", v) for v in changes if v.change == "flipped"]
    if plot:
        lines += ["", say(LADDER, "plot", plot)]
    return [*lines, ""]
