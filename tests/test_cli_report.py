import dataclasses
import json

import numpy as np
import pytest
import torch

from benchmark.cli import main
from benchmark.config import apply_overrides, profile_config
from benchmark.errors import DapbenchError
from benchmark.inputs import prepare_data
from benchmark.io import atomic_write_json
from benchmark.records import load_records
from benchmark.registry import Registry, default_registry
from benchmark.report import leaderboard_markdown, write_report
from benchmark.runner import ContinualRun


def test_overrides_are_typed_and_validated():
    config = apply_overrides(
        profile_config("mini"),
        [
            "dap.steps=7",
            "finetune.lr=1e-4",
            "seeds=[1,2]",
            "finetune.epochs.aclarc_sup=3",
            "das.contrast_lambda=0.5",
        ],
    )
    assert config.dap.steps == 7 and config.finetune.lr == 1e-4 and config.seeds == (1, 2)
    assert config.finetune.epochs["aclarc_sup"] == 3
    assert config.method_options == {"das": {"contrast_lambda": 0.5}}
    with pytest.raises(DapbenchError, match="unknown config key 'stepz'"):
        apply_overrides(config, ["dap.stepz=3"])
    with pytest.raises(DapbenchError, match="expects int"):
        apply_overrides(config, ["dap.steps=many"])
    with pytest.raises(DapbenchError, match="unknown profile"):
        profile_config("huge")


def test_registry_lists_builtins_and_rejects_clashes():
    assert {"none", "ncl", "one"} <= set(default_registry().names())
    registry = Registry({"a": "methods.ncl:NCL"})
    with pytest.raises(DapbenchError, match="registered twice"):
        registry.register("a", "methods.one:ONE")
    with pytest.raises(DapbenchError, match="declares name 'ncl'"):
        registry.get("a")


