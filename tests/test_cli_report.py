import json

import pytest
import torch

from benchmark.cli import main
from benchmark.config import apply_overrides, profile_config
from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_json
from benchmark.records.store import load_records
from benchmark.registry import Registry, default_registry


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
    with pytest.raises(DapbenchError, match="dap.steps expects a number, got 'many'"):
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
    # what the run prints is what its leaderboard says: one seed resolves nothing, and it says so
    assert "ncl seed 1: plasticity" in out and "one seed per method: no difference between methods is resolved" in out
    assert "verdicts: none resolved" in out and "leaderboard: " in out and "next: " in out
    from pathlib import Path

    root = Path(tiny_config.output_dir)
    records = load_records(root / "results")
    assert {r["method"] for r in records} == {"none", "ncl"}
    board = (root / "leaderboard.md").read_text()
    assert "| `ncl` | 1 |" in board and "final acc ↑" in board and "forgetting (acc) ↓" in board
    report = root / "results" / "report"
    assert list((report / "runs").glob("ncl-*.md")) and list((report / "plots").glob("*-heldout-loss.png"))
    assert (
        "seeds 1, domain order(s) custom-alpha-beta;" in board
        and "**Reading**" in board
        and "One seed per method" in board
    )
    # records made now keep per-chunk losses: never told they were made before them (issue #89)
    assert "unknown for these records" not in board and "no paired difference" in board
    assert "-forgetting.png)" in board and "-heldout-loss.png)" in board
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
    assert out.startswith(f"reproduce: re-running {record_path} from scratch")
    assert "0 outside tolerance" in out and "largest score difference: 0.00000" in out
    assert out.rstrip().endswith("verdict: REPRODUCED")
    recorded = json.loads(record_path.read_text())["environment"]["torch_threads"]
    assert f"CPU threads: {recorded} (the record's: {recorded})" in out  # the record's count by default
    assert torch.get_num_threads() == threads_before  # and restored afterwards
    # its stages alone: compared on every stage number, its update sizes included; nothing to add, nothing written
    stages = ["reproduce", str(record_path), "--stages-only", "--output-dir", str(root / "stages"), "--quiet"]
    assert main([*stages, *inputs]) == 0
    out = capsys.readouterr().out
    assert "(its DAP stages alone)" in out and "0 outside tolerance" in out and "nothing written" in out
    assert out.rstrip().endswith("verdict: STAGES REPRODUCED") and not (root / "stages" / "results").exists()
    # ... or each evaluated on its own domain's held-out set alone, asked for as a kind of stages-only re-run
    own = ["reproduce", str(record_path), "--own-domain", "--output-dir", str(root / "own"), "--quiet", *inputs]
    assert main(own) == 2 and "add --stages-only" in capsys.readouterr().err
    assert main([*own, "--stages-only"]) == 0
    out = capsys.readouterr().out
    assert "each on its own domain's held-out set" in out and out.rstrip().endswith("verdict: STAGES REPRODUCED")


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
