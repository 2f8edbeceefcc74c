"""Grid fan-out: `--launcher local:N` (a process per run) and `--launcher slurm` via submitit's local executor."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import synthetic_run

from benchmark.cli import main
from benchmark.errors import DapbenchError
from benchmark.tools import launch
from benchmark.tools.launch import GridRun, expand_sequences

NUMBERS = ("matrices", "summary", "lm_loss", "representation")


def _args(world_root: Path, model: Path, out: Path, methods: str, seeds: str) -> list[str]:
    settings = ("dap.steps=4", "finetune.default_epochs=1", "finetune.max_train_examples=24")
    return synthetic_run(world_root, model, out, methods, *settings, seeds=seeds)


def _records(out: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in (out / "results" / "synthetic").glob("*.json")}


def test_sequence_grids_expand_and_a_backward_range_is_refused():
    assert expand_sequences("seq0..seq4") == ["seq0", "seq1", "seq2", "seq3", "seq4"]
    assert expand_sequences("seq0+seq3") == ["seq0", "seq3"]
    assert expand_sequences("restaurant,phone") == ["restaurant,phone"]
    assert expand_sequences(None) == [None]
    with pytest.raises(DapbenchError, match="empty sequence range 'seq3..seq1'"):
        expand_sequences("seq3..seq1")


@pytest.mark.parametrize("launcher", ["gpu:2", "local:0", "local", "slurm:3"])
def test_an_unknown_launcher_is_refused_before_any_work(launcher, world_root, tiny_model, tmp_path, capsys):
    args = _args(world_root, tiny_model, tmp_path, "ncl", "1")
    assert main([*args, "--launcher", launcher]) == 2
    assert f"unknown launcher '{launcher}'" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_local_launcher_runs_a_2x2_grid_like_one_process_and_the_report_merges_it(
    world_root, tiny_model, tmp_path, capsys, monkeypatch
):
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the children's thread count, and ours below: same float sums
    args = _args(world_root, tiny_model, tmp_path / "grid", "ncl,one", "1,2")
    assert main([*args, "--launcher", "local:2"]) == 0
    said = capsys.readouterr().out
    assert said.count(": started") == 4 and said.count(": finished") == 4
    grid = _records(tmp_path / "grid")
    assert len(grid) == 4
    leaderboard = (tmp_path / "grid" / "leaderboard.md").read_text()
    assert "| `ncl` | 2 |" in leaderboard and "| `one` | 2 |" in leaderboard  # merged: 2 seeds per method

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(_args(world_root, tiny_model, tmp_path / "serial", "ncl,one", "1,2")) == 0
    finally:
        torch.set_num_threads(threads)
    serial = _records(tmp_path / "serial")
    assert grid.keys() == serial.keys()  # the same run ids: the same configuration
    for name, record in grid.items():
        assert {k: record[k] for k in NUMBERS} == {k: serial[name][k] for k in NUMBERS}, name

    assert main([*args, "--launcher", "local:2"]) == 0  # finished runs are not launched again
    assert capsys.readouterr().out.count("complete, kept") == 4


def test_slurm_launcher_submits_one_job_per_run_through_submitits_local_executor(
    world_root, tiny_model, tmp_path, capsys
):
    pytest.importorskip("submitit")
    args = _args(world_root, tiny_model, tmp_path, "ncl", "1,2")
    assert main([*args, "--launcher", "slurm", "--slurm-executor", "local", "--slurm-time", "10", "--wait"]) == 0
    said = capsys.readouterr().out
    assert said.count("submitted as job") == 2 and said.count("finished") == 2
    assert len(_records(tmp_path)) == 2 and (tmp_path / "leaderboard.md").is_file()
    assert len(list((tmp_path / ".dapbench" / "slurm").glob("*_result.pkl"))) == 2


def test_local_launcher_gives_each_concurrent_run_its_own_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "_visible_gpus", lambda: ["0", "1"])
    in_flight, seen, lock = {}, [], threading.Lock()

    def fake_child(argv, stdout, stderr, env):
        gpu = env["CUDA_VISIBLE_DEVICES"]
        with lock:
            assert gpu not in in_flight.values(), f"GPU {gpu} given to two runs at once"
            in_flight[argv[-1]] = gpu
            seen.append(gpu)
        time.sleep(0.05)
        with lock:
            del in_flight[argv[-1]]
        return 0

    monkeypatch.setattr(launch.subprocess, "call", fake_child)
    runs = {GridRun("m", seed, "seq0", f"m-seed{seed}", tmp_path / f"{seed}.json"): [str(seed)] for seed in range(6)}
    assert launch.launch_local(runs, processes=2, logs=tmp_path / "logs", echo=lambda line: None) == []
    assert sorted(set(seen)) == ["0", "1"] and len(seen) == 6


def test_the_synthetic_defaults_planned_ids_are_the_ids_its_grid_processes_write(tmp_path, capsys):
    """Each grid process reads its resolved configuration from a file, fields without a flag (the synthetic
    world's general corpus) included, so what the launcher planned is what the children compute."""
    from benchmark.api import planned_run_ids, resolve_config

    out = tmp_path / "out"
    overrides = ["dap.steps=2", "finetune.default_epochs=1", "finetune.max_train_examples=16", "dap.heldout_chunks=8"]
    args = ["run", "--methods", "ncl", "--seeds", "1", "--sequence", "alpha,beta", "--output-dir", str(out), "--quiet"]
    args += [item for override in overrides for item in ("--set", override)]
    assert main([*args, "--launcher", "local:1"]) == 0
    config = resolve_config(
        "synthetic", methods=["ncl"], seeds=[1], sequence="alpha,beta", output_dir=str(out), overrides=overrides
    )
    planned = planned_run_ids(config)
    written = {path.stem for path in (out / "results" / "synthetic").glob("*.json")}
    assert set(planned.values()) == written and len(written) == 1
    (child,) = (out / ".dapbench" / "grid-configs").glob("*.json")
    assert json.loads(child.read_text())["general_corpus"].endswith("general.txt")
