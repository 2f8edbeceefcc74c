"""Bad input is a named error with exit code 2 before any training, and nothing is written to results/."""

import shutil
from pathlib import Path

import pytest
from cli_helpers import whole_record

from benchmark.cli import main

CONFIG_CASES = [
    (["--set", "nosuch.x=1"], "unknown config section 'nosuch'"),
    (["--set", "l2xp.strength=1"], "unknown config section 'l2xp'"),
    (["--set", "das.contrast_lambda=abc"], "das.contrast_lambda expects a number, got 'abc'"),
    (["--set", "das.contrast_lamda=1"], "did you mean 'contrast_lambda'"),
    (["--set", "finetune.epochs.restaurant_sup=abc"], "finetune.epochs.restaurant_sup expects a number, got 'abc'"),
    (["--seeds", "abc"], "--seeds 'abc' is not a list of integers"),
    (["--set", "dap.mlm_probability=1.5"], "dap.mlm_probability=1.5 is out of range"),
    (["--set", "dap.log_every=0"], "dap.log_every=0 is out of range"),
    (["--set", "finetune.batch_size=0"], "finetune.batch_size=0 is out of range"),
    (["--set", "dap.heldout_fraction=1.0"], "dap.heldout_fraction=1.0 is out of range"),
    (["--set", "finetune.protocol=probe"], "invalid finetune.protocol='probe': no end-task protocol"),
    (["--set", "profile=../../ESCAPED"], "profile '../../ESCAPED' cannot name a file"),
]


@pytest.mark.parametrize(("extra", "message"), CONFIG_CASES, ids=[" ".join(c[0]) for c in CONFIG_CASES])
def test_bad_configuration_is_refused_before_any_work(extra, message, capsys, tmp_path):
    assert main(["run", "--methods", "ncl", "--output-dir", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "fix:" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # not even the synthetic world was built


def _world_copy(world_root, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(world_root, copy)
    return copy


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda root: (root / "alpha.txt").write_text("one single passage\n"), "corpus alpha"),
        (lambda root: (root / "alpha_train.jsonl").write_text("42\n"), "end task alpha_sup: corrupt file"),
    ],
    ids=["one-line corpus", "jsonl line 42"],
)
def test_bad_data_is_a_named_error_before_training(corrupt, message, world_root, tiny_model, tmp_path, capsys):
    root = _world_copy(world_root, tmp_path)
    corrupt(root)
    args = ["run", "--profile", "synthetic", "--model", str(tiny_model), "--data-root", str(root)]
    args += ["--general-heldout", str(root / "general_heldout.txt"), "--sequence", "alpha,beta", "--methods", "ncl"]
    args += ["--seeds", "1", "--output-dir", str(tmp_path / "out"), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "fix:" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "results").exists()


