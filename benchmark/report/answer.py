"""The leaderboard's short answer (issue #46): "which method should I use to continually pre-train my model, and
what does it cost?", in a few sentences generated from one group's resolved verdicts, never written by hand.

The group is the real-data masked-model group with the most method rows (its budget is stated first, since an
answer holds only at the budget it was measured at); the synthetic world and the CI key numbers never answer. Every
claim is a verdict the one comparison (:mod:`benchmark.report.comparison`: seeds and evaluation sample in one
standard error) resolves against naive continual DAP (``ncl``'s role) or no DAP (``none``'s role), as in the group's
own reading. Only continual methods that trained can be the answer:
rows flagged as untrained are left out, and so are the bounds a continual method is measured against, which need
every domain's data at once (joint training on the union, ``pool``; the oracle that re-trains on all data seen so far,
``oracle``).

This module finds what the answer says, as typed findings (:class:`Budget`, :class:`Winners`, :class:`EndTaskFinding`,
:class:`RungFinding`, :class:`BesideFinding`); its words are the macros of ``templates/answer.md.j2``
(:func:`benchmark.report.words.say`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmark.families import MASKED_LM
from benchmark.protocols import protocol_short, protocol_words
from benchmark.report.beside import (
    MIN_SEEDS,
    NO_DAP,
    BesideRow,
    beating_no_dap,
    beside_protocols,
    beside_rows,
    unmeasured_note,
)
from benchmark.report.end_task_reading import measuring_comparisons
from benchmark.report.frame import GENERATED_WORLD, column_header, tokens_per_domain, untrained_flag
from benchmark.report.reading import column_of
from benchmark.report.speed import same_machine_speed
from benchmark.report.statistics import Comparison, GroupStatistics
from benchmark.report.words import say

TEMPLATE = "answer.md.j2"
"""The template that holds the answer's words."""

NOT_AN_ANSWER = (GENERATED_WORLD, "ci")
"""Profiles whose groups never answer: a generated world, and the CI key numbers."""


def answering_group(sections: list[tuple]) -> tuple | None:
    """The ``(group, statistics)`` the short answer reads: the real-data masked-model group with the most method rows
    (then the most records), or None where no group answers."""
    candidates = [(g, s) for g, s, _ in sections if _answers(g)]
    if not candidates:
        return None
    return max(candidates, key=lambda gs: (len(set(gs[1].part["method"])), len(gs[1].records)))


@dataclass(frozen=True)
class Budget:
    """A group's budget: DAP updates of ``batch_size`` x ``seq_len`` tokens per domain, its profile, and the distinct
    seed counts of its rows (sorted: one count where every row has as many seeds)."""

    steps: int
    batch_size: int
    seq_len: int
    tokens: int
    profile: str
    seed_counts: tuple[int, ...]


def budget_of(records: list[dict]) -> Budget:
    """The :class:`Budget` a group's ``records`` share."""
    first = records[0]
    dap = first["config"]["dap"]
    tokens = tokens_per_domain(first)
    return Budget(dap["steps"], dap["batch_size"], dap["seq_len"], tokens, first["profile"], _seed_counts(records))


@dataclass(frozen=True)
class Winners:
    """The summary's first finding: the trained rows that forget least and keep general knowledge best among those
    that learn each domain as well as ``naive`` (None where no row is resolved), their DAP speed against ``naive``'s
    on one machine, and, where a rung below was read, which of the claims it does not resolve too."""

    budget: Budget
    naive: str
    forgets: Comparison | None
    keeps: Comparison | None
    ratios: dict[str, float] = field(default_factory=dict)
    below_steps: int | None = None
    failed: tuple[tuple[str, str], ...] = ()
    """``(label, metric)`` of each claim the rung below does not resolve."""


@dataclass(frozen=True)
class BesideFinding:
    """What a protocol scored beside the group's own says against no DAP: rows above it, rows below it, and (where
    none beats it) the closest row or why none is measured. For the summary (``steps``, ``scored``, names) and the
    detailed line (the rows themselves, their seeds and the gap between the two protocols)."""

    scored: str
    steps: int
    no_dap: str
    beats: list[str]
    below_rows: list[BesideRow]
    unmeasured: str
    seed_counts: tuple[int, ...] = ()
    own: str = ""
    closest: BesideRow | None = None
    highest: BesideRow | None = None
    lowest: BesideRow | None = None
    min_seeds: int = MIN_SEEDS

    @property
    def below(self) -> list[str]:
        """The labels of the rows resolved below no DAP."""
        return [row.label for row in self.below_rows]


