"""End tasks scored under a second protocol beside a group's own (``finetune.beside``; issue #46: it scores the
diagonal and the last row): per method, the final macro-F1 under both, the gap between them, and whether the second
protocol's score beats no DAP beyond seed noise.

A linear probe reads what a frozen model's features hold; fine-tuning also lets the end task re-align them. A method
whose probe score falls while its fine-tuned score does not lost linear readout rather than knowledge ("spurious
forgetting", Zheng et al., ICLR 2025). The gap is taken per seed (the same checkpoints scored both ways), and the
comparison with ``none`` resamples each method's seeds (percentile bootstrap, a fixed generator), so a difference is
resolved only when its 95% interval excludes zero, and only between rows of at least :data:`MIN_SEEDS` seeds each: a
row of one seed has no seed noise to resample, and its interval would show the other row's noise alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from benchmark.protocols import protocol_short, protocol_words
from benchmark.report.escape import code, text
from benchmark.report.frame import by_label
from benchmark.report.statistics import named_generator

BOOTSTRAP = 4000
"""Seed resamples per comparison with no DAP."""
NO_DAP = "none"
"""The row every method is compared with."""
MIN_SEEDS = 2
"""The fewest seeds each of two rows needs before their seed-bootstrap comparison is drawn."""


def beside_protocols(records: list[dict]) -> list[str]:
    """The protocols a group's records were scored with beside their own (every record of a group has the same)."""
    return sorted({name for r in records for name in r.get("end_tasks_beside") or {}})


def final_macro_f1(record: dict, beside: str | None = None) -> float | None:
    """A record's final macro-F1 (percent) under its own protocol, or under the protocol ``beside`` it."""
    summary = record["summary"] if beside is None else record["end_tasks_beside"][beside]["summary"]
    block = summary.get("macro_f1")
    value = None if block is None else block.get("final")
    return None if value is None else 100 * value


def seed_difference(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    """Mean of ``a`` minus mean of ``b`` and its 95% percentile interval, each side's seeds resampled."""
    draws_a = rng.choice(a, size=(BOOTSTRAP, len(a))).mean(axis=1)
    draws_b = rng.choice(b, size=(BOOTSTRAP, len(b))).mean(axis=1)
    low, high = np.percentile(draws_a - draws_b, [2.5, 97.5])
    return float(a.mean() - b.mean()), float(low), float(high)


@dataclass(frozen=True)
class BesideRow:
    """One row's final macro-F1 (percent, per seed) under the group's own protocol and the one ``beside`` it, and the
    beside score's difference from no DAP: ``versus`` is ``(mean, low, high)`` of the seed bootstrap, or None where
    either row has fewer than :data:`MIN_SEEDS` seeds (``difference`` then holds the plain difference of means) or
    the row is no DAP itself."""

    label: str
    own: np.ndarray
    beside: np.ndarray
    difference: float | None = None
    versus: tuple[float, float, float] | None = None

    @property
    def gap(self) -> np.ndarray:
        """The beside score minus the own score, per seed (the same checkpoints scored both ways)."""
        return self.beside - self.own

    def resolved(self) -> bool:
        """Whether the beside score's 95% interval against no DAP excludes zero."""
        return self.versus is not None and (self.versus[1] > 0 or self.versus[2] < 0)

    def above(self) -> bool:
        """Whether the beside score is resolved above no DAP's."""
        return self.resolved() and self.versus[0] > 0

    def below(self) -> bool:
        """Whether the beside score is resolved below no DAP's."""
        return self.resolved() and self.versus[0] < 0


def beside_rows(records: list[dict], beside: str) -> list[BesideRow]:
    """Every row whose records all carry both scores, best beside score first, each compared with no DAP."""
    scores = {}
    for label, runs in by_label(records).items():
        pairs = [(final_macro_f1(r), final_macro_f1(r, beside)) for r in runs]
        if all(None not in pair for pair in pairs):
            scores[label] = (np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]))
    baseline = scores.get(NO_DAP)
    rows = []
    for label, (own, second) in sorted(scores.items(), key=lambda item: -item[1][1].mean()):
        row = BesideRow(label, own, second)
        if baseline is not None and label != NO_DAP:
            row = dataclasses.replace(row, difference=float(second.mean() - baseline[1].mean()))
            if min(len(second), len(baseline[1])) >= MIN_SEEDS:
                # a generator per row: its interval does not move when another row gains a seed
                rng = named_generator("beside", beside, label)
                row = dataclasses.replace(row, versus=seed_difference(second, baseline[1], rng))
        rows.append(row)
    return rows


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
    lines = [
        f"### End tasks: {text(other)} beside the {text(own)}",
        "",
        f"Final macro-F1 of the same checkpoints scored both ways (mean ± sd over seeds); the gap is {text(other)}"
        f" minus {text(own)}, per seed; against {code(NO_DAP)}: the {text(other)} score's difference with a 95%"
        " seed-bootstrap interval.",
        "",
        f"| method | n | {text(own)} | {text(other)} | gap | {text(other)} against `{NO_DAP}` |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {code(row.label)} | {len(row.own)} | {_spread(row.own)} | {_spread(row.beside)} | {_spread(row.gap)}"
            f" | {_versus(row)} |"
        )
    lines.append("")
    if any(row.label == NO_DAP for row in rows):
        named = ", ".join(code(label) for label in beating_no_dap(rows))
        scored = text(protocol_short({"protocol": beside}))
        lines.append(
            f"Beating `{NO_DAP}` on {scored} end tasks beyond seed noise: {named}."
            if named
            else f"No method beats `{NO_DAP}` on {scored} end tasks beyond seed noise."
        )
        lines.append("")
    return lines


def _versus(row: BesideRow) -> str:
    """A row's table cell against no DAP."""
    if row.versus is not None:
        mean, low, high = row.versus
        return f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]{' resolved' if row.resolved() else ''}"
    if row.difference is not None:
        return f"{row.difference:+.2f} (one seed: seed noise not measured)"
    return "–"


def _spread(values: np.ndarray) -> str:
    """``mean ± sd`` over seeds (the sd left out for one seed)."""
    if len(values) < 2:
        return f"{values.mean():.2f}"
    return f"{values.mean():.2f} ± {values.std(ddof=1):.2f}"