def test_a_prompt_that_does_not_fit_the_models_positions_is_refused_before_any_work(
    world_root, tiny_model, tmp_path, capsys
):
    args = ["run", "--profile", "synthetic", "--model", str(tiny_model), "--data-root", str(world_root)]
    args += ["--general-heldout", str(world_root / "general_heldout.txt"), "--sequence", "alpha,beta"]
    args += ["--methods", "ncl,prompt_one", "--set", "prompt_one.num_tokens=4000", "--seeds", "1"]
    args += ["--output-dir", str(tmp_path / "out"), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "prompt_one: 4000 prompt positions + sequences of up to" in err and "fix:" in err
    assert "Traceback" not in err and not (tmp_path / "out" / "results").exists()  # not even ncl ran


def test_report_refuses_a_record_whose_run_id_would_escape_the_output_folder(tmp_path):
    import json

    from benchmark.errors import DapbenchError
    from benchmark.report import write_report

    committed = Path(__file__).resolve().parents[1] / "results" / "mini"
    record = whole_record(sorted(committed.glob("ncl-seq0-seed2021-*.json"))[0])
    record["run_id"] = "../../../../x"
    (tmp_path / "results" / "mini").mkdir(parents=True)
    (tmp_path / "results" / "mini" / "evil.json").write_text(json.dumps(record))
    with pytest.raises(DapbenchError, match="record run id '../../../../x' cannot name a file"):
        write_report(tmp_path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["evil.json", "mini", "results"]


@pytest.mark.parametrize(("signame", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_interrupt_is_one_line_with_resume_advice_and_keeps_finished_work(
    signame, code, world_root, tiny_model, tmp_path
):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    args = [sys.executable, "-m", "benchmark.cli", "run", "--profile", "synthetic", "--model", str(tiny_model)]
    args += ["--data-root", str(world_root), "--general-heldout", str(world_root / "general_heldout.txt")]
    args += ["--sequence", "alpha,beta", "--methods", "ncl", "--seeds", "1"]
    args += ["--output-dir", str(out), "--quiet", "--set", "dap.steps=100000", "--set", "dap.log_every=100000"]
    # A shell starts background jobs with SIGINT ignored, and Python keeps an inherited "ignore": give the run
    # the default disposition, as a terminal would, so the test also holds when the suite runs in the background.
    process = subprocess.Popen(
        args,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    ledger, deadline = None, time.time() + 120
    while time.time() < deadline and ledger is None and process.poll() is None:  # until training has started
        ledger = next(out.glob(".dapbench/runs/*/base-mlm-loss.json"), None)
        time.sleep(0.5)
    assert ledger is not None, (
        f"the run did not start: {process.poll()} {process.stderr.read() if process.poll() else ''}"
    )
    err = None
    for _ in range(8):  # a loaded machine can delay delivery: ask again until the process has ended
        process.send_signal(getattr(signal, signame))
        try:
            _, err = process.communicate(timeout=30)
            break
        except subprocess.TimeoutExpired:
            continue
    assert err is not None, "the run did not stop"
    assert process.returncode == code
    assert "Traceback" not in err and "run the same command again to resume" in err
    assert ledger.exists()  # finished work is kept


STOP_IN_A_FINALISER = """
import os, signal, sys, time
from benchmark import cli


class StopInItsFinaliser:
    def __del__(self):
        os.kill(os.getpid(), signal.{signame})
        time.sleep(1)  # the handler runs here, inside the finaliser, where Python can only print what it raises


def finalise_then_work(args):
    StopInItsFinaliser()
    time.sleep(15)
    print("the work finished", file=sys.stderr)
    return 0


cli.cmd_list = finalise_then_work  # the command `list` now runs the finaliser, then works
sys.exit(cli.main(["list"], console=True))
"""


@pytest.mark.parametrize(("signame", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stop_signal_that_lands_in_a_finaliser_still_stops_the_run_quietly(signame, code):
    """CI once saw SIGTERM land in a tokenizer library's ``__del__``: Python printed an "Exception ignored"
    traceback there and the run went on until a second signal."""
    import signal
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", STOP_IN_A_FINALISER.format(signame=signame)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert done.returncode == code, done.stderr
    assert "the work finished" not in done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert "run the same command again to resume" in done.stderr


def test_other_exceptions_in_finalisers_still_reach_the_previous_hook():
    from types import SimpleNamespace

    from benchmark.stopping import SwallowedStopRedelivery

    seen = []
    hook = SwallowedStopRedelivery(seen.append)
    unraisable = SimpleNamespace(exc_value=ValueError("a finaliser's own bug"))
    hook(unraisable)
    assert seen == [unraisable]


def test_two_identical_commands_in_one_folder_neither_crash_nor_duplicate(world_root, tiny_model, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    args = [sys.executable, "-m", "benchmark.cli", "run", "--profile", "synthetic", "--model", str(tiny_model)]
    args += ["--data-root", str(world_root), "--general-heldout", str(world_root / "general_heldout.txt")]
    args += ["--sequence", "alpha", "--methods", "ncl", "--seeds", "1", "--output-dir", str(out), "--quiet"]
    args += ["--set", "dap.steps=2", "--set", "finetune.default_epochs=1", "--set", "finetune.max_train_examples=16"]
    root = Path(__file__).resolve().parents[1]
    processes = [
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root) for _ in "ab"
    ]
    results = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], results
    assert len(list((out / "results" / "synthetic").glob("*.json"))) == 1
    said = " ".join(stdout for stdout, _ in results)
    assert said.count("ncl seed 1: plasticity") == 1  # trained once; the other skipped or kept it
    assert not list(out.rglob("*.tmp"))


def test_a_run_locked_by_another_process_is_skipped_with_a_message(world_root, tiny_model, tmp_path, capsys):
    import subprocess
    import sys

    from benchmark.api import planned_run_ids, resolve_config

    args = ["run", "--profile", "synthetic", "--model", str(tiny_model), "--data-root", str(world_root)]
    args += ["--general-heldout", str(world_root / "general_heldout.txt"), "--sequence", "alpha", "--methods", "ncl"]
    args += ["--seeds", "1", "--output-dir", str(tmp_path), "--quiet"]
    config = resolve_config(
        "synthetic",
        model=str(tiny_model),
        data_root=str(world_root),
        sequence="alpha",
        methods=["ncl"],
        seeds=[1],
        general_heldout=str(world_root / "general_heldout.txt"),
        output_dir=str(tmp_path),
    )
    run_root = Path(config.work_dir) / "runs" / planned_run_ids(config)[("ncl", 1)]
    run_root.parent.mkdir(parents=True)
    holder = subprocess.Popen(  # another process holds the run's lock
        [
            sys.executable,
            "-c",
            f"from filelock import FileLock; lock = FileLock({str(run_root) + '.lock'!r}); lock.acquire();"
            " print('held', flush=True); import time; time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(args) == 0
    finally:
        holder.kill()
    assert "ncl seed 1: in progress in another process, skipped" in capsys.readouterr().out
    assert not list(tmp_path.glob("results/synthetic/*.json"))


def test_preflight_names_a_corrupt_record_a_missing_or_truncated_model_before_training(
    world_root, tiny_model, tmp_path, capsys
):
    base = ["run", "--profile", "synthetic", "--data-root", str(world_root), "--sequence", "alpha", "--methods", "ncl"]
    base += ["--general-heldout", str(world_root / "general_heldout.txt"), "--quiet"]
    (tmp_path / "a" / "results" / "x").mkdir(parents=True)
    (tmp_path / "a" / "results" / "x" / "old.json").write_text("{ broken")
    assert main([*base, "--model", str(tiny_model), "--output-dir", str(tmp_path / "a")]) == 2
    assert "old.json is corrupt" in capsys.readouterr().err
    assert main([*base, "--model", "models/nothing/here", "--output-dir", str(tmp_path / "b")]) == 2
    assert "model directory not found" in capsys.readouterr().err
    truncated = tmp_path / "model"
    shutil.copytree(tiny_model, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert main([*base, "--model", str(truncated), "--output-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "unreadable" in err and "Traceback" not in err
    missing = [a if a != str(world_root / "general_heldout.txt") else str(world_root / "gone.txt") for a in base]
    assert main([*missing, "--model", str(tiny_model), "--output-dir", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "general_heldout" in err and "gone.txt' is not a file" in err and "Traceback" not in err
    assert not list(tmp_path.glob("*/.dapbench/runs/*"))  # no run started
