"""The report pipeline: groups from content, intervals that include the evaluation sample, verdicts that need both
seeds and sample, escaped rendering, incremental writing that touches only its own files."""

import copy
import dataclasses
import json
import os
import re

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import accuracy_score, f1_score

from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_json
from benchmark.metrics import record_loss_metrics
from benchmark.records.identity import RESULTS_VERSION
from benchmark.records.store import load_records
from benchmark.report.comparison import paired_test
from benchmark.report.end_task_reading import end_task_reading
from benchmark.report.escape import code, printable, text
from benchmark.report.frame import leaderboard_frame, loss_columns, reference_labels
from benchmark.report.groups import group_records
from benchmark.report.markdown import leaderboard_markdown
from benchmark.report.reading import column_of, option_parents, sibling_reading, variant_reading, verdicts
from benchmark.report.statistics import EvaluationSample, GroupStatistics, adjust_for_multiplicity, weighted_scores
from benchmark.report.summary import terminal_summary
from benchmark.report.writer import group_statistics, write_report


@pytest.fixture(scope="module")
def records(report_records):
    """none, ncl and das over two domains, seeds 1-3 (conftest's ``report_records``)."""
    return report_records


def test_records_of_other_settings_inputs_or_numerics_never_share_a_group(records):
    (group,), superseded = group_records(records)
    assert len(group.records) == 9 and not superseded
    other_lr = copy.deepcopy(records[3])
    other_lr["config"]["dap"]["lr"] = 3e-4
    other_data = copy.deepcopy(records[4])
    other_data["data_checksums"]["task/alpha_sup"] = "0" * 16
    groups, _ = group_records([*records, other_lr, other_data])
    assert sorted(len(g.records) for g in groups) == [1, 1, 9]
    titles = [g.title for g in groups]
    assert any("dap.lr=0.0003" in t for t in titles) and any("inputs" in t for t in titles)
    assert len(set(titles)) == 3


def test_older_numerics_are_superseded_by_a_group_of_current_numerics_never_an_error(records):
    older = copy.deepcopy(records[:3])
    for record in older:
        record["identity"]["results_version"] = RESULTS_VERSION - 1
        record["run_id"] = record["run_id"][:-10] + "0123456789"
    groups, superseded = group_records([*records, *older])
    assert len(groups) == 1 and {s.run_id for s in superseded} == {r["run_id"] for r in older}
    assert all("older numerics" in s.reason for s in superseded)
    alone, none_left = group_records(older)  # no current group with the same settings: shown, not dropped
    assert len(alone) == 1 and not none_left and f"numerics version {RESULTS_VERSION - 1}" not in alone[0].title


def test_a_second_record_of_one_label_and_seed_is_superseded_by_the_newer_method_code(records):
    newer = copy.deepcopy(records[6])  # das seed 1
    newer["identity"]["method_version"] += 1
    newer["run_id"] = newer["run_id"][:-10] + "9999999999"
    (group,), superseded = group_records([*records, newer])
    assert newer in group.records and records[6] not in group.records
    assert [s.run_id for s in superseded] == [records[6]["run_id"]]


def test_records_that_measured_the_base_model_differently_form_their_own_group(records):
    moved = copy.deepcopy(records[3:6])  # ncl on another device: the base losses differ
    for record in moved:
        record["lm_loss"]["base"]["general"] += 0.04
        record["environment"]["device_name"] = "NVIDIA H100"
    groups, _ = group_records([*records, *moved])
    assert sorted(len(g.records) for g in groups) == [3, 9]
    assert any("NVIDIA H100" in g.title for g in groups)


def test_weighted_scores_equal_sklearn_under_unit_weights():
    rng = np.random.default_rng(0)
    labels, predicted = rng.integers(0, 4, 50), rng.integers(0, 4, 50)
    labels[labels == 3] = 2  # a class absent from the test labels counts as 0, as in the records' macro-F1
    acc, f1 = weighted_scores(labels, predicted, 4, np.ones((1, 50)))
    assert acc[0] == pytest.approx(accuracy_score(labels, predicted))
    assert f1[0] == pytest.approx(f1_score(labels, predicted, labels=range(4), average="macro", zero_division=0))


def test_loss_replicates_are_centred_on_the_recorded_metrics(records):
    sample = EvaluationSample(records, "test")
    for record in records[3:]:
        recorded = record_loss_metrics(record)
        for name in ("plasticity", "final_gain", "general_rise"):
            replicates = sample.of(record["run_id"], name)
            assert replicates.shape == (1000,) and np.isfinite(replicates).all()
            assert abs(np.mean(replicates) - recorded[name]) < 4 * np.std(replicates) + 1e-3
    # the resample is shared: every record's replicate b reads the same chunks, so differences stay paired
    assert sample._chunk_weights["alpha"].shape == (1000, len(records[0]["lm_loss"]["chunks"]["counts"]["alpha"]))


