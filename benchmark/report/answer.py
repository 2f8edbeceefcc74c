"""The leaderboard's short answer (issue #46): "which method should I use to continually pre-train my model, and
what does it cost?", in a few sentences generated from one group's resolved verdicts, never written by hand.

The group is the real-data masked-model group with the most method rows (its budget is stated first, since an
answer holds only at the budget it was measured at); the synthetic world and the CI key numbers never answer. Every
claim is a verdict the seeds and the evaluation sample both resolve against naive continual DAP (``ncl``'s role) or
no DAP (``none``'s role), as in the group's own reading. Only continual methods that trained can be the answer:
rows flagged as untrained are left out, and so are the bounds a continual method is measured against, which need
every domain's data at once (joint training on the union, ``pool``; the oracle that re-trains on all data seen so far,
``oracle``).
"""

from __future__ import annotations

import math

from benchmark.families import MASKED_LM
from benchmark.protocols import protocol_short, protocol_words
from benchmark.report.beside import (
    MIN_SEEDS,
    NO_DAP,
    beating_no_dap,
    beside_protocols,
    beside_rows,
    unmeasured_note,
)
from benchmark.report.end_task_reading import measuring_comparisons
from benchmark.report.escape import code, text
from benchmark.report.frame import GENERATED_WORLD, column_header, tokens_per_domain, untrained_flag
from benchmark.report.reading import column_of
from benchmark.report.speed import same_machine_speed
from benchmark.report.statistics import GroupStatistics

NOT_AN_ANSWER = (GENERATED_WORLD, "ci")
"""Profiles whose groups never answer: a generated world, and the CI key numbers."""


def answering_group(sections: list[tuple]) -> tuple | None:
    """The ``(group, statistics)`` the short answer reads: the real-data masked-model group with the most method rows
    (then the most records), or None where no group answers."""
    candidates = [(g, s) for g, s, _ in sections if _answers(g)]
    if not candidates:
        return None
    return max(candidates, key=lambda gs: (len(set(gs[1].part["method"])), len(gs[1].records)))


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
    first = group.records[0]
    dap = first["config"]["dap"]
    tokens = tokens_per_domain(first)
    lead = (
        f"At {dap['steps']} DAP updates of {dap['batch_size']} x {dap['seq_len']} tokens per domain ({tokens:,} tokens;"
        f" group {code(group.key)}, {first['profile']} profile, {_seeds(group.records)}), against naive continual DAP"
        f" ({code(naive)}), resolved with seeds and held-out sample in one test:"
    )
    named: list[str] = []
    claims = _best(stats, naive, "forgetting", "forgets least", "less", named)
    claims += _best(stats, naive, "general rise", "keeps general knowledge best", "less general-loss rise", named)
    rest = _end_tasks(stats, none) + _beyond_budget(readings, group.key, named)
    summary = answer_summary(sections, readings) if summary is None else summary
    # the claims against ncl nest under the line that states their budget and reference; four spaces, so that
    # Python-Markdown (the site) nests them as GitHub does
    items = [f"- {lead}", *[f"    - {line}" for line in claims], *[f"- {line}" for line in rest]]
    return ["## The short answer", "", summary, "", "In detail:", "", *items, ""]


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


def _budget(records: list[dict]) -> str:
    dap, first = records[0]["config"]["dap"], records[0]
    return (
        f"{dap['steps']} updates of {dap['batch_size']} x {dap['seq_len']} tokens per domain ({first['profile']}"
        f" profile, {_seeds(records)})"
    )


