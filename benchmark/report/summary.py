"""What a finished run prints: the same numbers, intervals and verdicts its leaderboard shows, as plain text, so the
terminal never claims a difference the leaderboard does not resolve."""

from __future__ import annotations

from benchmark.report.escape import printable
from benchmark.report.frame import END_TASK_COLUMNS, leaderboard_frame, loss_columns, reference_labels
from benchmark.report.groups import group_records
from benchmark.report.reading import verdicts
from benchmark.report.statistics import GroupStatistics
from benchmark.report.words import say

TEMPLATE = "terminal.txt.j2"
"""The template that holds what a finished run prints."""

SHOWN = ("final gain", "forgetting", "general rise")


def one_line(record: dict) -> str:
    """A record's headline numbers in one line (one seed: no interval, no verdict)."""
    losses, scores = record["lm_loss"]["metrics"], record["summary"]
    parts = [f"{name.replace('_', ' ')} {value:+.3f}" for name, value in losses.items() if value is not None][:3]
    if scores.get("macro_f1"):
        final = scores["macro_f1"]["final"]
        parts.append(f"final macro-F1 {100 * final:.1f}" + majority_note(final, record.get("majority_class")))
    return printable(", ".join(parts))


def majority_note(final_macro_f1: float, majority: dict | None) -> str:
    """`` (= the majority class)`` where a final macro-F1 is what always predicting each task's most frequent label
    scores (to the printed 0.1 point): the end tasks learned nothing at this budget, whatever the method did."""
    if majority and abs(final_macro_f1 - majority["macro_f1"]) < 5e-4:
        return say(TEMPLATE, "majority_note")
    return ""


def terminal_summary(run_records: list[dict], all_records: list[dict]) -> list[str]:
    """Per leaderboard group that holds one of ``run_records`` (grouped with every record of the folder, as the
    leaderboard is): each method's mean ± combined SE on the headline loss metrics and final macro-F1, and the
    verdicts both seeds and evaluation sample resolve; and each of ``run_records`` the leaderboard leaves out, with
    why (e.g. a seed not yet run over every domain order of its part)."""
    ids = {r["run_id"] for r in run_records}
    groups, left_out = group_records(all_records)
    lines = [say(TEMPLATE, "left_out", s.run_id, s.kind, printable(s.reason)) for s in left_out if s.run_id in ids]
    for group in (g for g in groups if ids & {r["run_id"] for r in g.records}):
        part = leaderboard_frame(group.records, group_of=lambda record, key=group.key: key)
        stats = GroupStatistics(part, group.records, group.sample_key, reference_labels(group.records))
        found = verdicts(stats)
        lines.append(say(TEMPLATE, "group_line", printable(group.title), len(group.records)))
        columns = [c for c in loss_columns() if c.title in SHOWN] + [
            c for c in END_TASK_COLUMNS if c.title == "final macro-F1"
        ]
        for label in sorted(set(part["method"])):
            cells = [_cell(stats, label, c, group.records[0].get("majority_class")) for c in columns]
            verdict = found.get(label, "").replace("`", "")
            lines.append(say(TEMPLATE, "row", printable(label), [c for c in cells if c], verdict))
        if part.groupby("method").size().max() < 2:
            lines.append(say(TEMPLATE, "one_seed"))
    return lines


def _cell(stats: GroupStatistics, label: str, column, majority: dict | None) -> str:
    found = stats.interval(label, column)
    if found is None:
        return ""
    mean, se, n = found
    digits = 1 if column.kind == "pct" else 3
    note = majority_note(mean / 100, majority) if column.title == "final macro-F1" else ""
    return f"{column.title} {mean:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}") + f" (n={n}){note}"