def test_a_verdict_is_one_test_whose_error_holds_the_seeds_and_the_evaluation_sample(records):
    (group,), _ = group_records(records)
    stats = group_statistics(group)
    forgetting = next(c for c in loss_columns() if c.title == "forgetting")
    (c,) = [c for c in stats.comparisons("ncl", forgetting) if c.label == "das"]
    assert c.se_eval is not None and c.resolved() == (c.q < 0.05 and c.mean != 0)
    seeds_only = c.std**2 / c.n
    assert c.test.se == pytest.approx(np.sqrt(seeds_only + c.se_eval**2)) and c.test.df == c.n - 1
    # an evaluation sample as noisy as the difference is large: no verdict, whatever the seeds say
    noisy = dataclasses.replace(c, test=paired_test(np.full(3, c.mean) + [0, 1e-9, -1e-9], 10 * abs(c.mean)))
    adjust_for_multiplicity([noisy])
    assert not noisy.resolved() and noisy.resolvable() > abs(c.mean)
    assert verdicts(stats)  # the tiny runs differ: some verdicts (every comparison is now computed and cached)
    stats._cache = {key: [dataclasses.replace(x, q=0.5) for x in v] for key, v in stats._cache.items()}
    assert verdicts(stats) == {}


def test_intervals_combine_seed_spread_and_evaluation_sample(records):
    (group,), _ = group_records(records)
    stats = group_statistics(group)
    plasticity = loss_columns()[0]
    mean, se, n = stats.interval("ncl", plasticity)
    values = stats.part[stats.part["method"] == "ncl"]["plasticity"]
    seed_only = float(values.std(ddof=1)) / np.sqrt(3)
    assert n == 3 and mean == pytest.approx(values.mean()) and se > seed_only


def test_record_strings_are_escaped_in_markdown_and_on_the_terminal(records):
    assert text("a|b<script>\x1b]0;x\x07") == "a\\|b&lt;script&gt;?]0;x?"
    assert code("x`|y") == "`x'\\|y`" and printable("ok\x1b[31m") == "ok?[31m"
    hostile = copy.deepcopy(records[3:6])
    for record in hostile:
        record["method_label"] = "ncl|x<script>\x1b[2J"
    (group,), _ = group_records([*records[:3], *hostile])
    from benchmark.report.markdown import table

    stats = group_statistics(group)
    rows = table(stats, loss_columns(), "final gain", verdicts(stats))
    assert len({row.replace("\\|", "").count("|") for row in rows}) == 1  # every row has the header's cells
    board = leaderboard_markdown([(group, stats, {})])
    outside_code = re.sub(r"`[^`]*`", "", board)  # CommonMark shows code spans literally: HTML there is inert
    assert "<script>" not in outside_code and "\x1b" not in board


def _measuring(records: list[dict]) -> list[dict]:
    """Copies of ``records`` whose end-task cells count as measuring the backbone: the tiny world's classifiers may
    collapse, and these tests read the comparisons (the flags have tests of their own, test_backbone_flags.py)."""
    return [{**copy.deepcopy(r), "backbone_flags": {}} for r in records]


def test_the_best_dap_method_against_no_dap_is_one_the_tests_cover(records):
    records = _measuring(records)
    one_seed_das = records[6]
    (group,), _ = group_records([*records[:6], one_seed_das])
    stats = group_statistics(group)
    # the one-seed row scores best of all: it must not be named best beside verdicts it never had
    stats.part.loc[stats.part["method"] == "das", "final macro-F1"] = 1.0
    (line,) = [x for x in end_task_reading(stats) if x.startswith("- DAP vs no DAP")]
    assert "best DAP method of more than one seed (`ncl`)" in line
    assert "1 one-seed row(s) are neither ranked nor tested" in line
    ncl_gain = 100 * (
        stats.part.groupby("method")["final macro-F1"].mean()["ncl"]
        - stats.part.groupby("method")["final macro-F1"].mean()["none"]
    )
    assert f"is {ncl_gain:+.2f} points" in line


def test_a_part_without_no_dap_still_tests_end_tasks_against_the_methods_that_train(records):
    (group,), _ = group_records(_measuring(records[3:]))  # ncl and das only, as in the five-order part
    stats = group_statistics(group)
    lines = end_task_reading(stats)
    assert not [x for x in lines if x.startswith("- DAP vs no DAP")]
    (line,) = [x for x in lines if x.startswith("- Final macro-F1 against `ncl`")]
    assert "Benjamini-Hochberg over 1 method," in line
    (das,) = stats.comparisons("ncl", column_of("final macro-F1"))
    means = stats.part.groupby("method")["final macro-F1"].mean()
    assert das.mean == pytest.approx(means["das"] - means["ncl"])
    named = f"`das` ({100 * das.mean:+.2f})" in line
    assert named == das.resolved() and ("the other one is not separated" in line) == (not das.resolved())


def test_variant_reading_and_option_parents():
    assert option_parents("das[a=1,b=x,c=2]") == ["das[b=x,c=2]", "das[a=1,c=2]", "das[a=1,b=x]"]
    rows = []
    for seed, noise in ((1, 0.0), (2, 0.01), (3, -0.01)):
        for label, forgetting in (("das", 0.2), ("das[x=1]", 0.1), ("ncl", 0.3)):
            rows.append(
                {
                    "method": label,
                    "seed": seed,
                    "order": "seq0",
                    "pair": f"seq0/{seed}",
                    "run_id": f"{label}-{seed}",
                    "forgetting": forgetting + noise,
                    "general rise": 0.2,
                    "plasticity": 0.3,
                }
            )

    stats = GroupStatistics(pd.DataFrame(rows), [], "variants", {})  # no records: no evaluation-sample test
    header, line = variant_reading(stats)
    assert "over the 1 option pair per metric" in header
    assert line.startswith("  - `das[x=1]` against `das`") and "forgetting -0.100" in line and "not resolved" in line