def test_cli_rejects_unknown_method_before_any_work(capsys, tmp_path):
    assert main(["run", "--methods", "ncl,dass", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'dass'" in err and "fix:" in err
    assert not (tmp_path / "results").exists()


def test_cli_rejects_an_unknown_end_task_protocol(capsys, tmp_path):
    args = ["run", "--methods", "ncl", "--set", "finetune.protocol=probe", "--output-dir", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "invalid finetune.protocol='probe'" in err and "linear_probe" in err
    assert not (tmp_path / "results").exists()


def test_cli_missing_data_root(capsys, tmp_path):
    code = main(
        [
            "run",
            "--profile",
            "mini",
            "--data-root",
            str(tmp_path / "none"),
            "--model",
            str(tmp_path),
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert code == 2 and "data root not found" in capsys.readouterr().err


def test_cli_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "ncl" in out and "seq0" in out and "chemprot_sup" in out


def test_cli_run_and_report_end_to_end(tiny_config, capsys):
    args = [
        "run",
        "--profile",
        "synthetic",
        "--model",
        tiny_config.model,
        "--data-root",
        tiny_config.data_root,
        "--general-heldout",
        tiny_config.general_heldout,
        "--sequence",
        "alpha,beta",
        "--methods",
        "none,ncl",
        "--seeds",
        "1",
        "--output-dir",
        tiny_config.output_dir,
        "--quiet",
        "--set",
        "dap.steps=2",
        "--set",
        "dap.batch_size=4",
        "--set",
        "dap.per_device_batch_size=4",
        "--set",
        "finetune.default_epochs=1",
        "--set",
        "finetune.max_train_examples=16",
        "--set",
        "finetune.max_test_examples=16",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ncl seed 1: final acc" in out and "naive continual DAP forgetting rate" in out
    from pathlib import Path

    root = Path(tiny_config.output_dir)
    records = load_records(root / "results")
    assert {r["method"] for r in records} == {"none", "ncl"}
    board = (root / "leaderboard.md").read_text()
    assert "| `ncl` | 1 |" in board and "final acc ↑" in board and "forgetting (acc) ↓" in board
    assert list((root / "results" / "plots").glob("ncl-*-acc.png"))
    assert list((root / "results" / "tables").glob("ncl-*-macro_f1.csv"))
    assert "- seeds: 1; commit(s):" in board and "**Reading**" in board and "One seed per method" in board
    assert "-forgetting.png)" in board and "-mlm-loss.png)" in board
    assert list((root / "results" / "plots").glob("synthetic-*-mlm-loss.png"))
    # the same command again keeps the finished records byte for byte (no rewrite, no extra invocation)
    finished = {p: p.read_bytes() for p in (root / "results" / "synthetic").glob("*.json")}
    assert main(args) == 0
    assert "ncl seed 1: complete, kept" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in finished} == finished

    # the committed record is re-derived from scratch, number for number
    record_path = next((root / "results" / "synthetic").glob("ncl-*.json"))
    again = root / "again"
    threads_before = torch.get_num_threads()
    # the record names its inputs portably (``local:<name>``, no absolute paths): this machine's are passed
    record = json.loads(record_path.read_text())
    assert record["config"]["model"] == f"local:{Path(tiny_config.model).name}"
    assert tiny_config.data_root not in record_path.read_text() and str(root) not in record_path.read_text()
    inputs = ["--model", tiny_config.model, "--data-root", tiny_config.data_root]
    inputs += ["--general-heldout", tiny_config.general_heldout]
    assert main(["reproduce", str(record_path), "--output-dir", str(again), "--quiet", *inputs]) == 0
    out = capsys.readouterr().out
    assert "0 outside tolerance" in out and "largest score difference: 0.00000" in out
    recorded = json.loads(record_path.read_text())["environment"]["torch_threads"]
    assert f"CPU threads: {recorded} (the record's: {recorded})" in out  # the record's count by default
    assert torch.get_num_threads() == threads_before  # and restored afterwards


def test_report_on_a_corrupt_record_names_the_file(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "broken.json").write_text("{ not json")
    with pytest.raises(DapbenchError, match="broken.json is corrupt"):
        write_report(tmp_path)
    assert not (tmp_path / "leaderboard.md").exists()  # nothing half-written


def test_leaderboard_aggregates_seeds(tiny_config, tmp_path):
    data = prepare_data(tiny_config)
    records = [ContinualRun(tiny_config, data, "ncl", seed, show_progress=False).execute() for seed in (1, 2)]
    # A stale record of the same method and seed (an older config, so another run id) is not a third seed.
    stale = dict(records[0], run_id="ncl-seq0-seed1-0000000000")
    with pytest.raises(DapbenchError, match="two records of `ncl` seed 1 .*ncl-seq0-seed1-0000000000"):
        leaderboard_markdown([*records, stale])
    for record in (*records, stale):
        atomic_write_json(tmp_path / "results" / "x" / f"{record['run_id']}.json", record)
    with pytest.raises(DapbenchError, match="delete the stale record"):
        write_report(tmp_path)
    assert not (tmp_path / "leaderboard.md").exists() and not (tmp_path / "results" / "tables").exists()
    text = leaderboard_markdown(records)
    row = next(line for line in text.splitlines() if line.startswith("| `ncl`"))
    assert "| 2 |" in row and "±" in row
    assert "- Seed spread: the largest std of final macro-F1" in text
    wall = sum(r["timing"]["wall_seconds"] for r in records) / 3600
    assert f"- compute: 2 runs, {wall:.2f} h of run wall time" in text
    # A group with more runs comes first, whatever its name sorts as.
    alone = dict(records[0], profile="aaa")
    pair = [dict(records[0], profile="zzz"), dict(records[1], profile="zzz", method="one", method_label="one")]
    text = leaderboard_markdown([alone, *pair])
    assert text.index("profile `aaa`") > text.index("profile `zzz`")


def test_atomic_json_write_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_importance_similarity(tiny_config):
    from methods._shared.importance_study import importance_similarity

    similarity = importance_similarity(tiny_config)
    assert set(similarity["normalised"]["pairs"]) == {"alpha/beta"}
    assert -1.0 <= similarity["raw"]["mean"] <= 1.0


def test_importance_stability_reports_split_half_rank_correlations(tiny_config):
    from methods._shared.importance_study import importance_stability

    result = importance_stability(tiny_config, sizes=(8,))
    assert set(result["split_half"]) == {"per_example/8", "per_batch/8"}
    for per_unit in result["split_half"].values():
        assert set(per_unit) == {"head", "intermediate", "output"}
        assert all(-1 <= v <= 1 for v in per_unit.values())
    assert set(result["normalised"]["8"]) == {"positive_tanh", "abs_tanh"}


def test_reading_names_methods_whose_scores_equal_no_dap():
    from benchmark.report import _same_scores_as_no_dap

    def record(method, matrix, seed=1):
        return {"method": method, "method_label": method, "seed": seed, "matrices": {"acc": matrix}}

    none = record("none", [[0.5, None], [0.5, 0.6]])
    same = record("ncl", [[0.5, None], [0.5, 0.6]])
    other = record("das", [[0.5, None], [0.5, 0.7]])
    pool = record("pool", [[None, None], [0.5, 0.6]])
    assert _same_scores_as_no_dap([none, same, other, pool], "none") == ["ncl", "pool"]


def test_paired_comparison_with_no_dap_separates_consistent_differences_from_noise():
    import pandas as pd

    from benchmark.report import _against_no_dap, paired_against_reference

    rows = [("none", s, v) for s, v in ((1, 0.50), (2, 0.52), (3, 0.51))]
    rows += [("worse", s, v) for s, v in ((1, 0.45), (2, 0.47), (3, 0.459))]  # 5 points below on every seed
    rows += [("noisy", s, v) for s, v in ((1, 0.60), (2, 0.44), (3, 0.52))]  # +1 point on average, +-8 spread
    rows += [("same", s, v) for s, v in ((1, 0.50), (2, 0.52), (3, 0.51))]
    rows += [("one_seed", 1, 0.9)]
    part = pd.DataFrame(rows, columns=["method", "seed", "final macro-F1"])
    table = paired_against_reference(part, "none")
    assert set(table.index) == {"worse", "noisy", "same"}  # one shared seed is not testable
    assert table.loc["worse", "mean"] == pytest.approx(-5.03, abs=0.01) and table.loc["worse", "q"] < 0.05
    assert table.loc["noisy", "q"] > 0.05 and table.loc["same", "p"] == 1.0
    (line,) = _against_no_dap(part, "none")
    assert "consistently above it none; consistently below it `worse` (-5.03)" in line
    assert "do not separate the other 2 from no DAP" in line


def test_report_refuses_a_group_measured_on_different_base_losses(tiny_config):
    data = prepare_data(tiny_config)
    records = [ContinualRun(tiny_config, data, m, 1, show_progress=False).execute() for m in ("none", "ncl")]
    leaderboard_markdown(records)  # the same evaluation: fine
    moved = json.loads(json.dumps(records[1]))
    moved["mlm_loss"]["base"]["general"] += 0.04  # e.g. measured in another precision
    with pytest.raises(DapbenchError, match="base-model held-out loss of 'general' differs"):
        leaderboard_markdown([records[0], moved])


def test_loss_verdicts_and_reading_name_what_beats_the_references():
    import pandas as pd

    from benchmark.report import _loss_reading, _verdicts

    rows = []
    for seed, jitter, other in ((1, 0.0, 0.004), (2, 0.01, -0.006), (3, -0.01, 0.003)):
        rows.append(("none", seed, 0.0, 0.0, 0.0))
        rows.append(("ncl", seed, 0.20 + jitter, 0.22 + jitter, 0.35 + jitter))
        # forgets less and keeps general knowledge, with the same plasticity as ncl up to seed noise
        rows.append(("good", seed, 0.05 + other, 0.10 - other, 0.35 + jitter + 2 * other))
        rows.append(("noisy", seed, 0.20 + 10 * jitter, 0.22 - 10 * jitter, 0.35 + 10 * jitter))
    part = pd.DataFrame(rows, columns=["method", "seed", "forgetting", "general rise", "plasticity"])
    part["CKA to base"] = np.nan
    references = {"naive_continual": "ncl", "no_dap": "none"}
    verdicts = _verdicts(part, references)
    assert verdicts["good"].startswith("F↓ `ncl` · F↑ `none`") and "G↓ `ncl`" in verdicts["good"]
    assert "P" not in verdicts["good"].replace("P↑ `none`", "")  # plasticity equals ncl's within noise
    assert "noisy" not in verdicts or "`ncl`" not in verdicts["noisy"]
    reading = "\n".join(_loss_reading(part, references))
    assert "Against `ncl`" in reading and "less forgetting: `good` (-0.150)" in reading
    assert "Against `none`" in reading


def test_mask_reading_summarises_the_measured_damping_per_importance_range():
    from benchmark.report import _mask_reading

    def record(seed, top):
        mask = {"damping_per_bin": [1.0, 1.0, None, 1.0, 1.0, 0.99, 0.99, 0.99, 0.99, top]}
        return {"method": "das", "method_label": "das", "seed": seed, "domains": [{"method_report": {"mask": mask}}]}

    (line,) = _mask_reading([record(1, 0.8), record(2, 0.9), {"method": "ncl", "seed": 1, "domains": [{}]}])
    assert "`das` soft-mask" in line and "2 domain-runs" in line
    assert "0.0-0.5 keep 100.0%, 0.5-0.9 keep 99.0%, 0.9-1.0 keep 85.0%" in line


def test_records_made_before_a_method_option_existed_are_flagged_as_older_code():
    from benchmark.report import _older_code_reading, _options_added_since
    from methods.das import DASConfig

    current = dataclasses.asdict(DASConfig())
    older = {k: v for k, v in current.items() if k not in ("mask_target", "other_params")}
    fresh = {"method": "das", "method_label": "das", "method_config": current}
    stale = {"method": "dga", "method_label": "dga", "method_config": older}
    assert _options_added_since(fresh) == []
    assert _options_added_since(stale) == ["mask_target", "other_params"]
    (line,) = _older_code_reading([fresh, stale])
    assert line.startswith("- `dga` (flag `older code`): its records predate the option(s) mask_target")


def test_variant_reading_compares_each_option_variant_with_its_method():
    import pandas as pd

    from benchmark.report import _variant_reading

    rows = []
    for seed, noise in ((1, 0.0), (2, 0.01), (3, -0.01)):
        rows.append({"method": "das", "seed": seed, "forgetting": 0.2 + noise, "general rise": 0.2, "plasticity": 0.3})
        rows.append(
            {"method": "das[x=1]", "seed": seed, "forgetting": 0.1 + noise, "general rise": 0.2, "plasticity": 0.3}
        )
        rows.append(
            {"method": "das[x=1,y=2]", "seed": seed, "forgetting": 0.05, "general rise": 0.25, "plasticity": 0.3}
        )
        rows.append({"method": "ncl", "seed": seed, "forgetting": 0.3, "general rise": 0.2, "plasticity": 0.3})
    # das[y=2] was not measured: das[x=1,y=2] is read against das[x=1] only (its matched control).
    first, second = _variant_reading(pd.DataFrame(rows))
    assert (
        first.startswith("- `das[x=1,y=2]` against `das[x=1]`")
        and "forgetting -0.050 (p=" in first
        and "general rise +0.050 (p=0)" in first
    )
    assert (
        second.startswith("- `das[x=1]` against `das`")
        and "forgetting -0.100 (p=" in second
        and "general rise +0.000 (p=1)" in second
    )


def test_option_parents_drop_one_option_at_a_time():
    from benchmark.report import option_parents

    assert option_parents("das[a=1]") == ["das"]
    assert option_parents("das[a=1,b=x,c=2]") == ["das[b=x,c=2]", "das[a=1,c=2]", "das[a=1,b=x]"]


def test_report_removes_the_tables_and_plots_of_records_that_are_gone(tiny_config, tmp_path):
    config = dataclasses.replace(tiny_config, sequence="alpha")
    out = tmp_path / "out"
    record = ContinualRun(config, prepare_data(config), "ncl", 3, show_progress=False).execute()
    path = out / "results" / "synthetic" / f"{record['run_id']}.json"
    atomic_write_json(path, record)
    write_report(out)
    tables = sorted((out / "results" / "tables").iterdir())
    assert tables and all(record["run_id"] in p.name for p in tables)
    stale = out / "results" / "plots" / "ncl-alpha-seed9-0000000000-acc.png"
    stale.write_bytes(b"old")
    write_report(out)
    assert not stale.exists() and sorted((out / "results" / "tables").iterdir()) == tables
    path.unlink()
    write_report(out)
    assert not list((out / "results" / "tables").iterdir()) and not list((out / "results" / "plots").iterdir())