@dataclass(frozen=True)
class EndTaskFinding:
    """The summary's end-task finding: rows above no DAP under the group's own ``protocol`` (its words), then what
    each protocol scored beside it at the top rung says."""

    no_dap: str
    protocol: str
    above: list[str]
    besides: list[BesideFinding]


@dataclass(frozen=True)
class RungFinding:
    """A compared rung of the ladder against its bottom rung: its budget, the rows both measure, those left out as
    untrained at either budget, and Kendall's tau of the shared rows on each of :data:`LADDER_METRICS`."""

    steps: int
    tokens: int
    key: str
    seed_counts: tuple[int, ...]
    shared: list[str]
    left: list[str]
    taus: list


def short_answer(sections: list[tuple], readings: list = (), summary: str | None = None) -> list[str]:
    """The answer's lines (empty where no group can give one), from the ``(group, statistics, plots)`` sections and
    the report's budget-ladder ``readings`` (:func:`benchmark.report.ladder.read_ladder`: whether it holds beyond its
    budget), opening with its ``summary`` (:func:`answer_summary` of the same, made here where not given)."""
    found = answering_group(sections)
    if found is None:
        return []
    group, stats = found
    naive, none = stats.references.get("naive_continual"), stats.references.get("no_dap")
    if naive is None:
        return []
    lead = say(TEMPLATE, "lead", budget_of(group.records), group.key, naive)
    named: list[str] = []
    claims = _best(stats, naive, "forgetting", named) + _best(stats, naive, "general rise", named)
    rest = _end_tasks(stats, none) + _beyond_budget(readings, group.key, named)
    summary = answer_summary(sections, readings) if summary is None else summary
    # the claims against ncl nest under the line that states their budget and reference; four spaces, so that
    # Python-Markdown (the site) nests them as GitHub does
    items = [f"- {lead}", *[f"    - {line}" for line in claims], *[f"- {line}" for line in rest]]
    return [say(TEMPLATE, "heading"), "", summary, "", say(TEMPLATE, "in_detail"), "", *items, ""]


def answer_summary(sections: list[tuple], readings: list = ()) -> str:
    """The short answer in three or four sentences (the README's first screen; the leaderboard's section opens with
    it, its lines below give every number). It rests on the highest rung of the answering group's budget ladder (one
    pass over each domain, where the ranking means most), an ordering stated plainly only where the rung below it
    resolves it too: which method to use and what it costs in speed, what the end tasks say there, and how far the
    quick screen (the answering group's own budget) agrees with it. Without a ladder, on the answering group alone.
    Empty where no group answers."""
    found = answering_group(sections)
    if found is None or "naive_continual" not in found[1].references:
        return ""
    group, stats = found
    naive, none = stats.references["naive_continual"], stats.references.get("no_dap")
    reading = next((r for r in readings if r.ladder.rungs[0].key == group.key), None)
    if reading is None:
        return " ".join(s for s in (_winners_sentence(stats, naive, []), _end_task_sentence(stats, none, None)) if s)
    ladder = reading.ladder
    j = _compared(reading)[-1]
    top, below = ladder.rungs[j], ladder.rungs[j - 1] if j > 1 else None
    naive_top = top.stats.references.get("naive_continual", naive)
    named: list[str] = []
    sentences = [
        _winners_sentence(top.stats, naive_top, named, below=below),
        _end_task_sentence(top.stats, top.stats.references.get("no_dap", none), top),
        _screen_sentence(reading, j, group),
    ]
    return " ".join(sentence for sentence in sentences if sentence)


def winners(stats: GroupStatistics, naive: str, below=None) -> Winners:
    """Which trained row forgets least and which keeps general knowledge best among those that learn each domain as
    well as ``naive`` (resolved, as in :func:`_best`), with their speed; where the rung ``below`` is given, the claims
    it does not resolve too."""
    forgets, _, _ = _leaders(stats, naive, "forgetting")
    keeps, _, _ = _leaders(stats, naive, "general rise")
    speeds = {label: same_machine_speed(stats.records, label, naive) for label in _named(forgets, keeps)}
    ratios = {label: speed.ratio for label, speed in speeds.items() if speed is not None}
    failed = _failed_below(below, naive, forgets, keeps) if below is not None else ()
    steps = below.steps if below is not None else None
    return Winners(budget_of(stats.records), naive, forgets, keeps, ratios, steps, failed)


