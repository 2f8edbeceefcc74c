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

import numpy as np

from benchmark.protocols import PROTOCOLS, protocol_short
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


def beside_markdown(records: list[dict]) -> list[str]:
    """The group's section on each protocol beside its own (nothing when there is none)."""
    lines = []
    for beside in beside_protocols(records):
        lines += _section(records, beside)
    return lines


def _section(records: list[dict], beside: str) -> list[str]:
    own_name = records[0]["config"]["finetune"].get("protocol", "finetune")
    own, other = _words(own_name), _words(beside)
    rows = {}
    for label, runs in by_label(records).items():
        pairs = [(final_macro_f1(r), final_macro_f1(r, beside)) for r in runs]
        if all(None not in pair for pair in pairs):
            rows[label] = (np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]))
    baseline = rows.get(NO_DAP)
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
    beats = []
    for label, (first, second) in sorted(rows.items(), key=lambda item: -item[1][1].mean()):
        versus = "–"
        if baseline is not None and label != NO_DAP:
            if min(len(second), len(baseline[1])) < MIN_SEEDS:
                versus = f"{second.mean() - baseline[1].mean():+.2f} (one seed: seed noise not measured)"
            else:
                # a generator per row: its interval does not move when another row gains a seed
                rng = named_generator("beside", beside, label)
                mean, low, high = seed_difference(second, baseline[1], rng)
                resolved = low > 0 or high < 0
                versus = f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]{' resolved' if resolved else ''}"
                if resolved and mean > 0:
                    beats.append(label)
        gap = second - first
        lines.append(
            f"| {code(label)} | {len(first)} | {_spread(first)} | {_spread(second)} | {_spread(gap)} | {versus} |"
        )
    lines.append("")
    if baseline is not None:
        named = ", ".join(code(label) for label in beats)
        scored = text(protocol_short({"protocol": beside}))
        lines.append(
            f"Beating `{NO_DAP}` on {scored} end tasks beyond seed noise: {named}."
            if beats
            else f"No method beats `{NO_DAP}` on {scored} end tasks beyond seed noise."
        )
        lines.append("")
    return lines


def _words(name: str) -> str:
    """A protocol in words; its name where it is not installed here."""
    protocol = PROTOCOLS.get(name)
    return protocol.words if protocol is not None else name


def _spread(values: np.ndarray) -> str:
    """``mean ± sd`` over seeds (the sd left out for one seed)."""
    if len(values) < 2:
        return f"{values.mean():.2f}"
    return f"{values.mean():.2f} ± {values.std(ddof=1):.2f}"