def _winners_sentence(stats: GroupStatistics, naive: str, named: list[str], below=None) -> str:
    """Which trained row forgets least and which keeps general knowledge best among those that learn each domain as
    well as ``naive`` (resolved, as in :func:`_best`), with its speed; their labels are added to ``named``. Where the
    rung ``below`` is given, a claim it does not resolve too is said to hold at this budget only."""
    budget = _budget(stats.records)
    forgets, _, _ = _leaders(stats, naive, "forgetting")
    keeps, _, _ = _leaders(stats, naive, "general rise")
    among = f"of the methods that learn each domain as well as naive continual DAP ({code(naive)})"
    if forgets is None and keeps is None:
        return f"At {budget}, no method {among} is resolved to forget less or to keep general knowledge better."
    if forgets is not None and keeps is not None and forgets.label == keeps.label:
        claims = (
            f"{code(forgets.label)} forgets least and keeps general knowledge best ({abs(forgets.mean):.2f} nats less"
            f" forgetting and {abs(keeps.mean):.2f} less general-loss rise than {code(naive)})"
        )
    else:
        parts = []
        if forgets is not None:
            parts.append(f"{code(forgets.label)} forgets least ({abs(forgets.mean):.2f} nats less than {code(naive)})")
        if keeps is not None:
            parts.append(
                f"{code(keeps.label)} keeps general knowledge best ({abs(keeps.mean):.2f} nats less general-loss rise)"
            )
        claims = " and ".join(parts)
    winners = list(dict.fromkeys(c.label for c in (forgets, keeps) if c is not None))
    named += winners
    speeds = {label: same_machine_speed(stats.records, label, naive) for label in winners}
    ratios = {label: speed.ratio for label, speed in speeds.items() if speed is not None}
    if len(ratios) == 1:
        cost = f", training at {next(iter(ratios.values())):.2f}x {code(naive)}'s DAP tokens per second"
    elif ratios:
        pace = ", ".join(f"{code(label)} at {ratio:.2f}x" for label, ratio in ratios.items())
        cost = f" ({pace} {code(naive)}'s DAP tokens per second)"
    else:
        cost = ""
    return f"At {budget}, {among}, {claims}{cost}{_held_below(below, naive, forgets, keeps)}."


def _held_below(below, naive: str, forgets, keeps) -> str:
    """Whether the rung ``below`` resolves the same claims against ``naive`` (the ordering holds at the two highest
    rungs), or which it does not."""
    if below is None:
        return ""
    failed = []
    for claim, title in ((forgets, "forgetting"), (keeps, "general rise")):
        if claim is None:
            continue
        there = {c.label: c for c in below.stats.comparisons(naive, column_of(title))}.get(claim.label)
        if there is None or not (there.resolved() and there.mean < 0):
            failed.append(f"{code(claim.label)} on {title}")
    if not failed:
        return f"; the same holds at {below.steps} updates"
    return f"; at {below.steps} updates this is not resolved for {', '.join(failed)}, so it holds at this budget only"


def _screen_sentence(reading, j: int, group) -> str:
    """The answering group's own budget named as the quick screen, with its measured agreement with rung ``j``."""
    steps = group.records[0]["config"]["dap"]["steps"]
    stated = [f"{t.column} {t.tau:+.2f}{t.zero_note()}" for t in _taus_at(reading, j)]
    if not stated:
        return ""
    rows = len(reading.ladder.shared(0, j))
    return (
        f"The {steps}-update {group.records[0]['profile']} rung is the quick screen for a new method: Kendall's tau"
        f" between its ranking and this one's over the {rows} rows both measure (1 = the same order, 0 = unrelated)"
        f" is {_names(stated, quote=False)}."
    )


def _end_task_sentence(stats: GroupStatistics, none: str | None, top) -> str:
    """Whether any row beats no DAP on the end tasks under the answering group's protocol, and under a protocol the
    ``top`` rung scores beside its own (its fine-tuning), with the rows resolved below no DAP there."""
    if none is None:
        return ""
    comparisons, _ = measuring_comparisons(stats, none)
    above = [c.label for c in comparisons if c.resolved() and c.mean > 0]
    protocol = protocol_words(stats.records[0]["config"]["finetune"])
    clauses = [
        f"{_names(above)} {_verb(above, 'scores', 'score')} above no DAP ({code(none)}) ({protocol}) at that budget"
        if above
        else f"no method's score ({protocol}) is separated from no DAP ({code(none)}) at that budget"
    ]
    for beside in [] if top is None else beside_protocols(top.stats.records):
        rows = beside_rows(top.stats.records, beside)
        beats = beating_no_dap(rows)
        below = [row.label for row in rows if row.below()]
        scored = protocol_short({"protocol": beside})
        where = f"{scored} at {top.steps} updates per domain"
        said = (
            f"{where}, {_names(beats)} {_verb(beats, 'beats', 'beat')} it beyond seed noise"
            if beats
            else f"{where}, no method beats it beyond seed noise"
        )
        if not beats and (unmeasured := unmeasured_note(rows)):
            said = f"{where}, {unmeasured}"
        clauses.append(said + (f" and {_names(below)} {_verb(below, 'scores', 'score')} below it" if below else ""))
    return "On the end tasks, " + "; ".join(clauses) + "."


