"""Continual evaluation (issue #90): ``dap.eval_every`` measures every held-out set's loss while a domain trains,
keeps the curve in the record and changes no other number; the stability gap is read from the curves."""

import json
import math

import numpy as np
import pytest
from cli_helpers import quick_run_args

from benchmark.cli import main
from benchmark.metrics import stability_gap


def _record(out):
    (path,) = (out / "results").rglob("ncl-*.json")
    from benchmark.records.store import load_record

    return path, load_record(path)


def test_curves_are_recorded_and_change_no_number(world_root, tiny_model, tmp_path):
    plain, curved = tmp_path / "plain", tmp_path / "curved"
    steps = ["--set", "dap.steps=4", "--set", "dap.heldout_chunks=6"]
    assert main(quick_run_args(world_root, tiny_model, plain, *steps)) == 0
    on = ["--set", "dap.eval_every=2", "--set", "dap.eval_chunks=3"]
    assert main(quick_run_args(world_root, tiny_model, curved, *steps, *on)) == 0
    (plain_path, without), (curved_path, with_curves) = _record(plain), _record(curved)
    assert plain_path.name == curved_path.name  # one run id: the setting only adds the curve
    for key in ("lm_loss", "matrices", "summary", "representation"):
        assert json.dumps(without[key]) == json.dumps(with_curves[key]), key
    assert [d["loss_log"] for d in without["domains"]] == [d["loss_log"] for d in with_curves["domains"]]
    for domain in with_curves["domains"]:
        curve = domain["curve"]
        assert curve["steps"] == [0, 2, 4] and set(curve["losses"]) == set(with_curves["lm_loss"]["columns"])
        assert all(len(v) == 3 and all(math.isfinite(x) for x in v) for v in curve["losses"].values())
        assert curve["seconds"] >= 0
    assert "curve" not in without["domains"][0]
    # reproduce compares the curve's losses (a record with curves crashed it); a re-run that adds them reproduces a
    # record without them, one that lacks them does not reproduce a record that has them
    from benchmark.records.reproduce import DEFAULT_TOLERANCE, compare_records

    assert compare_records(with_curves, with_curves, DEFAULT_TOLERANCE) == []
    assert compare_records(without, with_curves, DEFAULT_TOLERANCE) == []
    missing = compare_records(with_curves, without, DEFAULT_TOLERANCE)
    assert missing and all("/curve/" in m.name and m.actual is None for m in missing)
    # the second stage starts where the first ended: the same model on the same subset
    first, second = (d["curve"]["losses"] for d in with_curves["domains"])
    assert all(math.isclose(first[k][-1], second[k][0], abs_tol=1e-5) for k in first)

    gap = stability_gap(with_curves)
    (stage,) = gap["stages"]
    earlier = stage["earlier"]
    assert earlier["worst"] >= max(earlier["start"], earlier["end"]) and earlier["depth"] >= 0
    assert math.isclose(gap["earlier_depth"], earlier["depth"]) and "general_depth" in gap
    assert stability_gap(without) is None
    import pandas as pd

    assert main(["export", str(tmp_path / "dataset"), "--output-dir", str(curved)]) == 0
    table = pd.read_parquet(tmp_path / "dataset" / "curves.parquet")
    rows = table[(table.stage == 1) & (table.eval_set == with_curves["sequence"][0])]
    assert list(rows["update"]) == [0, 2, 4] and list(rows.loss) == second[with_curves["sequence"][0]]
    from benchmark.metrics import GAP_SUMMARY

    assert set(gap) == {*GAP_SUMMARY, "stages"}  # the runs table's gap columns are the summary's fields
    (run,) = pd.read_parquet(tmp_path / "dataset" / "runs.parquet").to_dict("records")
    assert run["gap_earlier_depth"] == pytest.approx(gap["earlier_depth"])
    assert run["gap_general_unrecovered"] == gap["general_unrecovered"]
    assert main(["export", str(tmp_path / "plain-dataset"), "--output-dir", str(plain)]) == 0
    assert pd.read_parquet(tmp_path / "plain-dataset" / "curves.parquet").empty
    (run,) = pd.read_parquet(tmp_path / "plain-dataset" / "runs.parquet").to_dict("records")
    assert all(pd.isna(run[f"gap_{key}"]) for key in GAP_SUMMARY)  # every column, empty without curves


