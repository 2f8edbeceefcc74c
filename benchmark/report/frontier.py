"""The fine-tuning protocol's frontier (issue #86): for each fine-tuning setting that scored no-DAP (``none``) records,
what it costs and how small a difference it can resolve, so that the protocol is chosen by measured power per CPU hour
rather than by habit.

``none`` trains nothing, so its records at one setting differ only in the fine-tune's seed (the run seed plus
``finetune.seed_offset``): the spread of their final fine-tuned macro-F1 is the fine-tuning noise alone. Two rows at
3 DAP seeds, whose fine-tuning noise is independent (the audit measured a median correlation of -0.02 between
methods), differ per seed by at least that noise twice over; :attr:`ProtocolPoint.resolvable` is the difference the
report's paired t-test (:mod:`benchmark.report.comparison`) resolves with 80% power at that standard error, a lower
bound that the DAP seeds' own spread can only raise. The cost is a record's end-task time (every cell under every
protocol it scores) in single-thread hours, as the records measured it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from benchmark.report.beside import NO_DAP, final_macro_f1
from benchmark.report.comparison import resolvable_difference
from benchmark.report.frame import backbone_flag
from benchmark.report.speed import machine_of
from benchmark.report.words import say, say_lines

TEMPLATE = "frontier.md.j2"
"""The template that holds the table's words."""

DAP_SEEDS = 3
"""The DAP seeds per row a verdict is drawn from at the top rung (issue #86's unit of power)."""

SEED_FIELDS = ("seed_offset",)
"""``finetune`` settings that choose the fine-tune's seed, not the protocol: records that differ only in them are
replicates of one setting."""


@dataclass(frozen=True)
class ProtocolPoint:
    """One fine-tuning setting as its ``none`` records measured it."""

    profile: str
    """The profile of its records: a frontier compares settings on one base model, data and DAP budget."""
    machine: str
    """Where the records ran (device and threads): hours compare only on one machine."""
    setting: str
    """The protocol in words (``Protocol.describe``)."""
    seeds: int
    macro_f1: float
    """Mean final fine-tuned macro-F1 (percent)."""
    probe: float | None
    """Mean final linear-probe macro-F1 of the same checkpoints (percent), where the probe scored them."""
    noise: float | None
    """Standard deviation of the final fine-tuned macro-F1 over fine-tune seeds (points; None for one seed)."""
    hours: float
    """Mean single-thread hours of a record's end tasks."""
    unmeasured: str
    """The backbone flag of its final cells (empty where every one measures the backbone)."""

    @property
    def resolvable(self) -> float:
        """The smallest difference in final macro-F1 between two rows at :data:`DAP_SEEDS` seeds that the paired
        t-test resolves with 80% power when the fine-tuning noise is all their per-seed differences hold."""
        if self.noise is None:
            return math.inf
        return resolvable_difference(math.sqrt(2) * self.noise / math.sqrt(DAP_SEEDS), DAP_SEEDS - 1)


def fine_tuning(record: dict) -> tuple[bool, str | None]:
    """Whether a record fine-tuned its end tasks, and where: None for its own protocol, ``"finetune"`` for the
    protocol beside it."""
    if record["config"]["finetune"]["protocol"] == "finetune":
        return True, None
    return "finetune" in (record.get("end_tasks_beside") or {}), "finetune"


def protocol_points(records: list[dict]) -> list[ProtocolPoint]:
    """One point per fine-tuning setting among the ``none`` records (settings differing only in the fine-tune seed are
    one), cheapest first."""
    from benchmark.protocols import get_protocol

    settings: dict[str, list[dict]] = {}
    for record in records:
        if record["method_label"] == NO_DAP and fine_tuning(record)[0]:
            ft = {k: v for k, v in record["config"]["finetune"].items() if k not in SEED_FIELDS}
            key = json.dumps([record["profile"], _machine(record), ft], sort_keys=True)
            settings.setdefault(key, []).append(record)
    points = []
    for runs in settings.values():
        beside = fine_tuning(runs[0])[1]
        tuned = np.array([final_macro_f1(r, beside) for r in runs])
        probe = [final_macro_f1(r) for r in runs] if beside else []
        points.append(
            ProtocolPoint(
                profile=runs[0]["profile"],
                machine=_machine(runs[0]),
                setting=get_protocol("finetune").describe(runs[0]["config"]["finetune"]),
                seeds=len(runs),
                macro_f1=float(tuned.mean()),
                probe=float(np.mean(probe)) if probe and None not in probe else None,
                noise=float(tuned.std(ddof=1)) if len(runs) > 1 else None,
                hours=float(np.mean([r["timing"]["phase_seconds"]["end_tasks"] for r in runs])) / 3600,
                unmeasured=backbone_flag(runs, beside),
            )
        )
    return sorted(points, key=lambda p: (p.profile, p.machine, p.hours))


UNNAMED_MACHINE = "a machine the record does not name"
"""The machine of a record that names none: a label its rows share (a key of the table, as a machine's name is)."""


def _machine(record: dict) -> str:
    """Where a record's end tasks were timed, as the speed comparisons name a machine (:func:`machine_of`: its model,
    threads and load class), so that hours are set side by side only where speeds would be."""
    return machine_of(record) or UNNAMED_MACHINE


def frontier(points: list[ProtocolPoint]) -> list[ProtocolPoint]:
    """The points no other point beats on both cost and resolvable difference (the Pareto frontier), among those
    whose final cells measure the backbone."""
    usable = [p for p in points if not p.unmeasured and math.isfinite(p.resolvable)]

    def beaten(p: ProtocolPoint) -> bool:
        rivals = [q for q in usable if q is not p and (q.profile, q.machine) == (p.profile, p.machine)]
        return any(q.hours <= p.hours and q.resolvable < p.resolvable for q in rivals)

    return [p for p in usable if not beaten(p)]


def frontier_markdown(points: list[ProtocolPoint]) -> list[str]:
    """The points as a Markdown table, the frontier marked, with what each column means."""
    if not points:
        return [say(TEMPLATE, "nothing")]
    best = {id(p) for p in frontier(points)}
    lines = say_lines(TEMPLATE, "header", DAP_SEEDS)
    lines += [say(TEMPLATE, "row", p, id(p) in best, math.isfinite) for p in points]
    return [*lines, "", say(TEMPLATE, "legend", DAP_SEEDS)]
