"""The budget ladder (issue #46): groups that differ only in ``dap.steps`` are read as rungs of one ladder, with
Kendall's tau of the rows' ranking between rungs and the pairwise verdicts that keep, flip or appear."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import TINY_DAP, TINY_FINETUNE, world_config

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.io import atomic_write_json
from benchmark.report.ladder import kendall_tau


def test_kendall_tau_is_one_for_the_same_order_minus_one_reversed_and_counts_discordant_pairs():
    a = np.array([0.1, 0.5, 0.3, 0.9])
    assert kendall_tau(a, a) == pytest.approx(1.0)
    assert kendall_tau(a, -a) == pytest.approx(-1.0)
    b = np.array([0.1, 0.3, 0.5, 0.9])  # one of the six pairs swapped: (5 - 1) / 6
    assert kendall_tau(a, b) == pytest.approx(4 / 6)
    stacked = kendall_tau(np.stack([a, a]), np.stack([a, b]))  # one tau per leading index
    assert stacked == pytest.approx([1.0, 4 / 6])


@pytest.fixture(scope="module")
def rungs(world_root, tiny_model, tmp_path_factory):
    """none, ncl and one at 2 and 6 updates per domain, seeds 1 and 2, written as two profiles' records; and one
    ncl group at another learning rate (not a rung: it differs in more than the budget)."""
    out = tmp_path_factory.mktemp("ladder")
    config = world_config(world_root, tiny_model, out, TINY_DAP, TINY_FINETUNE)
    cases = [("rung-a", 2, 1e-4, ("none", "ncl", "one")), ("rung-b", 6, 1e-4, ("none", "ncl", "one"))]
    cases.append(("other-lr", 6, 3e-4, ("ncl",)))
    for profile, steps, lr, methods in cases:
        rung = dataclasses.replace(config, profile=profile, dap=dataclasses.replace(config.dap, steps=steps, lr=lr))
        data = prepare_data(rung)
        for method in methods:
            for seed in (1, 2):
                record = continual_run(rung, data, method, seed, show_progress=False).execute()
                atomic_write_json(out / "results" / profile / f"{record['run_id']}.json", record)
    return out


def test_two_groups_that_differ_only_in_budget_are_one_ladder_and_its_reading_is_on_the_leaderboard(rungs):
    from benchmark.report.writer import write_report

    write_report(rungs)
    board = (rungs / "leaderboard.md").read_text()
    section = board[board.index("## Ranking stability across budgets") :]
    assert section.count("### Ladder") == 1  # the other-lr group is not a rung
    assert "2 updates (512 tokens per domain) -> 6 updates (1,536 tokens per domain)" in section
    assert "| plasticity | 2 -> 6 updates | 3 |" in section and "| final macro-F1 | 2 -> 6 updates | 3 |" in section
    assert "resolved pairwise verdicts:" in section
    plots = list((rungs / "results" / "report" / "plots").glob("ladder-*.png"))
    assert len(plots) == 1 and plots[0].stat().st_size > 10_000
    assert f"(results/report/plots/{plots[0].name})" in section
    _the_site_draws_the_ladder_on_each_rungs_page(rungs)


def _the_site_draws_the_ladder_on_each_rungs_page(out):
    import json
    import re

    pages = sorted((out / "results" / "report" / "site").glob("group-*.html"))
    ladders = [
        json.loads(re.search(r'id="chart-data">(.*?)</script>', p.read_text(), re.S).group(1))["ladders"] for p in pages
    ]
    assert sorted(ladder["tokens"] for drawn in ladders for ladder in drawn) == [[512, 1536], [512, 1536]]
    assert sum(not drawn for drawn in ladders) == 1  # both rungs' pages draw it, the other-lr group's does not
    drawn = next(drawn for drawn in ladders if drawn)[0]
    plasticity = drawn["metrics"]["plasticity"]
    assert plasticity and all(len(values) == 2 for values in plasticity.values())  # each row's mean at each rung
    reach = drawn["errors"]["plasticity"]["ncl"]  # its interval's error bars, around a row of two seeds
    assert all(v is not None and v >= 0 for v in reach["plus"] + reach["minus"])
    assert all(up + down > 0 for up, down in zip(reach["plus"], reach["minus"], strict=True))


def test_the_ladder_reading_gives_taus_within_their_intervals_and_verdicts_between_consecutive_rungs(rungs):
    from benchmark.records.store import leaderboard_records
    from benchmark.report.groups import group_records
    from benchmark.report.ladder import find_ladders, read_ladder
    from benchmark.report.markdown import ladder_markdown
    from benchmark.report.writer import group_statistics

    groups, _ = group_records(leaderboard_records(rungs / "results"))
    ladders = find_ladders([(g, group_statistics(g), {}) for g in groups])
    assert len(ladders) == 1 and [r.steps for r in ladders[0].rungs] == [2, 6]
    reading = read_ladder(ladders[0])
    assert ladders[0].labels() == ["ncl", "none", "one"]
    measured = [t for t in reading.taus if not np.isnan(t.tau)]  # a metric on which every row ties has no tau
    assert measured and all(-1 <= t.low <= t.high <= 1 and -1 <= t.tau <= 1 for t in measured)
    assert {v.change for v in reading.verdicts} <= {"kept", "flipped", "appeared"}
    assert all(v.rungs == (0, 1) and v.better != v.worse for v in reading.verdicts)
    # none does not train: its held-out losses are the base model's at every rung
    assert reading.means["plasticity"]["none"][0] == reading.means["plasticity"]["none"][1]
    # Below 3 shared rows there is no ranking to correlate: the section says so instead of an empty table.
    shown = "\n".join(ladder_markdown(dataclasses.replace(reading, taus=[]), None))
    assert "No Kendall's tau yet" in shown and "| metric |" not in shown
    assert "| metric |" in "\n".join(ladder_markdown(reading, None))


def test_the_short_answer_says_whether_it_holds_at_the_top_of_its_ladder(rungs):
    from benchmark.records.store import leaderboard_records
    from benchmark.report.answer import _beyond_budget, _screen_sentence
    from benchmark.report.groups import group_records
    from benchmark.report.ladder import find_ladders, read_ladder
    from benchmark.report.writer import group_statistics

    groups, _ = group_records(leaderboard_records(rungs / "results"))
    sections = [(g, group_statistics(g), {}) for g in groups]
    ladder = find_ladders(sections)[0]
    bottom, top = ladder.rungs[0], ladder.rungs[-1]
    reading = read_ladder(ladder)
    line, verdicts = _beyond_budget([reading], bottom.key, ["ncl", "das", "ncl"])  # a line per rung, then verdicts
    assert line.startswith(f"beyond this budget, at 6 updates per domain (1,536 tokens; group `{top.key}`, 2 seeds)")
    assert "the 3 rows measured at both budgets (`ncl`, `none`, `one`)" in line
    stated = "Kendall's tau of their ranking (95% bias-corrected interval over rows, seeds and sample): "
    assert stated in line and "plasticity +" in line
    kept = sum(v.change == "kept" for v in reading.verdicts)
    assert f"(every metric, up to 6 updates): {kept} kept, " in verdicts
    for t in reading.taus:
        if t.column in ("forgetting", "general rise", "plasticity") and not np.isnan(t.tau):
            assert f"{t.column} {t.tau:+.2f} [{t.low:+.2f}, {t.high:+.2f}]" in line
    assert verdicts.endswith("; not measured at 6 updates yet: `das`")  # the answer's rows the top rung lacks, once
    assert _beyond_budget([reading], top.key, ["ncl"]) == []  # the top rung has nothing above it
    bottom_group = next(g for g in groups if g.key == bottom.key)
    held = _screen_sentence(reading, len(ladder.rungs) - 1, bottom_group)
    assert held.startswith(f"The 2-update {bottom_group.records[0]['profile']} rung is the quick screen for a new")
    assert "over the 3 rows both measure (1 = the same order, 0 = unrelated) is " in held
    for t in reading.taus:  # a metric whose rows tie at a budget has no tau (NaN) and is not stated
        if t.column in ("forgetting", "general rise", "plasticity") and t.rungs == (0, len(ladder.rungs) - 1):
            assert (f"{t.column} {t.tau:+.2f}" in held) == (not np.isnan(t.tau))


def test_a_top_rung_with_fewer_rows_so_far_does_not_shrink_the_comparison_below_it(
    rungs, tmp_path, world_root, tiny_model
):
    import shutil

    from benchmark.records.store import leaderboard_records
    from benchmark.report.answer import _beyond_budget
    from benchmark.report.groups import group_records
    from benchmark.report.ladder import find_ladders, read_ladder
    from benchmark.report.writer import group_statistics

    groups, _ = group_records(leaderboard_records(rungs / "results"))
    (two_rungs,) = find_ladders([(g, group_statistics(g), {}) for g in groups])
    below = read_ladder(two_rungs)
    shutil.copytree(rungs / "results", tmp_path / "results")
    config = world_config(world_root, tiny_model, tmp_path, TINY_DAP, TINY_FINETUNE)
    top = dataclasses.replace(config, profile="rung-c", dap=dataclasses.replace(config.dap, steps=10, lr=1e-4))
    for seed in (1, 2):  # two seeds: resampling them draws random numbers (one seed draws none)
        record = continual_run(top, prepare_data(top), "none", seed, show_progress=False).execute()
        atomic_write_json(tmp_path / "results" / "rung-c" / f"{record['run_id']}.json", record)
    groups, _ = group_records(leaderboard_records(tmp_path / "results"))
    sections = [(g, group_statistics(g), {}) for g in groups]
    (ladder,) = [lad for lad in find_ladders(sections) if len(lad.rungs) == 3]
    assert ladder.labels() == ["none"] and ladder.measured() == ["ncl", "none", "one"]
    reading = read_ladder(ladder)
    assert any(t.rungs == (0, 1) and t.rows == 3 for t in reading.taus)  # the two lower rungs keep their 3 rows
    assert not any(t.rungs[1] == 2 for t in reading.taus)  # one row at the top: no ranking there yet
    # a rung added above leaves the reading of the rungs below as it was, to the last resample
    for title, lower in below.samples.items():
        for kept_rung, rung in zip(reading.samples[title][:2], lower, strict=True):
            np.testing.assert_equal(kept_rung, rung)
    kept = [dataclasses.astuple(t) for t in reading.taus if t.rungs == (0, 1)]
    np.testing.assert_equal(kept, [dataclasses.astuple(t) for t in below.taus])  # NaN (a tie everywhere) equals NaN
    assert [v for v in reading.verdicts if v.rungs == (0, 1)] == below.verdicts
    line, verdicts = _beyond_budget([reading], ladder.rungs[0].key, ["ncl"])
    assert "at 6 updates per domain" in line and "the 3 rows measured at both budgets" in line
    assert "up to 6 updates" in verdicts and "not measured" not in verdicts  # one row up there: no ranking yet

    for method in ("ncl", "one"):  # the top rung now holds the 3 rows: both higher rungs are stated, bottom first
        record = continual_run(top, prepare_data(top), method, 1, show_progress=False).execute()
        atomic_write_json(tmp_path / "results" / "rung-c" / f"{record['run_id']}.json", record)
    groups, _ = group_records(leaderboard_records(tmp_path / "results"))
    (ladder,) = [lad for lad in find_ladders([(g, group_statistics(g), {}) for g in groups]) if len(lad.rungs) == 3]
    middle, highest, verdicts = _beyond_budget([read_ladder(ladder)], ladder.rungs[0].key, ["ncl"])
    assert middle.startswith("beyond this budget, at 6 updates per domain")
    assert highest.startswith("at 10 updates per domain")
    assert "the 3 rows measured at both budgets" in middle and "the 3 rows measured at both budgets" in highest
    assert "up to 10 updates" in verdicts


def test_a_top_rung_that_also_fine_tunes_beside_its_probe_is_still_a_rung_of_the_probe_ladder():
    """The top rung fine-tunes beside its linear probe (``finetune.beside``) at a rate of its own: settings the probe
    does not read leave the rungs one ladder; a setting it reads (``probe_c``) does not."""
    from types import SimpleNamespace

    from benchmark.report.ladder import find_ladders

    def group(key: str, steps: int, **finetune):
        finetune = {"protocol": "linear_probe", **finetune}
        config = {"dap": {"steps": steps, "batch_size": 16, "seq_len": 64}, "finetune": finetune}
        payload = {"config": {"dap": {"steps": steps}, "finetune": finetune}, "model": "m"}
        stats = SimpleNamespace(references={}, part={"method": ["ncl"]})
        record = {"config": config, "method_label": "ncl", "domains": []}
        return SimpleNamespace(key=key, orders=None, payload=payload, records=[record]), stats

    bottom, top = group("mini", 24), group("mini-pass", 288, beside="finetune", lr=3e-4, default_epochs=3)
    (ladder,) = find_ladders([(g, s, {}) for g, s in (bottom, top)])
    assert [r.key for r in ladder.rungs] == ["mini", "mini-pass"]
    other = group("mini-pass-c", 288, probe_c=0.1)
    assert find_ladders([(g, s, {}) for g, s in (bottom, other)]) == []


def test_a_row_flagged_untrained_at_either_budget_is_left_out_of_the_comparison_and_named(rungs):
    """A row whose own parameters did not move at one rung ranks a method that did not train there: the ladder's
    taus, verdicts and short answer leave it out of that rung pair and the section says which row and why."""
    from benchmark.records.store import leaderboard_records
    from benchmark.report.answer import _beyond_budget
    from benchmark.report.groups import group_records
    from benchmark.report.ladder import (
        budget_band,
        budget_series,
        find_ladders,
        ladder_columns,
        read_ladder,
    )
    from benchmark.report.markdown import ladder_markdown
    from benchmark.report.site import _ladder_charts
    from benchmark.report.writer import group_statistics

    groups, _ = group_records(leaderboard_records(rungs / "results"))
    bottom = next(g for g in groups if g.records[0]["profile"] == "rung-a")
    for record in bottom.records:
        if record["method_label"] == "ncl":  # as if ncl's weights had barely moved in any domain at 2 updates
            for stage in record["domains"]:
                stage["update_sizes"] = {"weights": {"parameters": 10, "relative": 1e-5}}
    sections = [(g, group_statistics(g), {}) for g in groups]
    (ladder,) = find_ladders(sections)
    assert ladder.rungs[0].untrained == {"ncl": "untrained: weights ≤ 1.0e-05"} and ladder.rungs[1].untrained == {}
    assert ladder.shared(0, 1) == ["none", "one"]
    assert ladder.left_out(0, 1) == {"ncl": ["untrained: weights ≤ 1.0e-05 at 2 updates"]}
    reading = read_ladder(ladder)
    assert reading.taus == []  # two compared rows are too few for a ranking
    assert all("ncl" not in (v.better, v.worse) for v in reading.verdicts)
    assert reading.means["plasticity"]["ncl"][0] is not None  # still drawn against the budget, only not compared
    line, flagged = budget_series(ladder, "ncl", reading.means["plasticity"]["ncl"], 1.0)
    assert np.isnan(line[0]) and line[1] == reading.means["plasticity"]["ncl"][1]  # no trend through the flagged rung
    assert flagged == [(ladder.rungs[0].tokens_per_domain, reading.means["plasticity"]["ncl"][0])]
    line, flagged = budget_series(ladder, "none", reading.means["plasticity"]["none"], 1.0)
    assert flagged == [] and not np.isnan(line).any()
    # the site draws it alike: a gap in the line, the point apart
    (chart,) = _ladder_charts([reading], ladder.rungs[0].key, {"ncl": "#000", "none": "#111", "one": "#222"})
    point = (ladder.rungs[0].tokens_per_domain, reading.means["plasticity"]["ncl"][0])
    assert chart["metrics"]["plasticity"]["ncl"][0] is None and chart["untrained"]["plasticity"]["ncl"] == [point]
    assert chart["untrained"]["plasticity"].keys() == {"ncl"}
    assert chart["errors"]["plasticity"]["ncl"]["plus"][0] is None  # no interval where no line
    # the band around a row's line: gapped where the line is, and holding the row's mean where it is drawn
    (plasticity,) = [c for c in ladder_columns() if c.title == "plasticity"]
    low, high = budget_band(reading, plasticity, "ncl", 1.0)
    assert np.isnan(low[0]) and np.isnan(high[0])
    assert low[1] <= reading.means["plasticity"]["ncl"][1] <= high[1] and low[1] < high[1]
    section = "\n".join(ladder_markdown(reading, None))
    assert "No Kendall's tau yet" in section
    assert (
        "Left out of 2 -> 6 updates, as a budget did not train them: `ncl` (untrained: weights ≤ 1.0e-05 at 2 updates)."
        in section
    )
    line, _ = _beyond_budget([reading], ladder.rungs[0].key, ["ncl"])
    assert "the 2 rows measured at both budgets (`none`, `one`) (left out as untrained at a budget: `ncl`)" in line