def _winners_sentence(stats: GroupStatistics, naive: str, named: list[str], below=None) -> str:
    """The :func:`winners` sentence; the winners' labels are added to ``named``."""
    found = winners(stats, naive, below)
    named += _named(found.forgets, found.keeps)
    return say(TEMPLATE, "winners", found)


def _named(*claims: Comparison | None) -> list[str]:
    """The labels of ``claims`` once each, in order (None where no row was resolved: skipped)."""
    return list(dict.fromkeys(c.label for c in claims if c is not None))


def _failed_below(below, naive: str, forgets, keeps) -> tuple[tuple[str, str], ...]:
    """The claims the rung ``below`` does not resolve against ``naive`` too: ``(label, metric)`` each."""
    failed = []
    for claim, title in ((forgets, "forgetting"), (keeps, "general rise")):
        if claim is None:
            continue
        there = {c.label: c for c in below.stats.comparisons(naive, column_of(title))}.get(claim.label)
        if there is None or not (there.resolved() and there.mean < 0):
            failed.append((claim.label, title))
    return tuple(failed)


def _screen_sentence(reading, j: int, group) -> str:
    """The answering group's own budget named as the quick screen, with its measured agreement with rung ``j``."""
    taus = _taus_at(reading, j)
    if not taus:
        return ""
    first = group.records[0]
    rows = len(reading.ladder.shared(0, j))
    return say(TEMPLATE, "screen", first["config"]["dap"]["steps"], first["profile"], rows, taus)


def end_task_finding(stats: GroupStatistics, none: str, top) -> EndTaskFinding:
    """Whether any row beats no DAP on the end tasks under the group's protocol, and under each protocol the ``top``
    rung scores beside its own (its fine-tuning), with the rows resolved below no DAP there."""
    comparisons, _ = measuring_comparisons(stats, none)
    above = [c.label for c in comparisons if c.resolved() and c.mean > 0]
    besides = []
    for beside in [] if top is None else beside_protocols(top.stats.records):
        rows = beside_rows(top.stats.records, beside)
        besides.append(
            BesideFinding(
                protocol_short({"protocol": beside}),
                top.steps,
                NO_DAP,
                beating_no_dap(rows),
                [row for row in rows if row.below()],
                unmeasured_note(rows),
            )
        )
    return EndTaskFinding(none, protocol_words(stats.records[0]["config"]["finetune"]), above, besides)


def _end_task_sentence(stats: GroupStatistics, none: str | None, top) -> str:
    """The :func:`end_task_finding` sentence (nothing without a no-DAP row)."""
    if none is None:
        return ""
    return say(TEMPLATE, "end_task_sentence", end_task_finding(stats, none, top))


def _seed_counts(records: list[dict]) -> tuple[int, ...]:
    """The distinct seed counts of the group's rows, sorted (the comparisons pair each row with the reference by seed,
    so a row's extra seeds do not enter them)."""
    per_row: dict[str, set] = {}
    for record in records:
        per_row.setdefault(record["method_label"], set()).add(record["seed"])
    return tuple(sorted({len(seeds) for seeds in per_row.values()}))


def _answers(group) -> bool:
    first = group.records[0]
    return (
        first["profile"] not in NOT_AN_ANSWER
        and first.get("model_kind", MASKED_LM.name) == MASKED_LM.name
        and not group.orders
    )


BOUNDS = ("joint_training", "retrains_on_seen")
"""Capabilities of a row that is a bound rather than a continual method: it needs every domain's data at once."""


def _candidate(stats: GroupStatistics, label: str) -> bool:
    """Whether the row can be the answer: a continual method (no bound) that pre-trains and whose parameters moved."""
    records = [r for r in stats.records if r["method_label"] == label]
    if not records:
        return False
    caps = records[0]["capabilities"]
    return caps.get("pretrains", True) and not _is_bound(caps) and not untrained_flag(records)


def _is_bound(capabilities: dict) -> bool:
    """Whether a row is a bound a continual method is measured against (:data:`BOUNDS`), not a continual method."""
    return any(capabilities.get(name, False) for name in BOUNDS)