def test_a_record_with_curves_is_reproduced_whole_by_its_stages_and_by_own_domain(
    world_root, tiny_model, tmp_path, capsys
):
    """`dapbench reproduce` stopped on every record with curves (an unclassified field): each way of re-deriving one
    now compares its curves, or, re-evaluating each stage on its own set alone, leaves them out."""
    out = tmp_path / "curved"
    on = ["--set", "dap.steps=4", "--set", "dap.eval_every=2", "--set", "dap.eval_chunks=3"]
    assert main(quick_run_args(world_root, tiny_model, out, *on)) == 0
    path, _ = _record(out)
    inputs = ["--model", str(tiny_model), "--data-root", str(world_root)]
    inputs += ["--general-heldout", str(world_root / "general_heldout.txt"), "--quiet"]
    capsys.readouterr()
    for name, extra in (("whole", []), ("stages", ["--stages-only"]), ("own", ["--stages-only", "--own-domain"])):
        assert main(["reproduce", str(path), "--output-dir", str(tmp_path / name), *inputs, *extra]) == 0, name
        text = capsys.readouterr().out
        assert "0 outside tolerance" in text and text.rstrip().endswith("REPRODUCED"), name


def _with_curves(record: dict, dip: float) -> dict:
    """``record`` as if measured with continual evaluation: each later domain dips the earlier ones by ``dip``."""
    import copy

    out = copy.deepcopy(record)
    for t, domain in enumerate(out["domains"]):
        start = {name: 3.0 for name in out["lm_loss"]["columns"]}
        curve = {n: [v, v + (dip if t else 0.0) + 0.001 * out["seed"], v + 0.01] for n, v in start.items()}
        domain["curve"] = {"steps": [0, 2, 4], "losses": curve, "seconds": 0.1}
    return out


def test_the_leaderboard_reads_the_stability_gap_with_calibrated_verdicts(report_records):
    from benchmark.report.stability_gap import stability_gap_markdown

    dips = {"ncl": 0.30, "das": 0.10, "none": 0.30}
    records = [_with_curves(r, dips[r["method_label"]]) for r in report_records]
    lines = stability_gap_markdown(records, "ncl")
    table = "\n".join(lines)
    # depth dip + 0.001 seed; 0.01 short of the start at the end; half won back at the next point, 2 updates on
    assert "| `das` | 3 | 0.102 | 90% | 2 | 0.102 | 90% | 2 |" in table
    assert "| `ncl` | 3 | 0.302 | 97% | 2 | 0.302 | 97% | 2 |" in table
    verdict = next(line for line in lines if "depth on earlier domains" in line)
    assert "`das` -0.200 (shallower)" in verdict and "`none` not resolved" in verdict
    assert stability_gap_markdown(report_records, "ncl") == []  # no curves, no section


def test_the_section_says_what_the_continual_evaluation_cost_each_run(report_records):
    from benchmark.report.stability_gap import evaluation_cost, stability_gap_markdown

    records = [_with_curves(r, 0.1) for r in report_records]  # 0.1 s of curves a domain
    for i, record in enumerate(records):
        record["timing"] = {**record["timing"], "wall_seconds": 10.0 * (i + 1), "phase_seconds": {"dap": 5.0}}
        record["config"]["dap"] |= {"eval_every": 2, "eval_chunks": 3}
    rescored = records[-1]  # its time is its end tasks': the DAP that measured the curves ran elsewhere
    rescored["timing"]["phase_seconds"] = {"end_tasks": 9.0}
    cost = evaluation_cost(records)
    curve_seconds = 0.1 * len(records[0]["domains"])
    assert cost["runs"] == len(records) - 1 and cost["settings"] == [(2, 3)]
    assert cost["high"] == pytest.approx(curve_seconds / 10.0)
    assert cost["low"] == pytest.approx(curve_seconds / (10.0 * (len(records) - 1)))
    (line,) = [x for x in stability_gap_markdown(records, "ncl") if x.startswith("Its cost")]
    assert f"% of each run's wall time ({len(records) - 1} runs; every 2 updates on 3 chunks" in line
    assert evaluation_cost(report_records) is None  # no curves, no cost


