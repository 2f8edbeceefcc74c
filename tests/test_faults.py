"""Fault injection: kill -9 at random points, failing writes, corrupt checkpoints, caches and work files.

Every case ends in one of two ways: a named error that says what to do, or a rebuilt result identical to
an undisturbed run's. Never a traceback, a lost file or a silently different number. The fast cases run by
default (and in CI); the many-kill case is also marked ``slow``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import REPO, one_thread_env

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.errors import CorruptStateError, DapbenchError, WriteError
from benchmark.io import atomic_write_bytes, atomic_write_json

pytestmark = pytest.mark.faults
NUMBERS = ("run_id", "matrices", "summary", "lm_loss", "representation", "majority_class")
"""What a resumed or rebuilt record must share with an undisturbed run's (timing and invocations differ)."""


def _numbers(record: dict) -> dict:
    return {key: record[key] for key in NUMBERS}


# ----------------------------------------------------------------------------------------------
# kill -9 at random points
# ----------------------------------------------------------------------------------------------
def _command(world_root: Path, model: Path, out: Path) -> list[str]:
    args = [sys.executable, "-m", "benchmark.cli", "run", "--profile", "synthetic", "--model", str(model)]
    args += ["--data-root", str(world_root), "--general-heldout", str(world_root / "general_heldout.txt")]
    args += ["--sequence", "alpha,beta", "--methods", "das", "--seeds", "1", "--output-dir", str(out), "--quiet"]
    for setting in ("dap.steps=6", "finetune.default_epochs=1", "finetune.max_train_examples=24"):
        args += ["--set", setting]
    return args


def _run_to_end(args: list[str]) -> float:
    started = time.time()
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, env=one_thread_env(), timeout=600)
    assert done.returncode == 0, done.stderr
    return time.time() - started


def _kill_at_random_points(args: list[str], kills: int, duration: float, rng: random.Random) -> list[float]:
    """Start the command again and again, each time SIGKILL-ing it after a random delay; returns the delays
    at which a process was still running (a kill that came after the end is not counted)."""
    landed = []
    while len(landed) < kills:
        delay = rng.uniform(0.0, 0.9 * duration)
        process = subprocess.Popen(
            args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=one_thread_env()
        )
        try:
            process.wait(timeout=delay)
            return landed  # it finished first: nothing left to interrupt
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            landed.append(round(delay, 2))
    return landed


def _only_record(out: Path) -> dict:
    (record,) = (out / "results" / "synthetic").glob("*.json")
    return json.loads(record.read_text())


@pytest.mark.parametrize(
    "kills", [pytest.param(1, id="one-kill"), pytest.param(6, id="six-kills", marks=pytest.mark.slow)]
)
def test_kill_9_at_random_points_resumes_to_the_identical_record(kills, world_root, tiny_model, tmp_path):
    duration = _run_to_end(_command(world_root, tiny_model, tmp_path / "undisturbed"))
    reference = _only_record(tmp_path / "undisturbed")
    seed = random.SystemRandom().randrange(1 << 30)  # new points each time; printed on failure to replay them
    args = _command(world_root, tiny_model, tmp_path / "killed")
    landed = _kill_at_random_points(args, kills, duration, random.Random(seed))
    _run_to_end(args)
    print(f"undisturbed run {duration:.1f} s; SIGKILL after {landed} s (seed {seed})")  # shown with -s
    resumed = _only_record(tmp_path / "killed")
    assert _numbers(resumed) == _numbers(reference), f"kill points {landed} s (seed {seed})"
    assert landed, f"no kill landed before the run ended (seed {seed})"
    leftovers = [p for p in (tmp_path / "killed").rglob("*") if ".tmp" in p.name]
    assert not leftovers, f"temporary files left after kills at {landed} s (seed {seed}): {leftovers}"


