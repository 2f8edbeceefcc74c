"""Verdicts at matched plasticity (issue #85): "better" must not mean "learned less".

A method that learns each domain less forgets less for that reason alone, so a default-strength verdict can reward
a weaker update. Where a group holds a method at three or more strengths of one option (its rows differ only in that
option: ``ncl``, ``ncl[schedule.lr_scale=0.5]``, ``ncl[schedule.lr_scale=2.0]``; or a replay share), those rows trace
the method's stability-plasticity curve: forgetting (or general rise) against plasticity. Another row is then compared
with the curve at its own plasticity: per seed, the curve through that seed's points of the family (linear between
neighbouring strengths, never extrapolated) read at the row's plasticity of that seed, and the row's metric minus it.
Those per-seed differences go through the report's one comparison (:func:`benchmark.report.comparison.paired_test`,
Benjamini-Hochberg over the rows compared with one curve on one metric), whose size the calibration tests measure.
Everything is read from the records (each row's option values from its record), none from what is installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmark.labels import label_method, option_pairs, well_formed
from benchmark.report.comparison import Test, benjamini_hochberg, paired_test
from benchmark.report.escape import code
from benchmark.report.words import say, say_lines

TEMPLATE = "matched.md.j2"
"""The template that holds this reading's words."""

MIN_POINTS = 3
"""Strengths a family needs before it is a curve."""
METRICS = ("forgetting", "general rise")
"""The metrics read at matched plasticity."""


@dataclass(frozen=True)
class Family:
    """A method's rows that differ only in one numeric option, by the option's value."""

    method: str
    option: str
    """``replay.general``, ``schedule.lr_scale``, or a method option's name."""
    rows: tuple[tuple[float, str], ...]
    """``(value, label)``, by value."""

    @property
    def title(self) -> str:
        """``ncl along schedule.lr_scale (0.5, 1, 2)``."""
        values = ", ".join(f"{value:g}" for value, _ in self.rows)
        return f"{code(self.method)} along {self.option} ({values})"


@dataclass(frozen=True)
class MatchedComparison:
    """A row against a family's curve at the row's plasticity, per seed, on one metric."""

    label: str
    metric: str
    n: int
    test: Test
    q: float = 1.0

    def resolved(self, alpha: float = 0.05) -> bool:
        """Whether the difference from the curve is resolved (q below the level)."""
        return self.test.mean != 0 and self.q < alpha


def option_value(record: dict, option: str) -> float | None:
    """The value of ``option`` in a record: a recipe option from its config, else one of its method's options."""
    section, _, key = option.partition(".")
    if key and section in ("replay", "schedule"):
        defaults = {"replay": {}, "schedule": {"lr_scale": 1.0}}[section]
        value = (record.get("config") or {}).get(section, {}).get(key, defaults.get(key))
    else:
        value = (record.get("method_config") or {}).get(option)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def families(records: list[dict]) -> list[Family]:
    """The strength families of a group: per method and option, the rows at the method's defaults except that one
    numeric option, where there are at least :data:`MIN_POINTS` values."""
    labels = {r["method_label"]: r for r in records}
    found: dict[tuple[str, str], dict[float, str]] = {}
    for label, record in labels.items():
        options = _options(label)
        if options is None or len(options) > 1:
            continue
        method = record.get("method", label_method(label))
        for option in options or _axes(record):
            value = option_value(record, option)
            if value is not None:
                found.setdefault((method, option), {})[value] = label
    return [
        Family(method, option, tuple(sorted(rows.items())))
        for (method, option), rows in sorted(found.items())
        if len(rows) >= MIN_POINTS and any(label == method for label in rows.values())
    ]


def _options(label: str) -> list[str] | None:
    """The option keys a label sets (``[]`` for a method at its defaults); None for a label not of that form."""
    return [key for key, _ in option_pairs(label)] if well_formed(label) else None


def _axes(record: dict) -> list[str]:
    """The options a method's default row can anchor a curve along: its numeric method options and the recipe's."""
    own = [key for key, value in (record.get("method_config") or {}).items() if option_value(record, key) is not None]
    return [*own, "replay.general", "replay.past", "schedule.lr_scale"]


def matched(part, family: Family, metric: str) -> list[MatchedComparison]:
    """Every row outside ``family`` against its curve on ``metric`` at the row's plasticity, per seed the family's
    rows and the row share (seeds where the row's plasticity lies outside that seed's curve are left out)."""
    members = [label for _, label in family.rows]
    wide = {
        column: part.pivot_table(index="pair", columns="method", values=column) for column in ("plasticity", metric)
    }
    out = []
    for label in sorted(set(part["method"]) - set(members)):
        differences = []
        for pair in wide["plasticity"].index:
            point = _seed_point(wide, pair, label, members, metric)
            if point is not None:
                differences.append(point)
        test = paired_test(np.array(differences))
        if test is not None:
            out.append(MatchedComparison(label, metric, len(differences), test))
    qs = benjamini_hochberg([c.test.p for c in out])
    return [MatchedComparison(c.label, c.metric, c.n, c.test, q) for c, q in zip(out, qs, strict=True)]


def _seed_point(wide: dict, pair, label: str, members: list[str], metric: str) -> float | None:
    """One seed's difference of ``label`` from the family's curve at its plasticity (None where a value is missing
    or the plasticity lies outside the curve)."""
    plasticity, values = wide["plasticity"], wide[metric]
    needed = [label, *members]
    if any(m not in table.columns or np.isnan(table.at[pair, m]) for m in needed for table in (plasticity, values)):
        return None
    xs = np.array([plasticity.at[pair, m] for m in members])
    ys = np.array([values.at[pair, m] for m in members])
    order = np.argsort(xs)
    x = plasticity.at[pair, label]
    if not xs.min() <= x <= xs.max():
        return None
    return float(values.at[pair, label] - np.interp(x, xs[order], ys[order]))


def matched_markdown(part, records: list[dict]) -> list[str]:
    """The group's section on verdicts at matched plasticity (nothing where the group holds no curve)."""
    found = families(records)
    if not found:
        return []
    lines = [*say_lines(TEMPLATE, "intro"), ""]
    for family in found:
        read = [(metric, matched(part, family, metric)) for metric in METRICS]
        lines += [say(TEMPLATE, "family_line", family.title, metric, results) for metric, results in read if results]
        if any(results for _, results in read):
            continue
        seeds = curve_seeds(part, family)  # a curve no row is read against is still news: say why
        if seeds < 2:
            lines.append(say(TEMPLATE, "few_seeds_line", family.title, seeds))
        else:
            lines.append(say(TEMPLATE, "no_row_line", family.title, *plasticity_span(part, family)))
    return [*lines, ""]


def curve_seeds(part, family: Family) -> int:
    """The seeds (seed-and-order pairs) at which every row of the family is measured: the curve's seeds."""
    members = [label for _, label in family.rows]
    wide = part.pivot_table(index="pair", columns="method", values="plasticity")
    return 0 if not set(members) <= set(wide.columns) else int(wide[members].notna().all(axis=1).sum())


def plasticity_span(part, family: Family) -> tuple[float, float]:
    """The lowest and highest seed-mean plasticity of the family's rows: where its curve lies."""
    means = part[part["method"].isin([label for _, label in family.rows])].groupby("method")["plasticity"].mean()
    return float(means.min()), float(means.max())
