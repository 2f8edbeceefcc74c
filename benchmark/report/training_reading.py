"""Whether each row trained what its method trains: the reading names a row whose own parameters barely moved
(:func:`benchmark.metrics.untrained_groups`), and says for every row of negative plasticity how far its parameters
moved, so no such row is ranked silently beside methods that learned."""

from __future__ import annotations

from benchmark.metrics import (
    GATE_DECISIONS,
    GATES_UNLEARNED_BELOW,
    UNTRAINED_BELOW,
    largest_update_sizes,
    untrained_groups,
)
from benchmark.report.statistics import GroupStatistics
from benchmark.report.words import say

TEMPLATE = "training.md.j2"
"""The template that holds the training reading's words."""
THRESHOLDS = {
    "GATE_DECISIONS": GATE_DECISIONS,
    "GATES_UNLEARNED_BELOW": GATES_UNLEARNED_BELOW,
    "UNTRAINED_BELOW": UNTRAINED_BELOW,
}
"""The flags' names and thresholds the template states (:mod:`benchmark.metrics` defines them)."""


def training_reading(stats: GroupStatistics) -> list[str]:
    """One line per row that did not train at this budget, and per row of negative plasticity: what moved."""
    by_label: dict[str, list[dict]] = {}
    for record in stats.records:
        by_label.setdefault(record["method_label"], []).append(record)
    plasticity = stats.part.groupby("method")["plasticity"].mean()
    lines = []
    for label, records in sorted(by_label.items()):
        stages = [stage for record in records for stage in record["domains"]]
        stalled = untrained_groups(stages)
        if stalled:
            lines.append(say(TEMPLATE, "untrained", label, list(stalled.items()), _open_shares(stages), THRESHOLDS))
        elif plasticity.get(label, 0) < 0 and any(stage.get("trained") for stage in stages):
            largest = sorted(largest_update_sizes(stages).items())
            lines.append(say(TEMPLATE, "negative_plasticity", label, plasticity[label], largest))
    unmeasured = [label for label, records in sorted(by_label.items()) if _predates_update_sizes(records)]
    if unmeasured:
        lines.append(say(TEMPLATE, "unmeasured", unmeasured))
    return lines


def _predates_update_sizes(records: list[dict]) -> bool:
    """Whether any trained stage of ``records`` lacks its update sizes."""
    return any(s.get("trained") and "update_sizes" not in s for record in records for s in record["domains"])


def _open_shares(stages: list[dict]) -> list[float]:
    """The share of units each domain's mask keeps, for a gated method (empty for any other)."""
    return [s["method_report"]["gates_open"] for s in stages if "gates_open" in (s.get("method_report") or {})]
