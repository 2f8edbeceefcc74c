"""End tasks scored under a second protocol beside a group's own (``finetune.beside``; issue #46: it scores the
diagonal and the last row): per method, the final macro-F1 under both, the gap between them, and whether the second
protocol's score beats no DAP beyond seed noise.

A linear probe reads what a frozen model's features hold; fine-tuning also lets the end task re-align them. A method
whose probe score falls while its fine-tuned score does not lost linear readout rather than knowledge ("spurious
forgetting", Zheng et al., ICLR 2025). The gap is taken per seed (the same checkpoints scored both ways), and the
comparison with ``none`` is the report's one comparison (:mod:`benchmark.report.comparison`): a t-test paired by seed
(Welch's where the rows share fewer than two seeds), Benjamini-Hochberg over every row compared with ``none`` in the
section, and only between rows of at least :data:`MIN_SEEDS` seeds each; a row not resolved states the difference its
seeds could have resolved.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from benchmark.protocols import protocol_short, protocol_words
from benchmark.report.comparison import ALPHA, Test, benjamini_hochberg, paired_test, welch_test
from benchmark.report.frame import backbone_flag, by_label
from benchmark.report.words import say, say_lines

TEMPLATE = "beside.md.j2"
"""The template that holds this reading's words."""

NO_DAP = "none"
"""The row every method is compared with."""
MIN_SEEDS = 2
"""The fewest seeds each of two rows needs before their comparison is drawn."""


def beside_protocols(records: list[dict]) -> list[str]:
    """The protocols a group's records were scored with beside their own (every record of a group has the same)."""
    return sorted({name for r in records for name in r.get("end_tasks_beside") or {}})


def final_macro_f1(record: dict, beside: str | None = None) -> float | None:
    """A record's final macro-F1 (percent) under its own protocol, or under the protocol ``beside`` it."""
    summary = record["summary"] if beside is None else record["end_tasks_beside"][beside]["summary"]
    block = summary.get("macro_f1")
    value = None if block is None else block.get("final")
    return None if value is None else 100 * value


def seed_test(a: dict[int, float], b: dict[int, float]) -> Test | None:
    """``a`` against ``b`` (seed -> score): paired by seed where they share two seeds or more, else Welch's test."""
    shared = sorted(a.keys() & b.keys())
    if len(shared) >= MIN_SEEDS:
        return paired_test(np.array([a[s] - b[s] for s in shared]))
    return welch_test(np.array(list(a.values())), np.array(list(b.values())))


@dataclass(frozen=True)
class BesideRow:
    """One row's final macro-F1 (percent, per seed) under the group's own protocol and the one ``beside`` it, and the
    beside score's difference from no DAP: ``versus`` is ``(mean, low, high)`` with the test's 95% interval, or None
    where either row has fewer than :data:`MIN_SEEDS` seeds (``difference`` then holds the plain difference of means)
    or the row is no DAP itself; ``test`` the comparison and ``q`` its Benjamini-Hochberg q-value."""

    label: str
    own: np.ndarray
    beside: np.ndarray
    difference: float | None = None
    test: Test | None = None
    q: float = 1.0
    unmeasured: str = ""
    """Why no comparison was drawn although both rows have the seeds: the row's (or no DAP's) final cells under the
    beside protocol do not measure the backbone (:func:`benchmark.report.frame.backbone_flag`)."""

    @property
    def versus(self) -> tuple[float, float, float] | None:
        """``(mean, low, high)``: the difference from no DAP with the test's 95% interval (None where not tested)."""
        return None if self.test is None else (self.test.mean, *self.test.interval())

    @property
    def gap(self) -> np.ndarray:
        """The beside score minus the own score, per seed (the same checkpoints scored both ways)."""
        return self.beside - self.own

    def resolved(self) -> bool:
        """Whether the beside score's difference from no DAP is resolved (q below the level)."""
        return self.test is not None and self.versus[0] != 0 and self.q < ALPHA

    def resolvable(self) -> float | None:
        """The smallest difference from no DAP its seeds resolve with 80% power (None where none was tested)."""
        return None if self.test is None else self.test.resolvable()

    def above(self) -> bool:
        """Whether the beside score is resolved above no DAP's."""
        return self.resolved() and self.versus[0] > 0

    def below(self) -> bool:
        """Whether the beside score is resolved below no DAP's."""
        return self.resolved() and self.versus[0] < 0