# ----------------------------------------------------------------------------------------------
# failing writes: the previous file stays intact
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "code", [errno.ENOSPC, errno.EACCES, errno.EDQUOT], ids=["disk-full", "no-permission", "quota"]
)
def test_a_failing_write_keeps_the_previous_file_and_names_the_problem(code, tmp_path, monkeypatch):
    target = tmp_path / "record.json"
    atomic_write_json(target, {"score": 1})

    def fail_half_way(fd):  # the data is partly on disk when the device refuses the rest
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fail_half_way)
    with pytest.raises(WriteError, match=f"cannot write {target}: {os.strerror(code)}; the previous version"):
        atomic_write_json(target, {"score": 2})
    assert json.loads(target.read_text()) == {"score": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_a_failing_binary_write_keeps_the_previous_file(tmp_path):
    target = tmp_path / "plot.png"
    atomic_write_bytes(target, lambda tmp: tmp.write_bytes(b"old"))

    def write_then_fail(tmp: Path) -> None:
        tmp.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(WriteError, match="No space left on device"):
        atomic_write_bytes(target, write_then_fail)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_a_temporary_file_of_a_killed_writer_is_removed_but_not_a_live_one(tmp_path):
    from benchmark import io

    host = io._host()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".r.json.{host}-{dead.stdout.strip()}.tmp.json"
    live = tmp_path / f".r.json.{host}-{os.getppid()}.tmp.json"
    other_host = tmp_path / ".r.json.elsewhere-1.tmp.json"
    for path in (stale, live, other_host):
        path.write_text("{")
    atomic_write_json(tmp_path / "r.json", {"a": 1})
    assert not stale.exists() and live.exists() and other_host.exists()


def test_a_disk_full_checkpoint_write_stops_the_run_and_a_rerun_resumes_to_the_same_record(
    tiny_config, tmp_path, monkeypatch
):
    data = prepare_data(tiny_config)
    reference = continual_run(tiny_config, data, "das", 3, show_progress=False).execute()
    config = dataclasses.replace(tiny_config, work_dir=str(tmp_path / "full-disk"))
    real_save, calls = torch.save, []

    def disk_full_on_the_second_checkpoint(obj, path, *args, **kwargs):
        calls.append(Path(path).name)
        if calls.count("method_state.pt") == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_on_the_second_checkpoint)
    with pytest.raises(WriteError, match="checkpoint-1: No space left on device"):
        continual_run(config, data, "das", 3, show_progress=False).execute()
    run_dir = next((tmp_path / "full-disk" / "runs").iterdir())
    assert (run_dir / "checkpoint-0").is_dir() and not list(run_dir.glob("checkpoint-1*"))
    monkeypatch.setattr(torch, "save", real_save)
    resumed = continual_run(config, data, "das", 3, show_progress=False).execute()
    assert _numbers(resumed) == _numbers(reference)


# ----------------------------------------------------------------------------------------------
# corrupt state: named error, or rebuilt to the same numbers
# ----------------------------------------------------------------------------------------------
def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0x01  # in the tensor data, past every header
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte], ids=["truncated", "one-bit-flipped"])
def test_a_corrupt_checkpoint_is_a_named_error_and_its_advice_recovers_the_record(damage, tiny_config):
    data = prepare_data(tiny_config)
    first = continual_run(tiny_config, data, "das", 3, show_progress=False).execute()
    run = continual_run(tiny_config, data, "das", 3, show_progress=False)
    checkpoint = run.layout.checkpoint(1)
    damage(checkpoint / "model.safetensors")
    (run.layout.root / "finetune" / "row1-task0.json").unlink()  # a resume that must read the checkpoint
    with pytest.raises(CorruptStateError, match="model.safetensors differ from its manifest") as caught:
        run.execute()
    assert f"delete the run directory {run.layout.root}" in caught.value.fix  # checkpoint-0 is gone: start over
    shutil.rmtree(run.layout.root)
    again = continual_run(tiny_config, data, "das", 3, show_progress=False).execute()
    assert _numbers(again) == _numbers(first)


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte], ids=["truncated", "one-bit-flipped"])
def test_a_corrupt_data_cache_entry_is_rebuilt_to_the_same_record(damage, tiny_config, tmp_path):
    data = prepare_data(tiny_config)
    first = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    cache = Path(tiny_config.work_dir) / "cache"
    damaged = sorted(cache.glob("alpha-train-*/*.arrow"))
    assert damaged, "no cache entry to damage"
    damage(damaged[0])
    fresh = dataclasses.replace(tiny_config, work_dir=str(tmp_path / "second"))
    (tmp_path / "second").mkdir()
    os.symlink(cache, tmp_path / "second" / "cache")  # a second run over the same cache
    with pytest.warns(UserWarning, match="cache entry .*alpha-train.* rebuilding it"):
        rebuilt = prepare_data(fresh)
    second = continual_run(fresh, rebuilt, "ncl", 3, show_progress=False).execute()
    assert _numbers(second) == _numbers(first)