def test_the_variant_readings_q_values_are_over_every_option_pair_of_the_group():
    """Three option pairs read together: each pair's q is Benjamini-Hochberg over the three pairs' p-values (per
    metric), so a pair that one test alone would resolve is not claimed when the others are noise."""
    from scipy.stats import false_discovery_control, ttest_rel

    noise = {1: 0.0, 2: 0.012, 3: -0.011, 4: 0.004}
    shifts = {
        "das": (0.0, 0.0, 0.0, 0.0),
        "das[x=1]": (-0.05, -0.04, -0.06, -0.055),
        "das[x=2]": (0.01, -0.02, 0.0, 0.015),
        "das[x=3]": (-0.01, 0.01, 0.02, -0.02),
    }
    rows = [
        {
            "method": label,
            "seed": seed,
            "order": "seq0",
            "pair": f"seq0/{seed}",
            "run_id": f"{label}-{seed}",
            "forgetting": 0.2 + noise[seed] + shift[seed - 1],
            "general rise": 0.2,
            "plasticity": 0.3,
        }
        for label, shift in shifts.items()
        for seed in noise
    ]

    stats = GroupStatistics(pd.DataFrame(rows), [], "variants", {})  # no records: no evaluation-sample test
    header, *lines = variant_reading(stats)
    assert "Benjamini-Hochberg over the 3 option pairs per metric" in header
    assert [line.split("`")[1] for line in lines] == ["das[x=1]", "das[x=2]", "das[x=3]"]
    forgetting = pd.DataFrame(rows).pivot_table(index="seed", columns="method", values="forgetting")
    p = [ttest_rel(forgetting[v], forgetting["das"]).pvalue for v in ("das[x=1]", "das[x=2]", "das[x=3]")]
    q = false_discovery_control(p)
    assert any(q_value > p_value for p_value, q_value in zip(p, q, strict=True))  # the correction bites here
    for line, variant, p_value, q_value in zip(lines, ("das[x=1]", "das[x=2]", "das[x=3]"), p, q, strict=True):
        mean = (forgetting[variant] - forgetting["das"]).mean()
        assert f"forgetting {mean:+.3f} (p={p_value:.2g}, q={q_value:.2g}," in line
    # a pair that is not resolved says what its seeds could have resolved (#85): 80% power, paired t over 4 seeds
    from benchmark.report.comparison import resolvable_difference

    differences = forgetting["das[x=3]"] - forgetting["das"]
    resolvable = resolvable_difference(differences.std(ddof=1) / 2.0, 3)
    assert q[2] >= 0.05 and f"(not resolved; 80% power at ±{resolvable:.3f})" in lines[2]


def test_methods_under_the_same_options_are_tested_against_each_other_in_their_own_family():
    """`das[x=1]` against `ncl[x=1]` (the reference's method first), `das[x=2]` against `ncl[x=2]`; a label without a
    same-option sibling (`das[y=1]`) and the default labels are in no pair; q is BH over the two pairs."""
    from scipy.stats import false_discovery_control, ttest_rel

    noise = {1: 0.0, 2: 0.012, 3: -0.011, 4: 0.004}
    shifts = {
        "ncl": 0.0,
        "das": -0.05,
        "ncl[x=1]": 0.1,
        "das[x=1]": 0.06,
        "ncl[x=2]": 0.0,
        "das[x=2]": 0.0,
        "das[y=1]": 0.02,
    }
    jitter = {"das[x=1]": (0.0, 0.01, -0.01, 0.004), "das[x=2]": (0.01, -0.02, 0.0, 0.015)}
    rows = [
        {
            "method": label,
            "seed": seed,
            "order": "seq0",
            "pair": f"seq0/{seed}",
            "run_id": f"{label}-{seed}",
            "forgetting": 0.2 + noise[seed] + shift + jitter.get(label, (0,) * 4)[seed - 1],
            "general rise": 0.2,
            "plasticity": 0.3,
        }
        for label, shift in shifts.items()
        for seed in noise
    ]

    stats = GroupStatistics(pd.DataFrame(rows), [], "siblings", {"naive_continual": "ncl", "proposed": "das"})
    header, *lines = sibling_reading(stats)
    assert header.startswith("- Methods under the same options") and "over the 2 method pairs per metric" in header
    assert [line.split("`")[1::2] for line in lines] == [["das[x=1]", "ncl[x=1]"], ["das[x=2]", "ncl[x=2]"]]
    forgetting = pd.DataFrame(rows).pivot_table(index="seed", columns="method", values="forgetting")
    p = [ttest_rel(forgetting[f"das[x={x}]"], forgetting[f"ncl[x={x}]"]).pvalue for x in (1, 2)]
    q = false_discovery_control(p)
    for line, x, p_value, q_value in zip(lines, (1, 2), p, q, strict=True):
        mean = (forgetting[f"das[x={x}]"] - forgetting[f"ncl[x={x}]"]).mean()
        assert f"forgetting {mean:+.3f} (p={p_value:.2g}, q={q_value:.2g}," in line
    assert sibling_reading(GroupStatistics(pd.DataFrame(rows[:8]), [], "none", {})) == []  # ncl, das only