def _verb(items: list, one: str, many: str) -> str:
    """The verb that agrees with a list of ``items`` as its subject."""
    return one if len(items) == 1 else many


def _names(items: list[str], quote: bool = True) -> str:
    """``a``, ``a and b``, ``a, b and c`` (each in code spans where ``quote``)."""
    shown = [code(item) if quote else item for item in items]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def _seeds(records: list[dict]) -> str:
    """How many seeds the group's rows have: ``3 seeds``, or ``3-5 seeds per row`` where rows differ (the comparisons
    pair each row with the reference by seed, so a row's extra seeds do not enter them)."""
    per_row: dict[str, set] = {}
    for record in records:
        per_row.setdefault(record["method_label"], set()).add(record["seed"])
    counts = sorted({len(seeds) for seeds in per_row.values()})
    if len(counts) > 1:
        return f"{counts[0]}-{counts[-1]} seeds per row"
    return f"{counts[0]} seed{'' if counts[0] == 1 else 's'}"


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


def _best(stats: GroupStatistics, naive: str, title: str, says: str, unit: str, named: list[str]) -> list[str]:
    """The row that lowers ``title`` most against ``naive`` of those that learn each domain as well, with its
    plasticity and speed, and the one that lowers it most at any plasticity, where another (:func:`_leaders`). Each
    row it names is added to ``named``."""
    best, overall, plasticity = _leaders(stats, naive, title)
    lines = []
    if best is not None:
        named.append(best.label)
        cost = _learning(plasticity.get(best.label), naive) + _speed(stats, best.label, naive)
        lines.append(
            f"{code(best.label)} {says} of the rows that learn each domain as well as {code(naive)}:"
            f" {abs(best.mean):.3f} nats {unit} than {code(naive)}{cost}"
        )
    else:
        lines.append(f"no row that learns as well as {code(naive)} is resolved better on {title}")
    if overall is not None and overall is not best:
        named.append(overall.label)
        lines.append(
            f"at any plasticity, {code(overall.label)}: {abs(overall.mean):.3f} nats {unit}"
            f"{_learning(plasticity.get(overall.label), naive)}"
        )
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
    missing = _lacking(top, named)
    lacking = f"; not measured at {top.steps} updates yet: {', '.join(code(m) for m in missing)}" if missing else ""
    lines = [("beyond this budget, " if n == 0 else "") + _rung_clause(reading, j) for n, j in enumerate(compared)]
    lines.append(
        f"pairwise verdicts resolved at consecutive budgets (every metric, up to {top.steps} updates):"
        f" {', '.join(f'{n} {kind}' for kind, n in counts.items())}{lacking}"
    )
    return lines + [line for j in compared for line in _beside_lines(ladder.rungs[j])]


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


def _beside_line(rung, beside: str) -> str:
    """Whether any row's end-task score under the protocol ``beside`` beats no DAP beyond seed noise, the rows
    resolved below it, and the range of the gap between that score and the group's own protocol's."""
    rows = beside_rows(rung.stats.records, beside)
    scored, own = protocol_short({"protocol": beside}), rung.stats.records[0]["config"]["finetune"]["protocol"]
    beats, compared = beating_no_dap(rows), [row for row in rows if row.versus is not None]
    if beats:
        verdict = f"above no DAP ({code(NO_DAP)}) beyond seed noise: {', '.join(code(b) for b in beats)}"
    else:
        best = max(compared, key=lambda row: row.versus[0], default=None)
        closest = f" (closest: {code(best.label)} {_interval(best)})" if best is not None else ""
        verdict = f"no method beats no DAP ({code(NO_DAP)}) beyond seed noise{closest}"
        if best is None and (unmeasured := unmeasured_note(rows)):
            verdict = unmeasured
    below = [row for row in rows if row.below()]
    worse = f"; below it: {', '.join(f'{code(row.label)} {_interval(row)}' for row in below)}" if below else ""
    intervals = f"95% t intervals paired by seed, q-values over the rows, rows of {MIN_SEEDS} seeds or more"
    return (
        f"at {rung.steps} updates per domain the end tasks are also {scored} ({_seeds(rung.stats.records)};"
        f" {intervals}): {verdict}{worse}{_gap_range(rows, scored, own)}"
    )