def test_the_group_lines_are_derived_once_and_each_caller_gets_its_own_copy(report_records, monkeypatch):
    """The leaderboard and the site both show a group's stability-gap lines: computed once per group's statistics."""
    from benchmark.report import stability_gap
    from benchmark.report.groups import group_records
    from benchmark.report.writer import group_statistics

    dips = {"ncl": 0.30, "das": 0.10, "none": 0.30}
    (group,), _ = group_records([_with_curves(r, dips[r["method_label"]]) for r in report_records])
    stats = group_statistics(group)
    calls = []
    real = stability_gap.stability_gap_markdown
    monkeypatch.setattr(stability_gap, "stability_gap_markdown", lambda *a: calls.append(a) or real(*a))
    first = stability_gap.group_stability_gap(stats)
    first.append("a caller's own line")
    second = stability_gap.group_stability_gap(stats)
    assert len(calls) == 1 and second == first[:-1] and any("depth on earlier domains" in x for x in second)


def test_the_site_draws_each_rows_curves_as_seed_means_with_a_gap_between_domains(report_records, tmp_path):
    from benchmark.report.stability_gap import curve_chart
    from benchmark.report.writer import write_report

    dips = {"ncl": 0.30, "das": 0.10, "none": 0.30}
    records = [_with_curves(r, dips[r["method_label"]]) for r in report_records]
    chart = curve_chart(records)
    ncl = chart["rows"]["ncl"]
    assert ncl["seeds"] == 3 and ncl["x"] == [0, 2, 4, None, 4, 6, 8]  # stage 2 starts where stage 1 ended
    assert ncl["earlier"][:4] == [None] * 4  # no earlier domain while the first trains
    seed_mean = 0.001 * sum(r["seed"] for r in records if r["method_label"] == "ncl") / 3
    assert math.isclose(ncl["earlier"][5], 3.0 + 0.30 + seed_mean, abs_tol=1e-5)  # the dip, mean over seeds
    assert math.isclose(ncl["general"][1], 3.0 + seed_mean, abs_tol=1e-5)
    assert curve_chart(report_records) is None
    out = tmp_path / "out"
    from benchmark.io import atomic_write_json

    for record in records:
        atomic_write_json(out / "results" / record["profile"] / f"{record['run_id']}.json", record)
    write_report(out)
    (page,) = (out / "results" / "report" / "site").glob("group-*.html")
    text = page.read_text()
    assert 'id="chart-continual"' in text and '"continual": {"panels"' in text
    gap = text[text.index('<div class="gap">') :]
    gap = gap[: gap.index("</div>")]  # the leaderboard's depth table and verdicts, the table drawn as a table
    assert "<table>" in gap and "<td><code>das</code></td>" in gap and "(shallower)" in gap


def _seed_mean(records: list[dict], label: str) -> float:
    seeds = [r["seed"] for r in records if r["method_label"] == label]
    return sum(seeds) / len(seeds)