def _write(out, records):
    for record in records:
        atomic_write_json(out / "results" / record["profile"] / f"{record['run_id']}.json", record)


def test_the_report_rewrites_only_what_changed_and_deletes_only_its_own_files(records, tmp_path):
    out = tmp_path / "out"
    _write(out, records)
    first = write_report(out)
    report = out / "results" / "report"
    assert first["groups"] == 1 and len(list((report / "runs").iterdir())) == 9 and list((report / "plots").iterdir())
    mine = out / "results" / "report" / "plots" / "notes.txt"  # a file the report did not write
    mine.write_text("keep me")
    assert write_report(out)["files"] == 0  # nothing changed: nothing is written
    removed = out / "results" / records[0]["profile"] / f"{records[0]['run_id']}.json"
    removed.unlink()
    write_report(out)
    assert not (report / "runs" / f"{records[0]['run_id']}.md").exists() and mine.read_text() == "keep me"
    board = (out / "leaderboard.md").read_text()
    assert "| `ncl` | 3 |" in board and "±" in board and "Evaluation sample:" in board


def test_a_change_of_the_rendering_code_redraws_pages_and_plots_of_unchanged_records(records, tmp_path, monkeypatch):
    from benchmark.report import writer

    out = tmp_path / "out"
    _write(out, records[:6])
    write_report(out)
    page = out / "results" / "report" / "runs" / f"{records[3]['run_id']}.md"
    monkeypatch.setattr(writer, "run_tables", lambda record: f"new layout of {record['run_id']}\n")
    assert write_report(out)["files"] == 6  # every page, no plot: the plotting code did not change
    assert page.read_text() == f"new layout of {records[3]['run_id']}\n"
    monkeypatch.setattr(writer, "_plots_code", lambda: "other plotting code")
    plots = sorted((out / "results" / "report" / "plots").iterdir())
    assert write_report(out)["files"] == len(plots) + 1  # every plot redrawn, and the manifest of their digests