def _nan_loss(path: Path) -> None:
    path.write_text(path.read_text().replace('"general": ', '"general": NaN, "was": ', 1))


def _edited_loss(path: Path) -> None:
    stored = json.loads(path.read_text())
    stored["content"]["lm_loss"]["alpha"] += 0.5  # a plausible, wrong number
    path.write_text(json.dumps(stored))


def _flipped_prediction(path: Path) -> None:
    stored = json.loads(path.read_text())
    stored["content"]["predictions"][0] = 1 - stored["content"]["predictions"][0]
    path.write_text(json.dumps(stored))


def _edited_score(path: Path) -> None:
    stored = json.loads(path.read_text())
    stored["content"]["acc"] = 1.0
    path.write_text(json.dumps(stored))


WORK_FILE_DAMAGE = [
    ("finetune/row1-task0.json", _truncate),
    ("domain-0.json", _truncate),
    ("base-mlm-loss.json", _truncate),
    ("base-mlm-loss.json", _nan_loss),  # issue 47: a NaN in the base losses
    ("domain-0.json", _edited_loss),  # issue 47: an edited loss
    ("finetune/row1-task1.json", _flipped_prediction),  # issue 47: a flipped prediction
    ("finetune/row1-task1.json", _edited_score),  # issue 47: an edited score
]


@pytest.mark.parametrize(("name", "damage"), WORK_FILE_DAMAGE, ids=[f"{n}-{d.__name__}" for n, d in WORK_FILE_DAMAGE])
def test_a_damaged_work_file_is_named_moved_aside_and_rebuilt_to_the_same_record(name, damage, tiny_config, capsys):
    data = prepare_data(tiny_config)
    first = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    root = continual_run(tiny_config, data, "ncl", 3, show_progress=False).layout.root
    damage(root / name)
    damaged = (root / name).read_bytes()
    again = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    assert _numbers(again) == _numbers(first)
    assert f"{name.split('/')[-1]}.corrupt and rebuilt" in capsys.readouterr().err
    assert (root / f"{name}.corrupt").read_bytes() == damaged  # kept for whoever wants to look, not deleted


@pytest.mark.parametrize(
    ("name", "message"),
    [("base-features.npz", "base feature file .* is corrupt"), ("elapsed.json", "is corrupt")],
)
def test_a_corrupt_work_file_is_a_named_error_and_deleting_it_recovers_the_record(name, message, tiny_config):
    data = prepare_data(tiny_config)
    first = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    run = continual_run(tiny_config, data, "ncl", 3, show_progress=False)
    _truncate(run.layout.root / name)
    (run.layout.root / "finetune" / "row1-task1.json").unlink()  # leave work to do, so the run resumes
    with pytest.raises(DapbenchError, match=message) as caught:
        continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    assert caught.value.fix
    (run.layout.root / name).unlink()
    again = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    assert _numbers(again) == _numbers(first)


def test_a_lost_cell_whose_checkpoint_was_deleted_names_how_to_redo_it(tiny_config):
    data = prepare_data(tiny_config)
    first = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    run = continual_run(tiny_config, data, "ncl", 3, show_progress=False)
    (run.layout.root / "finetune" / "row0-task0.json").unlink()  # checkpoint-0 went when domain 1 finished
    with pytest.raises(CorruptStateError, match="checkpoint after domain 0 .* is missing") as caught:
        run.execute()
    assert str(run.layout.domain_done(0)) in caught.value.fix
    run.layout.domain_done(0).unlink()  # what the advice says: domain 0 is retrained, domain 1 kept
    again = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    assert _numbers(again) == _numbers(first)


def _build_slowly(final: str, log: str) -> str:
    """A cached input's builder that takes a while and notes every call (runs in a separate process)."""
    from benchmark.io import atomic_directory, built_once

    def build() -> None:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        atomic_directory(final, lambda tmp: (tmp / "weights").write_text("complete"))

    return (built_once(final, build) / "weights").read_text()


def test_concurrent_runs_sharing_a_work_folder_build_a_cached_input_once(tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    final, log = tmp_path / "bases" / "general-causal", tmp_path / "calls.txt"
    with ProcessPoolExecutor(3) as pool:
        results = list(pool.map(_build_slowly, [str(final)] * 3, [str(log)] * 3))
    assert results == ["complete"] * 3  # every caller sees the finished folder
    assert len(log.read_text().split()) == 1  # one build: the others waited on the lock and found it there