def _leaders(stats: GroupStatistics, naive: str, title: str) -> tuple:
    """``(best, overall, plasticity)``: among the trained rows resolved below ``naive`` on ``title``, the lowest of
    those that learn each domain as well as ``naive`` (plasticity not resolved below it: a row that learns less
    forgets less for that reason alone) and the lowest at any plasticity (either None where there is none), and every
    row's plasticity comparison with ``naive`` by label."""
    plasticity = {c.label: c for c in stats.comparisons(naive, column_of("plasticity"))}
    lower = [c for c in stats.comparisons(naive, column_of(title)) if c.resolved() and c.mean < 0]
    lower = [c for c in lower if _candidate(stats, c.label)]
    learning = [c for c in lower if _learns_as_well(plasticity.get(c.label))]
    best = min(learning, key=lambda c: c.mean) if learning else None
    overall = min(lower, key=lambda c: c.mean) if lower else None
    return best, overall, plasticity


def _best(stats: GroupStatistics, naive: str, title: str, named: list[str]) -> list[str]:
    """The row that lowers ``title`` (forgetting or general rise) most against ``naive`` of those that learn each
    domain as well, with its plasticity and speed, and the one that lowers it most at any plasticity, where another
    (:func:`_leaders`). Each row it names is added to ``named``."""
    best, overall, plasticity = _leaders(stats, naive, title)
    if best is None:
        lines = [say(TEMPLATE, "no_best_line", title, naive)]
    else:
        named.append(best.label)
        speed = same_machine_speed(stats.records, best.label, naive)
        lines = [say(TEMPLATE, "best_line", title, naive, best, plasticity.get(best.label), speed)]
    if overall is not None and overall is not best:
        named.append(overall.label)
        lines.append(say(TEMPLATE, "overall_line", title, naive, overall, plasticity.get(overall.label)))
    return lines


LADDER_METRICS = ("forgetting", "general rise", "plasticity")
"""The metrics whose ranking stability the short answer states (the ones its claims are about)."""


def _beyond_budget(readings: list, key: str, named: list[str]) -> list[str]:
    """Whether the answer holds at larger budgets, on the budget ladder the answering group (``key``) is the bottom
    rung of: a line per higher rung that shares at least 3 compared rows with it (or the top where none does yet),
    with Kendall's tau of those rows on :data:`LADDER_METRICS` and the rows left out as untrained at either budget;
    then the pairwise verdicts that kept, flipped or appeared on the way to the highest of them, and which of the
    answer's ``named`` rows that rung lacks; then, per compared rung whose end tasks were also scored under a
    protocol beside its own, what that protocol says against no DAP (:func:`_beside_line`). Every compared rung is
    stated, so a top rung of few rows so far is read beside a middle one of many. Nothing where the group is no
    ladder's bottom rung."""
    reading = next((r for r in readings if r.ladder.rungs[0].key == key), None)
    if reading is None:
        return []
    ladder, compared = reading.ladder, _compared(reading)
    top = ladder.rungs[compared[-1]]
    steps = [v for v in reading.verdicts if v.rungs[1] <= compared[-1]]
    counts = {kind: sum(v.change == kind for v in steps) for kind in ("kept", "flipped", "appeared")}
    lines = [say(TEMPLATE, "rung_clause", n == 0, rung_finding(reading, j)) for n, j in enumerate(compared)]
    lines.append(say(TEMPLATE, "verdict_counts", top.steps, counts, _lacking(top, named)))
    return lines + [line for j in compared for line in _beside_lines(ladder.rungs[j])]


def rung_finding(reading, j: int) -> RungFinding:
    """What the ladder says of rung ``j`` against its bottom rung (:class:`RungFinding`)."""
    ladder, rung = reading.ladder, reading.ladder.rungs[j]
    return RungFinding(
        rung.steps,
        rung.tokens_per_domain,
        rung.key,
        _seed_counts(rung.stats.records),
        list(ladder.shared(0, j)),
        list(ladder.left_out(0, j)),
        _taus_at(reading, j),
    )


def _taus_at(reading, j: int) -> list:
    """Kendall's tau of rung ``j`` against the bottom rung on each of :data:`LADDER_METRICS`, in that order, those
    that exist (a metric whose rows tie at a budget has none: NaN)."""
    taus = {t.column: t for t in reading.taus if t.rungs == (0, j)}
    return [t for title in LADDER_METRICS if (t := taus.get(title)) is not None and not math.isnan(t.tau)]