def beside_rows(records: list[dict], beside: str) -> list[BesideRow]:
    """Every row whose records all carry both scores, best beside score first, each compared with no DAP."""
    scores, seeds = {}, {}
    for label, runs in by_label(records).items():
        pairs = [(final_macro_f1(r), final_macro_f1(r, beside)) for r in runs]
        if all(None not in pair for pair in pairs):
            scores[label] = (np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]))
            seeds[label] = {r["seed"]: b for r, (_, b) in zip(runs, pairs, strict=True)}
    baseline = scores.get(NO_DAP)
    rows, grouped = [], by_label(records)
    unmeasured = {label: backbone_flag(grouped[label], beside) for label in scores}
    for label, (own, second) in sorted(scores.items(), key=lambda item: -item[1][1].mean()):
        row = BesideRow(label, own, second, unmeasured=unmeasured[label])
        if baseline is not None and label != NO_DAP:
            row = dataclasses.replace(row, difference=float(second.mean() - baseline[1].mean()))
            if not row.unmeasured and unmeasured[NO_DAP]:
                row = dataclasses.replace(row, unmeasured=f"{NO_DAP}: {unmeasured[NO_DAP]}")
            enough = min(len(second), len(baseline[1])) >= MIN_SEEDS
            if enough and not row.unmeasured:
                row = dataclasses.replace(row, test=seed_test(seeds[label], seeds[NO_DAP]))
        rows.append(row)
    tested = [row for row in rows if row.test is not None]
    qs = dict(zip([row.label for row in tested], benjamini_hochberg([row.test.p for row in tested]), strict=True))
    return [dataclasses.replace(row, q=qs[row.label]) if row.label in qs else row for row in rows]


def unmeasured_note(rows: list[BesideRow]) -> str:
    """``no verdict: the cells of 12 of 15 rows do not measure the backbone`` where rows went uncompared with no DAP
    because of their cells (or no DAP's); empty where none did."""
    left = [row for row in rows if row.unmeasured and row.label != NO_DAP]
    if not left:
        return ""
    return say(TEMPLATE, "unmeasured_note", len(left), len(rows) - 1, NO_DAP)


def beating_no_dap(rows: list[BesideRow]) -> list[str]:
    """The rows whose beside score is resolved above no DAP's."""
    return [row.label for row in rows if row.above()]


def beside_markdown(records: list[dict]) -> list[str]:
    """The group's section on each protocol beside its own (nothing when there is none)."""
    lines = []
    for beside in beside_protocols(records):
        lines += _section(records, beside)
    return lines


def _section(records: list[dict], beside: str) -> list[str]:
    own, other = protocol_words(records[0]["config"]["finetune"]), protocol_words({"protocol": beside})
    rows = beside_rows(records, beside)
    lines = say_lines(TEMPLATE, "intro", own, other, NO_DAP)
    lines += [say(TEMPLATE, "row", row) for row in rows]
    lines.append("")
    unmeasured = [row for row in rows if row.unmeasured and row.label != NO_DAP]
    if unmeasured:
        lines += [say(TEMPLATE, "no_verdict", len(unmeasured), other, NO_DAP), ""]
    if any(row.label == NO_DAP for row in rows):
        if unmeasured and not any(row.test for row in rows):
            return lines
        lines += [say(TEMPLATE, "beating", NO_DAP, protocol_short({"protocol": beside}), beating_no_dap(rows)), ""]
    return lines
