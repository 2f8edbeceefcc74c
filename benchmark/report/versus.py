"""One row against every other row of its group (``dapbench versus LABEL``, issue #89): the calibrated comparison the
leaderboard draws against its three references, with the named row as the reference, so a method author reads their
method's verdicts against ``das``, ``derpp``, ``none`` and every committed row of the group without re-running any.

Per group holding the row and per loss metric the leaderboard tests (forgetting, general rise, plasticity): the row
minus each other row, paired by seed and order, a t-test whose standard error adds the held-out sample's bootstrap
error to the seeds' spread, Benjamini-Hochberg over the rows of that metric (the leaderboard's own family size for
one reference). A difference not resolved states what its seeds could have resolved with 80% power."""

from __future__ import annotations

from collections.abc import Callable

from benchmark.errors import DapbenchError, did_you_mean
from benchmark.report.frame import VERDICT_METRICS
from benchmark.report.groups import Group
from benchmark.report.reading import column_of, paired_by
from benchmark.report.statistics import ALPHA, GroupStatistics
from benchmark.report.words import say, say_lines

TEMPLATE = "versus.md.j2"
"""The template that holds the table's words."""


def versus_markdown(groups: list[Group], label: str, statistics: Callable[[Group], GroupStatistics]) -> list[str]:
    """Markdown lines: ``label`` against every other row, one table per group that holds it (``statistics`` computed
    for those groups only: it bootstraps every record of a group); a named error where no group does."""
    holding = [g for g in groups if any(r["method_label"] == label for r in g.records)]
    if not holding:
        labels = sorted({r["method_label"] for g in groups for r in g.records})
        hint = did_you_mean(label, labels, form=" {}")
        raise DapbenchError(
            f"no record of the row {label!r} in these results.{hint}",
            "name a row as the leaderboard writes it (e.g. ncl, das[fidelity=reference]); `dapbench report` lists them",
        )
    lines = []
    for group in holding:
        lines += _group_table(group, statistics(group), label)
    return lines


def _group_table(group: Group, stats: GroupStatistics, label: str) -> list[str]:
    first = group.records[0]
    seeds = len({r["seed"] for r in group.records if r["method_label"] == label})
    found = {title: {c.label: c for c in stats.comparisons(label, column_of(title))} for title, _ in VERDICT_METRICS}
    others = sorted({row for by_row in found.values() for row in by_row})
    metrics = [title for title, _ in VERDICT_METRICS]
    intro = (label, group.key, first["profile"], seeds, paired_by(stats), ALPHA, len(others), metrics)
    lines = say_lines(TEMPLATE, "intro", *intro)
    for row in others:
        cells = [found[title].get(row) for title, _ in VERDICT_METRICS]
        pairs = max((c.n for c in cells if c is not None), default=0)
        lines.append(say(TEMPLATE, "row", row, pairs, cells))
    if not others:
        lines.append(say(TEMPLATE, "alone", metrics))
    return [*lines, ""]