def test_the_leaderboard_draws_each_rows_curves_as_small_multiples(report_records, tmp_path, monkeypatch):
    from benchmark.report import plots
    from benchmark.report.plots import GROUP_PLOTS, plot_continual

    dips = {"ncl": 0.30, "das": 0.10, "none": 0.30}
    records = [_with_curves(r, dips[r["method_label"]]) for r in report_records]
    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.setdefault("axes", fig.axes) and path)
    plot_continual(records, tmp_path / "drawn.png")
    panels = {ax.get_title().split(" ")[0].strip("★"): ax for ax in drawn["axes"] if ax.get_visible() and ax.lines}
    assert set(panels) == {"ncl", "das", "none"}
    assert len(panels["ncl"].lines) == 2 and len(panels["das"].lines) == 4  # the naive reference grey behind others
    earlier = panels["das"].lines[2].get_ydata()  # das's own earlier-domain curve, after ncl's two grey lines
    deepest = 3.0 + 0.10 + 0.001 * _seed_mean(records, "das")  # the dip of the second domain, mean over seeds
    assert np.isnan(earlier[3]) and math.isclose(np.nanmax(earlier), deepest, abs_tol=1e-5)
    monkeypatch.undo()
    path = plot_continual(records, tmp_path / "continual.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    assert GROUP_PLOTS["continual"] is plot_continual  # drawn for every group by `dapbench report`
    assert plot_continual(report_records, tmp_path / "none.png") is None  # no curves, no plot
    assert not (tmp_path / "none.png").exists()


class _Verdict:
    """A comparison with a reference as the report's tables state it: its label, mean difference and resolution."""

    def __init__(self, label: str, mean: float, resolved: bool):
        self.label, self.mean, self._resolved = label, mean, resolved

    def resolved(self) -> bool:
        return self._resolved


def test_the_gap_says_which_end_of_run_verdicts_it_reverses(report_records):
    from benchmark.report.stability_gap import stability_gap_markdown

    dips = {"ncl": 0.30, "das": 0.10, "none": 0.30}  # das dips shallower than ncl, none as deep
    records = [_with_curves(r, dips[r["method_label"]]) for r in report_records]
    at_the_end = {  # das forgets more than ncl at the end (reversed), none less (its depth is a tie: end only)
        "forgetting": [_Verdict("das", +0.05, True), _Verdict("none", -0.2, True)],
        "general rise": [_Verdict("das", -0.01, False), _Verdict("none", -0.3, False)],
    }
    lines = stability_gap_markdown(records, "ncl", at_the_end)
    (line,) = [x for x in lines if x.startswith("- Does the gap reorder")]
    earlier, general = line.split("Depth on ")[1:]
    assert "reversed for `das`" in earlier and "resolved at the end only: `none`" in earlier
    assert "no verdict reversed" in general and "resolved neither way: `none`" in general
    assert not [x for x in stability_gap_markdown(records, "ncl") if x.startswith("- Does the gap")]


def test_the_gap_counts_the_updates_to_win_back_half_of_each_dip():
    """A dip at update 2 of 0.4 nats, half won back two updates later; a second domain's rise that never turns."""
    steps = [0, 2, 4, 6]
    flat = [3.0, 3.0, 3.0, 3.0]
    curves = [
        {"a": flat, "general": flat},
        {"a": [3.0, 3.4, 3.2, 3.1], "general": flat},
        {"a": [3.0, 3.1, 3.2, 3.3], "b": [3.0, 3.1, 3.2, 3.3], "general": [3.0, 2.9, 2.9, 2.8]},
    ]
    record = {"sequence": ["a", "b", "c"], "domains": [{"curve": {"steps": steps, "losses": c}} for c in curves]}
    gap = stability_gap(record)
    first, second = (stage["earlier"] for stage in gap["stages"])
    assert first["depth"] == pytest.approx(0.4) and first["dip_step"] == 2 and first["half_recovery_updates"] == 2
    assert second["depth"] == pytest.approx(0.3) and second["half_recovery_updates"] is None
    assert gap["earlier_depth"] == pytest.approx(0.35) and gap["earlier_unrecovered"] == 1
    assert gap["earlier_won_back"] == pytest.approx(0.3 / 0.7)  # the dips' total won back over their total depth
    assert gap["earlier_half_recovery_updates"] == 2
    # general text never rose: no dip, nothing to win back, nothing unrecovered
    assert gap["general_depth"] == 0 and gap["general_won_back"] is None and gap["general_unrecovered"] == 0