def _lacking(rung, named: list[str]) -> list[str]:
    """The ``named`` rows (once each, in order) that ``rung`` has no record of."""
    measured = set(rung.stats.part["method"])
    return [label for label in dict.fromkeys(named) if label not in measured]


def _compared(reading) -> list[int]:
    """The rungs the answer states against the bottom one: those that share enough rows with it for a Kendall's tau,
    or the top rung where none does yet."""
    last = len(reading.ladder.rungs) - 1
    return [j for j in range(1, last + 1) if any(t.rungs == (0, j) for t in reading.taus)] or [last]


def _beside_lines(rung) -> list[str]:
    """What a rung's end tasks say under each protocol beside its own (``finetune.beside``), if any."""
    return [_beside_line(rung, beside) for beside in beside_protocols(rung.stats.records)]


def beside_finding(rung, beside: str) -> BesideFinding:
    """Whether any row's end-task score under the protocol ``beside`` beats no DAP beyond seed noise, the rows
    resolved below it, the closest row where none does, and the rows with the highest and lowest mean gap between
    that score and the group's own protocol's."""
    rows = beside_rows(rung.stats.records, beside)
    compared = [row for row in rows if row.versus is not None]
    gaps = sorted(rows, key=lambda row: row.gap.mean())
    beats = beating_no_dap(rows)
    return BesideFinding(
        scored=protocol_short({"protocol": beside}),
        steps=rung.steps,
        no_dap=NO_DAP,
        beats=beats,
        below_rows=[row for row in rows if row.below()],
        unmeasured=unmeasured_note(rows),
        seed_counts=_seed_counts(rung.stats.records),
        own=protocol_short({"protocol": rung.stats.records[0]["config"]["finetune"]["protocol"]}),
        closest=None if beats else max(compared, key=lambda row: row.versus[0], default=None),
        highest=gaps[-1] if gaps else None,
        lowest=gaps[0] if gaps else None,
    )


def _beside_line(rung, beside: str) -> str:
    """The detailed line of :func:`beside_finding`."""
    return say(TEMPLATE, "beside_line", beside_finding(rung, beside))


def _learns_as_well(c) -> bool:
    """Whether a plasticity comparison exists and is not resolved below the reference (joint training, measured
    only after its one stage, has none: how well it learns each domain in turn is not known)."""
    return c is not None and not (c.resolved() and c.mean < 0)


def _end_tasks(stats: GroupStatistics, none: str | None) -> list[str]:
    """The detailed end-task line: the rows whose final macro-F1 is resolved above no DAP under the group's protocol,
    or why none is (nothing without a no-DAP row)."""
    if none is None:
        return []
    comparisons, unmeasured = measuring_comparisons(stats, none)
    better = [c for c in comparisons if c.resolved() and c.mean > 0]
    protocol = protocol_words(stats.records[0]["config"]["finetune"])
    return [say(TEMPLATE, "end_tasks_line", none, protocol, better, bool(unmeasured and not comparisons))]


ROWS_COLUMNS = ("plasticity", "forgetting", "general rise", "final gain")
"""The loss metrics of a rows table (:func:`rows_table`; the findings page quotes one)."""


def rows_table(stats: GroupStatistics, labels: list[str], first_header: str) -> list[str]:
    """A Markdown table of the named rows of the answering group, in the order given: seeds, then each of
    :data:`ROWS_COLUMNS` as mean ± combined SE of seeds and held-out sample, as the leaderboard shows them. A row that
    is a bound (it needs every domain's data at once) says so; a label the group lacks is named, never left out."""
    columns = [column_of(title) for title in ROWS_COLUMNS]
    lines = [
        f"| {first_header} | seeds | " + " | ".join(column_header(c) for c in columns) + " |",
        "|" + "---|" * (2 + len(columns)),
    ]
    for label in labels:
        runs = [r for r in stats.records if r["method_label"] == label]
        if not runs:
            lines.append(say(TEMPLATE, "rows_missing", label, len(columns)))
            continue
        cells = [stats.cell(label, c) for c in columns]
        seeds = len({r["seed"] for r in runs})
        lines.append(say(TEMPLATE, "rows_row", label, _is_bound(runs[0]["capabilities"]), seeds, cells))
    return lines
