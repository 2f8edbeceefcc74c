"""Whether each row trained what its method trains: the reading names a row whose own parameters barely moved
(:func:`benchmark.metrics.untrained_groups`), and says for every row of negative plasticity how far its parameters
moved, so no such row is ranked silently beside methods that learned."""

from __future__ import annotations

from benchmark.metrics import UNTRAINED_BELOW, untrained_groups
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
            moved = ", ".join(f"its {group} moved at most {size:.1e} of their norm" for group, size in stalled.items())
            lines.append(
                f"- {code(label)} is untrained at this budget: {moved} in a domain (threshold {UNTRAINED_BELOW:g}); its"
                " numbers measure the method's starting point, not what it learns."
            )
        elif plasticity.get(label, 0) < 0 and any(stage.get("trained") for stage in stages):
            lines.append(f"- {code(label)} has negative plasticity ({plasticity[label]:+.3f}): {_moved(stages)}.")
    return lines


def _moved(stages: list[dict]) -> str:
    largest: dict[str, float] = {}
    for stage in stages:
        for group, size in (stage.get("update_sizes") or {}).items():
            if size.get("relative") is not None:
                largest[group] = max(largest.get(group, 0.0), size["relative"])
    if not largest:
        return "its records predate update sizes, so whether its parameters moved is not recorded (re-run to see)"
    moved = ", ".join(f"{group} up to {size:.3g}" for group, size in sorted(largest.items()))
    return f"it trained ({moved} of their norm per domain) and still lost on the domains it trained on"