def test_symbolic_links_in_the_results_folder_are_refused(records, tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    _write(out, records[:1])
    elsewhere.mkdir()
    (elsewhere / "old.csv").write_text("x")
    os.symlink(elsewhere, out / "results" / "report")
    with pytest.raises(DapbenchError, match="symbolic link"):
        write_report(out)
    assert (elsewhere / "old.csv").exists() and not (out / "leaderboard.md").exists()
    os.unlink(out / "results" / "report")
    os.symlink(elsewhere / "old.csv", out / "results" / "synthetic" / "x.json")
    with pytest.raises(DapbenchError, match="symbolic link"):
        load_records(out / "results")


def test_an_edited_record_is_named_when_read(records, tmp_path):
    record = copy.deepcopy(records[4])
    record["lm_loss"]["metrics"]["plasticity"] = 0.5
    _write(tmp_path, [record])
    with pytest.raises(DapbenchError, match="lm_loss.metrics.plasticity 0.5 is not what its held-out losses give"):
        load_records(tmp_path / "results")
    renamed = copy.deepcopy(records[4])
    path = tmp_path / "other" / "results" / "x" / "ncl-alpha-seed7-0000000000.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(renamed))
    with pytest.raises(DapbenchError, match="file name .* is not its run id"):
        load_records(tmp_path / "other" / "results")


def test_runs_over_several_domain_orders_form_one_group_paired_by_order_and_seed():
    """Order-averaged results (issue #28): two orders x one seed of NCL and DAS are one group of two pairs, with a
    per-order table; the committed CI records stand in for the first order."""
    from pathlib import Path

    from benchmark.report.markdown import order_tables

    ci = Path(__file__).resolve().parents[1] / "results" / "ci"
    firsts = [json.loads(p.read_text()) for p in sorted(ci.glob("*.json")) if p.name.startswith(("ncl-", "das-"))]
    reordered = []
    for record in firsts:
        other = copy.deepcopy(record)
        other["sequence"] = list(reversed(record["sequence"]))
        other["run_id"] = record["run_id"].replace("custom-restaurant-acl-phone", "custom-phone-acl-restaurant")
        reordered.append(other)
    groups, superseded = group_records(firsts + reordered)
    assert len(groups) == 1 and not superseded and len(groups[0].records) == 4
    part = leaderboard_frame(groups[0].records, lambda r: groups[0].key)
    assert sorted(part["order"].unique()) == ["custom-phone-acl-restaurant", "custom-restaurant-acl-phone"]
    assert part.groupby("method")["pair"].nunique().tolist() == [2, 2]  # each method: two (order, seed) pairs
    stats = GroupStatistics(part, groups[0].records, groups[0].sample_key, reference_labels(groups[0].records))
    lines = order_tables(stats)
    assert lines[0] == "### Over domain orders" and any(line.startswith("| `das` |") for line in lines)
    (ncl_cmp,) = [c for c in stats.comparisons("ncl", loss_columns()[0]) if c.label == "das"]
    assert ncl_cmp.n == 2  # paired over the two orders of seed 2021


def test_a_replay_record_of_the_earlier_replay_counting_is_superseded_by_a_rerun(records):
    """Replay counting version 2 (shares met over the stage) supersedes records without the field (version 1)."""
    first = next(r for r in records if r["method"] == "ncl")
    older = copy.deepcopy(first)
    older["method_label"] = "ncl[replay.general=0.25]"
    newer = copy.deepcopy(older)
    newer["identity"]["replay_version"] = 2
    newer["run_id"] = older["run_id"][:-10] + "0" * 10  # sorts first: the version decides, not the id
    groups, superseded = group_records([newer, older])
    assert [r["run_id"] for g in groups for r in g.records] == [newer["run_id"]]
    assert [s.run_id for s in superseded] == [older["run_id"]]


def test_methods_run_over_different_orders_are_shown_in_one_part_per_order_set(records):
    """NCL and DAS over two orders, the no-DAP row over the first only: no table averages a method over two orders
    beside one over a single order. The first order's part is the group as it was (same records, same bootstrap);
    the two-order part holds NCL and DAS at the seeds both have in both orders (an orders x seeds rectangle). NCL's
    second-order run of seed 3 (DAS has none) is in no table: the leaderboard names it as incomplete."""
    (alone,), _ = group_records(records)
    reordered = []
    for record in records:
        if record["method"] == "ncl" or (record["method"] == "das" and record["seed"] != 3):
            other = copy.deepcopy(record)
            other["sequence"] = list(reversed(record["sequence"]))
            other["run_id"] = record["run_id"].replace("custom-alpha-beta", "custom-beta-alpha")
            reordered.append(other)
    groups, left_out = group_records(records + reordered)
    (incomplete,) = left_out
    (ncl_seed3,) = [r["run_id"] for r in reordered if r["method"] == "ncl" and r["seed"] == 3]
    assert incomplete.kind == "incomplete" and incomplete.run_id == ncl_seed3
    assert incomplete.reason.startswith("ncl, seed 3, order custom-beta-alpha: its part")
    assert incomplete.reason.endswith("has run in every order (1, 2)")
    (said,) = terminal_summary([r for r in reordered if r["run_id"] == ncl_seed3], records + reordered)
    assert said.startswith(f"{ncl_seed3}: left out of the leaderboard (incomplete): ncl, seed 3")
    shown = [r["run_id"] for g in groups for r in g.records]
    assert incomplete.run_id not in shown and {r["run_id"] for r in records + reordered} == {*shown, incomplete.run_id}
    assert len(groups) == 2
    (first,) = [g for g in groups if not g.orders]  # every method: it keeps the group's key (plot names, links)
    (both,) = [g for g in groups if g.orders == ("custom-alpha-beta", "custom-beta-alpha")]
    assert [r["run_id"] for r in first.records] == [r["run_id"] for r in alone.records]
    assert first.key == first.sample_key == both.sample_key == alone.key != both.key
    assert {(r["method"], r["seed"]) for r in both.records} == {(m, s) for m in ("ncl", "das") for s in (1, 2)}
    assert len(both.records) == 8 and "2 domain orders" in both.title and "→" in first.title
    unchanged, split = group_statistics(alone).part, leaderboard_frame(first.records, lambda r: first.key)
    pd.testing.assert_frame_equal(unchanged.drop(columns="group"), split.drop(columns="group"))
    board = leaderboard_markdown([(g, group_statistics(g), {}) for g in (first, both)], left_out)
    board, left_text = board.split("## Left out")
    assert "1 incomplete record(s)" in left_text and f"- `{incomplete.run_id}`: ncl, seed 3" in left_text
    first_text, both_text = board.split(f"## {both.title}")
    assert "paired by seed;" in first_text and "paired by (order, seed);" in both_text
    assert "largest seed std" in first_text and "largest std over (order, seed) runs" in both_text
    (absent,) = [line for line in both_text.splitlines() if "none in this group" in line]
    assert "`none`" in absent and "(run over fewer of these orders" in absent and "### Over domain orders" in both_text


def test_a_group_whose_methods_all_cover_the_same_orders_shows_only_complete_seeds(records):
    """NCL and DAS both over two orders, DAS's seed 3 over the first only: the group is not split, but it too shows
    the orders x seeds rectangle (seeds 1 and 2); seed 3's three runs are named as incomplete, not averaged in."""
    runs = [r for r in records if r["method"] in ("ncl", "das")]
    reordered = []
    for record in runs:
        if record["method"] == "ncl" or record["seed"] != 3:
            other = copy.deepcopy(record)
            other["sequence"] = list(reversed(record["sequence"]))
            other["run_id"] = record["run_id"].replace("custom-alpha-beta", "custom-beta-alpha")
            reordered.append(other)
    (group,), left_out = group_records(runs + reordered)
    assert not group.orders and {(r["method"], r["seed"]) for r in group.records} == {
        (m, s) for m in ("ncl", "das") for s in (1, 2)
    }
    assert len(group.records) == 8 and {s.kind for s in left_out} == {"incomplete"}
    assert sorted(s.run_id for s in left_out) == sorted(r["run_id"] for r in runs + reordered if r["seed"] == 3)
    assert all(s.reason.endswith("has run in every order (1, 2)") for s in left_out)


def test_a_decoder_group_names_its_next_token_loss_and_the_base_perplexity(records):
    from benchmark.report.writer import run_tables

    decoders = copy.deepcopy(records[:6])
    for record in decoders:
        record["model_kind"] = "causal"
    (group,), _ = group_records(decoders)
    board = leaderboard_markdown([(group, group_statistics(group), {})])
    assert "### Continual (held-out next-token loss, nats per token)" in board
    base = decoders[0]["lm_loss"]["base"]
    for column in decoders[0]["lm_loss"]["columns"]:
        assert f"{text(column)} {np.exp(base[column]):.1f}" in board
    page = run_tables(decoders[3])
    assert "## held-out next-token loss (nats per token)" in page and "## perplexity (exp of the loss)" in page
    (masked,), _ = group_records(records[:6])
    plain = leaderboard_markdown([(masked, group_statistics(masked), {})])
    assert "### Continual (held-out loss, nats)" in plain and "perplexity" not in plain
    assert "perplexity" not in run_tables(records[3])


def test_a_generated_world_group_says_it_is_not_real_text_and_never_answers(records):
    from benchmark.report.answer import short_answer
    from benchmark.report.site import site_files

    generated = copy.deepcopy(records[:6])
    for record in generated:
        record["profile"] = "synthetic"
    (group,), _ = group_records(generated)
    sections = [(group, group_statistics(group), {})]
    board = leaderboard_markdown(sections)
    assert "- **generated world, not real text**: six invented domains" in board
    assert short_answer(sections) == []  # the only group is the generated world's: no answer
    page = next(text for name, text in site_files(sections, [], {}).items() if name.startswith("group-"))
    assert "generated world, not real text" in page
    real = copy.deepcopy(records[:6])
    for record in real:
        record["profile"] = "mini"
    (group,), _ = group_records(real)
    assert "generated world" not in leaderboard_markdown([(group, group_statistics(group), {})])


def test_a_group_names_the_reports_methods_it_has_no_record_of_and_never_what_is_installed(records):
    from benchmark.report.markdown import group_header

    (group,), _ = group_records(records)  # none, ncl and das
    assert not [li for li in group_header(group, {"none", "ncl", "das"}) if "none in this group" in li]
    line = next(li for li in group_header(group, {"ncl", "ewc", "one"}) if "none in this group" in li)
    assert set(re.findall(r"`([a-z_]+)`", line)) == {"ewc", "one"}
    board = leaderboard_markdown([(group, group_statistics(group), {})])
    assert "none in this group" not in board  # an installed method with no record anywhere is no line of it


def test_the_references_are_the_two_baselines_and_the_papers_method_at_their_defaults(records):
    """ncl (naive continual), das (the paper's method, ``proposed``) and none (no DAP) are the references; a DAS
    record at defaults made before DAS declared its role counts once ``dapbench migrate`` wrote the role into it (the
    report reads the records alone), a DAS variant never does, and every method is tested against DAS in the
    verdicts."""
    from benchmark.records.store import completed_record
    from benchmark.registry import installed_method

    assert reference_labels(records) == {"naive_continual": "ncl", "proposed": "das", "no_dap": "none"}
    assert {r["comparison_role"] for r in records if r["method"] == "das"} == {"proposed"}
    older = [{**r, "comparison_role": None} if r["method"] == "das" else r for r in records]
    assert "proposed" not in reference_labels(older)  # the record says none
    assert reference_labels([completed_record(r, installed_method) for r in older])["proposed"] == "das"
    variant = [
        {**r, "method_label": "das[ablation=no_contrast]", "comparison_role": None} if r["method"] == "das" else r
        for r in records
    ]
    assert "proposed" not in reference_labels(variant)
    assert "proposed" not in reference_labels([completed_record(r, installed_method) for r in variant])
    (group,), _ = group_records(records)
    stats = group_statistics(group)
    assert list(stats.references.values()) == ["ncl", "das", "none"]
    against_das = {c.label for c in stats.comparisons("das", loss_columns()[0])}
    assert against_das == {"ncl", "none"}


def test_the_short_answer_states_its_budget_and_claims_only_resolved_verdicts(records):
    from benchmark.report.answer import answer_summary, short_answer
    from benchmark.report.reading import column_of

    def sections(profile):
        groups, _ = group_records([{**r, "profile": profile} for r in records])
        return [(g, group_statistics(g), {}) for g in groups]

    assert short_answer(sections("synthetic")) == []  # a generated world never answers
    answered = sections("mini")
    lines = short_answer(answered)
    dap = records[0]["config"]["dap"]
    assert lines[0] == "## The short answer" and lines[2] == answer_summary(answered) != ""
    first = next(line for line in lines if line.startswith("- "))
    assert first.startswith(f"- At {dap['steps']} DAP updates of {dap['batch_size']} x {dap['seq_len']} tokens")
    assert "3 seeds" in first and "against naive continual DAP (`ncl`)" in first
    # the claims against ncl nest under that line (four spaces: the site's Markdown nests them as GitHub does)
    claims = [line.strip() for line in lines if line.startswith("    - ")]
    assert claims and lines.index(first) < lines.index(f"    {claims[0]}")
    stats = answered[0][1]
    for line in claims:
        for title in ("forgetting", "general rise"):
            for c in stats.comparisons("ncl", column_of(title)):
                if line.startswith(f"- `{c.label}` ") and title.split()[0] in line.replace("forgets", "forgetting"):
                    assert c.resolved() and c.mean < 0, (line, c)
    assert any("end tasks" in line for line in lines)


def _lower_losses(record: dict, label: str, capabilities: dict, nats: float = 0.05) -> dict:
    """A copy of ``record`` as the row ``label`` whose every loss after a domain is ``nats`` lower, in every held-out
    chunk alike: the same forgetting, ``nats`` more plasticity and ``nats`` less general rise than the original."""
    out = copy.deepcopy(record)
    losses, chunks = out["lm_loss"], out["lm_loss"]["chunks"]
    losses["after_domain"] = [{k: v - nats for k, v in row.items()} for row in losses["after_domain"]]
    chunks["after_domain"] = [
        {k: [s - nats * n for s, n in zip(v, chunks["counts"][k], strict=True)] for k, v in row.items()}
        for row in chunks["after_domain"]
    ]
    losses["metrics"] = record_loss_metrics(out)
    out.update(method_label=label, run_id=f"{label}-seq0-seed{out['seed']}-0000000000", comparison_role=None)
    out["capabilities"] = {**out["capabilities"], **capabilities}
    return out


def test_a_bound_that_needs_every_domain_at_once_is_never_the_short_answer(records):
    """The oracle (re-trains on all data seen so far) and joint training on the union keep general knowledge better
    than any continual method can: they are what the rows are measured against, never the method to use."""
    from benchmark.report.answer import short_answer

    def answer(capabilities):
        lower = [_lower_losses(r, "lower", capabilities) for r in records if r["method_label"] == "ncl"]
        groups, _ = group_records([{**r, "profile": "mini"} for r in [*records, *lower]])
        return "\n".join(short_answer([(g, group_statistics(g), {}) for g in groups]))

    assert "`lower` keeps general knowledge best" in answer({})  # as a continual method, it is the answer
    assert "`lower`" not in answer({"retrains_on_seen": True})
    assert "`lower`" not in answer({"joint_training": True})


def test_the_answers_summary_names_the_method_to_use_its_cost_and_the_end_tasks_in_a_few_sentences(records):
    """The README's first screen: the row that keeps general knowledge best of those that learn as well as ``ncl``,
    with its speed against ``ncl`` on a shared machine, and the end tasks' verdict, in three sentences at most where
    the group is no ladder's bottom rung; a bound is never named there either."""
    from benchmark.report.answer import answer_summary

    def summary(capabilities):
        lower = [_lower_losses(r, "lower", capabilities) for r in records if r["method_label"] == "ncl"]
        groups, _ = group_records([{**r, "profile": "mini"} for r in [*records, *lower]])
        return answer_summary([(g, group_statistics(g), {}) for g in groups])

    text = summary({})
    dap = records[0]["config"]["dap"]
    assert text.startswith(f"At {dap['steps']} updates of {dap['batch_size']} x {dap['seq_len']} tokens per domain")
    assert "`lower` keeps general knowledge best (0.05 nats less general-loss rise)" in text
    assert "training at 1.00x `ncl`'s DAP tokens per second" in text  # the same runs' timings, relabelled
    assert "On the end tasks, " in text and len(re.findall(r"\.(?: |$)", text)) <= 3
    assert "`lower`" not in summary({"joint_training": True})


def test_the_report_fills_a_readmes_marked_answer_block_and_touches_no_other_readme(records, tmp_path):
    from benchmark.report.writer import ANSWER_MARKERS, write_report

    marked, plain = tmp_path / "marked", tmp_path / "plain"
    for out in (marked, plain):
        _write(out, records[:6])
    (marked / "README.md").write_text(f"# mine\n\n{ANSWER_MARKERS[0]}\nold text\n{ANSWER_MARKERS[1]}\n\nthe rest\n")
    (plain / "README.md").write_text("# a user's own readme\n")
    write_report(marked)
    write_report(plain)
    filled = (marked / "README.md").read_text()
    assert "old text" not in filled and filled.startswith("# mine\n") and filled.endswith("\nthe rest\n")
    assert "No group answers yet." in filled  # these are synthetic-world records: they never answer
    assert (plain / "README.md").read_text() == "# a user's own readme\n"


def test_the_report_fills_a_readmes_rows_blocks_with_the_answering_groups_numbers(records, tmp_path):
    from benchmark.report.answer import ROWS_COLUMNS
    from benchmark.report.reading import column_of
    from benchmark.report.writer import ROWS_MARKERS

    out = tmp_path / "out"
    mini = [{**r, "profile": "mini"} for r in records]  # the synthetic world never answers: read these as real data
    _write(out, mini)
    start, end = ROWS_MARKERS
    readme = f"# mine\n\n{start} das; ncl; absent -->\n| stale |\n{end}\n\nbetween\n\n{start} none -->\n{end}\nend\n"
    (out / "README.md").write_text(readme)
    write_report(out)
    filled = (out / "README.md").read_text()
    assert "| stale |" not in filled and filled.startswith("# mine\n") and filled.endswith("\nend\n")
    assert "\nbetween\n" in filled and filled.count(start) == 2 and filled.count(end) == 2
    (group,), _ = group_records(mini)
    stats = group_statistics(group)
    das = next(line for line in filled.splitlines() if line.startswith("| `das` |"))
    assert das == "| `das` | 3 | " + " | ".join(stats.cell("das", column_of(t)) for t in ROWS_COLUMNS) + " |"
    assert "| `absent` (no record in this group) | 0 |" in filled
    lines = filled.splitlines()
    assert lines.index(das) < next(i for i, line in enumerate(lines) if line.startswith("| `ncl` |"))  # as named
    assert write_report(out, check=True)["stale"] == []  # filled once, up to date


def test_the_report_fills_the_findings_pages_rows_block_as_the_readmes(records, tmp_path):
    """The rows block moved with the findings from the README to ``docs/findings.md``; the report fills it there."""
    from benchmark.report.writer import GENERATED_BLOCK_PAGES, ROWS_MARKERS, write_report

    out = tmp_path / "out"
    _write(out, [{**r, "profile": "mini"} for r in records])
    start, end = ROWS_MARKERS
    block = f"# page\n\n{start} ncl -->\n| stale |\n{end}\n"
    for page in GENERATED_BLOCK_PAGES:
        (out / page).parent.mkdir(parents=True, exist_ok=True)
        (out / page).write_text(block)
    write_report(out)
    readme, findings = ((out / page).read_text() for page in GENERATED_BLOCK_PAGES)
    assert "| stale |" not in findings and "| `ncl` | 3 |" in findings and findings == readme


def test_a_record_made_before_a_metric_existed_shows_it_computed_from_its_losses(records):
    older = copy.deepcopy(records[4])
    del older["lm_loss"]["metrics"]["max_forgetting"]  # as if the metric had been added after the run
    frame = leaderboard_frame([older, records[4]], group_of=lambda record: "g")
    values = frame["max forgetting"].tolist()
    assert values[0] == pytest.approx(values[1]) and values[1] == records[4]["lm_loss"]["metrics"]["max_forgetting"]


def test_a_loss_metric_is_added_by_registering_one_function_and_older_records_show_it(records):
    """Issue #48: a new metric is one registration; records made before it show it computed from their losses."""
    import numpy as np

    from benchmark.metrics import LOSS_METRIC_REGISTRY, register_loss_metric

    try:

        @register_loss_metric("best_domain_gain", "best domain gain", True)
        def best_domain_gain(view):
            """The largest fall of one domain's loss when it was learned."""
            return None if view.final_row_only else np.max(view.start - view.diagonal, axis=-1)

        assert all("best_domain_gain" not in r["lm_loss"]["metrics"] for r in records)  # made before it existed
        (group,), _ = group_records(records)
        board = leaderboard_markdown([(group, group_statistics(group), {})])
        header = next(line for line in board.splitlines() if line.startswith("| method | n | plasticity"))
        assert "| best domain gain ↑ | CKA to base |" in header
        ncl = [r for r in records if r["method"] == "ncl"]
        losses = [r["lm_loss"] for r in ncl]
        gains = [[m["base"][d] - m["after_domain"][k][d] for k, d in enumerate(ncl[0]["sequence"])] for m in losses]
        expected = np.mean([max(gain) for gain in gains])
        row = next(line for line in board.splitlines() if line.startswith("| `ncl` | 3 |"))
        assert f"{expected:.3f} ±" in row
    finally:
        LOSS_METRIC_REGISTRY.remove("best_domain_gain")  # the registration is this test's own


def test_a_group_of_one_row_says_it_has_no_paired_difference_not_that_its_records_are_old(records):
    from benchmark.report.reading import _evaluation_error

    (group,), _ = group_records([r for r in records if r["method"] == "none"])
    assert _evaluation_error(group_statistics(group)) == [
        "- The group holds one row: there is no paired difference to put an evaluation-sample error on."
    ]
    (both,), _ = group_records([r for r in records if r["method"] in ("none", "ncl")])
    assert "Evaluation sample: the standard error" in _evaluation_error(group_statistics(both))[0]


def test_the_short_answer_counts_seeds_per_row_not_over_the_group():
    """Five seeds of ``none`` beside three of every other row are not "5 seeds" (the comparisons pair by seed)."""
    from benchmark.report.answer import _seed_counts
    from benchmark.report.words import say

    def seeds(records):
        return say("common.md.j2", "seeds", _seed_counts(records))

    rows = [{"method_label": label, "seed": seed} for label in ("ncl", "derpp") for seed in (1, 2, 3)]
    assert seeds(rows) == "3 seeds"
    assert seeds(rows + [{"method_label": "none", "seed": s} for s in (1, 2, 3, 4, 5)]) == "3-5 seeds per row"
    assert seeds(rows[:1]) == "1 seed"
