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
from benchmark.report.escape import code
from benchmark.report.statistics import GroupStatistics


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
            lines.append(
                f"- {code(label)} is untrained at this budget: {'; '.join(_stalled(g, v) for g, v in stalled.items())}."
                f" Its numbers measure the method's starting point more than what it learns{_gates(stages)}."
            )
        elif plasticity.get(label, 0) < 0 and any(stage.get("trained") for stage in stages):
            lines.append(f"- {code(label)} has negative plasticity ({plasticity[label]:+.3f}): {_moved(stages)}.")
    unmeasured = [label for label, records in sorted(by_label.items()) if _predates_update_sizes(records)]
    if unmeasured:
        lines.append(
            f"- Whether these rows' parameters moved is not recorded yet (records made before update sizes were"
            f" measured; `dapbench reproduce RECORD --stages-only` measures them): {', '.join(map(code, unmeasured))}."
        )
    return lines


def _predates_update_sizes(records: list[dict]) -> bool:
    """Whether any trained stage of ``records`` lacks its update sizes."""
    return any(s.get("trained") and "update_sizes" not in s for record in records for s in record["domains"])


def _stalled(group: str, value: float) -> str:
    if group == GATE_DECISIONS:
        return (
            f"at most {100 * value:.1f}% of its gate decisions changed in a domain (threshold"
            f" {100 * GATES_UNLEARNED_BELOW:g}%)"
        )
    return f"its {group} moved at most {value:.1e} of their norm in a domain (threshold {UNTRAINED_BELOW:g})"


def _gates(stages: list[dict]) -> str:
    """``; its masks keep 51% of units`` for a gated method (the share of units its last domain's mask keeps)."""
    open_shares = [s["method_report"]["gates_open"] for s in stages if "gates_open" in (s.get("method_report") or {})]
    return (
        f" (its masks keep {100 * min(open_shares):.0f}-{100 * max(open_shares):.0f}% of the units)"
        if open_shares
        else ""
    )


def _moved(stages: list[dict]) -> str:
    largest = largest_update_sizes(stages)
    if not largest:
        return "its records predate update sizes, so whether its parameters moved is not recorded yet"
    moved = ", ".join(f"{group} up to {size:.3g}" for group, size in sorted(largest.items()))
    return f"it trained ({moved} of their norm per domain) and still lost on the domains it trained on"