def _gap_range(rows: list, scored: str, own: str) -> str:
    """The range over rows of the mean gap between the beside score and the own protocol's."""
    if not rows:
        return ""
    gaps = sorted(rows, key=lambda row: row.gap.mean())
    high, low = gaps[-1], gaps[0]
    return (
        f"; {scored} minus {protocol_short({'protocol': own})} macro-F1: {high.gap.mean():+.2f} ({code(high.label)})"
        f" to {low.gap.mean():+.2f} ({code(low.label)}) points"
    )


def _interval(row) -> str:
    mean, low, high = row.versus
    return f"{mean:+.2f} [{low:+.2f}, {high:+.2f}] points, q={row.q:.2g}"


def _rung_clause(reading, j: int) -> str:
    """What the ladder says of rung ``j`` against its bottom rung: its budget, the rows both compare (and those left
    out as untrained), and Kendall's tau of those rows on :data:`LADDER_METRICS`."""
    ladder, rung = reading.ladder, reading.ladder.rungs[j]
    shared, left = ladder.shared(0, j), ladder.left_out(0, j)
    stated = [f"{t.column} {t.tau:+.2f} [{t.low:+.2f}, {t.high:+.2f}]{t.zero_note()}" for t in _taus_at(reading, j)]
    order = (
        f"Kendall's tau of their ranking (95% bias-corrected interval over rows, seeds and sample): {', '.join(stated)}"
        if stated
        else "too few rows for a Kendall's tau"
    )
    untrained = f" (left out as untrained at a budget: {', '.join(code(m) for m in left)})" if left else ""
    return (
        f"at {rung.steps} updates per domain ({rung.tokens_per_domain:,} tokens; group {code(rung.key)},"
        f" {_seeds(rung.stats.records)}), the {len(shared)} rows measured at both budgets"
        f" ({', '.join(code(s) for s in shared)}){untrained}: {order}"
    )


def _learns_as_well(c) -> bool:
    """Whether a plasticity comparison exists and is not resolved below the reference (joint training, measured
    only after its one stage, has none: how well it learns each domain in turn is not known)."""
    return c is not None and not (c.resolved() and c.mean < 0)


def _learning(c, naive: str) -> str:
    """What the row pays (or gains) in plasticity against ``naive``."""
    if c is None:
        return ""
    if not c.resolved():
        return f", its plasticity not separated from {code(naive)}'s"
    return f", learning {abs(c.mean):.3f} nats {'more' if c.mean > 0 else 'less'} of each domain"


def _speed(stats: GroupStatistics, label: str, naive: str) -> str:
    """What the row's DAP costs in speed against ``naive``, only between runs on the same machine."""
    found = same_machine_speed(stats.records, label, naive)
    if found is None:
        return f", its speed not measured on a machine of {code(naive)}'s runs"
    return (
        f", at {found.ratio:.2f}x its DAP tokens per second ({found.runs} against {found.reference_runs} runs on"
        f" {text(found.machine)})"
    )


def _end_tasks(stats: GroupStatistics, none: str | None) -> list[str]:
    if none is None:
        return []
    comparisons, unmeasured = measuring_comparisons(stats, none)
    better = [c for c in comparisons if c.resolved() and c.mean > 0]
    if unmeasured and not comparisons:
        return [
            f"on the end tasks no verdict against no DAP ({code(none)}): the cells compared do not measure the backbone"
        ]
    if not better:
        protocol = protocol_words(stats.records[0]["config"]["finetune"])
        return [
            f"on the end tasks ({protocol}) no method's"
            f" final macro-F1 is separated from no DAP ({code(none)}) at this budget"
        ]
    named = ", ".join(f"{code(c.label)} (+{100 * c.mean:.2f} points)" for c in better)
    return [f"on the end tasks, final macro-F1 above no DAP ({code(none)}): {named}"]


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
            lines.append(f"| {code(label)} (no record in this group) | 0 |" + " – |" * len(columns))
            continue
        bound = " (a bound, not a method)" if _is_bound(runs[0]["capabilities"]) else ""
        cells = [stats.cell(label, c) for c in columns]
        lines.append(f"| {code(label)}{bound} | {len({r['seed'] for r in runs})} | " + " | ".join(cells) + " |")
    return lines
