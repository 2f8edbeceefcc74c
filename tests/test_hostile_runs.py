"""The hostile sweep's cases of issue #47 that involve a run, a report or a record: each is a named error before any
work (exit 2), or, for legitimate input, correct behaviour; nothing is written outside the output and work folders,
and no record is written that fails the checks every reader applies."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from cli_helpers import (
    REPO,
    TrainingStarted,
    copy_record,
    foreign_folder,
    is_untouched,
    no_record,
    quick_run_args,
    whole_record,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmark.api import continual_run
from benchmark.cli import main
from benchmark.data.inputs import prepare_data
from benchmark.engine.hooks import PluginError, checked_loss_terms, checked_report
from benchmark.engine.workfiles import read_work_file, write_work_file
from benchmark.errors import DapbenchError
from benchmark.method import ContinualMethod
from benchmark.records.store import load_record, write_record
from benchmark.registry import default_registry

# ----------------------------------------------------------------------------------------------
# Data written outside the output folder: symbolic links inside it are refused before any work
# ----------------------------------------------------------------------------------------------
LINKED = [("results/report/runs", []), ("results/report/plots", []), (".dapbench", [])]
LINKED += [("tracking", ["--report-to", "tensorboard"])]


@pytest.mark.parametrize(("linked", "flags"), LINKED, ids=[name for name, _ in LINKED])
def test_a_run_refuses_a_folder_of_its_output_linked_elsewhere(
    linked, flags, world_root, tiny_model, tmp_path, capsys, started
):
    if "tensorboard" in flags and not (find_spec("tensorboard") or find_spec("tensorboardX")):
        pytest.skip("tensorboard is not installed")
    out, elsewhere = tmp_path / "out", foreign_folder(tmp_path)
    (out / linked).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, out / linked)
    assert main(quick_run_args(world_root, tiny_model, out, *flags)) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert is_untouched(elsewhere)
    no_record(out)


@pytest.mark.parametrize("linked", ["runs", "plots"])
def test_the_report_refuses_its_pages_or_plots_folder_linked_elsewhere(linked, tmp_path, capsys):
    out, elsewhere = tmp_path / "out", foreign_folder(tmp_path)
    _copy_records(out, "ci", 2)
    (out / "results" / "report").mkdir()
    os.symlink(elsewhere, out / "results" / "report" / linked)
    assert main(["report", "--output-dir", str(out), "--quiet"]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert is_untouched(elsewhere) and not (out / "leaderboard.md").exists()


def test_a_tracking_path_that_is_a_file_is_refused_before_work(world_root, tiny_model, tmp_path, capsys, started):
    if not (find_spec("tensorboard") or find_spec("tensorboardX")):
        pytest.skip("tensorboard is not installed")
    out = tmp_path / "out"
    out.mkdir()
    (out / "tracking").write_text("a user's notes\n")
    assert main(quick_run_args(world_root, tiny_model, out, "--report-to", "tensorboard")) == 2
    assert "tracking is a file" in capsys.readouterr().err
    assert (out / "tracking").read_text() == "a user's notes\n"


def test_a_tracker_that_is_not_installed_is_refused_before_work(world_root, tiny_model, tmp_path, capsys, started):
    if find_spec("wandb"):
        pytest.skip("wandb is installed here")
    assert main(quick_run_args(world_root, tiny_model, tmp_path / "out", "--report-to", "wandb")) == 2
    err = capsys.readouterr().err
    assert "the package 'wandb' is not installed" in err and "pip install wandb" in err


# ----------------------------------------------------------------------------------------------
# Write failures are named write errors
# ----------------------------------------------------------------------------------------------
def test_a_report_into_a_read_only_output_is_a_named_write_error(tmp_path, capsys, monkeypatch):
    import benchmark.io as io

    out = tmp_path / "out"
    _copy_records(out, "ci", 2)

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(io.os, "replace", refused)  # what a read-only folder does to the move into place ...
    monkeypatch.setattr(Path, "unlink", refused)  # ... and to removing the temporary file afterwards
    assert main(["report", "--output-dir", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and "Permission denied" in err


DISK_FULL = """
import resource, signal, sys, torch
from safetensors.torch import save_file
from benchmark.errors import WriteError
from benchmark.io import atomic_write_bytes
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
writers = {"safetensors": lambda tmp: save_file({"w": torch.zeros(100_000)}, str(tmp)),
           "torch.save": lambda tmp: torch.save({"w": torch.zeros(100_000)}, tmp)}
try:
    atomic_write_bytes(sys.argv[1], writers[sys.argv[2]])
except WriteError as exc:
    print("named:", exc.problem)
"""


@pytest.mark.parametrize("writer", ["safetensors", "torch.save"])
def test_a_checkpoint_file_that_does_not_fit_is_a_named_write_error_and_keeps_the_old_file(writer, tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_text("the previous checkpoint\n")
    done = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(target), writer], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.stdout.startswith(f"named: cannot write {target}"), done.stdout + done.stderr
    assert target.read_text() == "the previous checkpoint\n"
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temporary file left


# ----------------------------------------------------------------------------------------------
# Plugin failures are named: the method, the hook, the domain and step, what came back
# ----------------------------------------------------------------------------------------------
class RaisingLoss(ContinualMethod):
    """A plugin whose loss term raises."""

    name: ClassVar[str] = "raising_loss"

    def training_loss(self, batch, outputs, ctx):
        raise ValueError("my bug")


class VectorLoss(ContinualMethod):
    """A plugin whose loss term is not a scalar."""

    name: ClassVar[str] = "vector_loss"

    def training_loss(self, batch, outputs, ctx):
        return {"spread": outputs.loss * torch.ones(3)}


class NaNReport(ContinualMethod):
    """A plugin whose domain report holds NaN and infinity."""

    name: ClassVar[str] = "nan_report"

    def domain_report(self):
        return {"importance": math.nan, "ratio": math.inf}


class UnsafeState(ContinualMethod):
    """A plugin whose state holds an object a safe checkpoint cannot read back."""

    name: ClassVar[str] = "unsafe_state"

    def state_dict(self):
        return {"buffer": [torch.zeros(2)], "sampler": random.Random(0)}


PLUGINS = [
    ("raising_loss", "hook training_loss, step 0: raised ValueError: my bug"),
    ("vector_loss", "hook training_loss, step 0: loss term 'spread' is a shape (3,)"),
    ("nan_report", "hook domain_report: returned {'importance': nan, 'ratio': inf}"),
    ("unsafe_state", "hook state_dict: state_dict()['sampler'] is a random.Random"),
]


@pytest.mark.parametrize(("name", "said"), PLUGINS, ids=[n for n, _ in PLUGINS])
def test_a_plugins_failure_names_the_method_the_hook_and_where_and_nothing_is_written(name, said, tiny_config):
    registry = default_registry()
    classes = {"raising_loss": RaisingLoss, "vector_loss": VectorLoss, "nan_report": NaNReport}
    classes["unsafe_state"] = UnsafeState
    registry.register(name, f"test_hostile_runs:{classes[name].__name__}")
    try:
        run = continual_run(tiny_config, prepare_data(tiny_config), name, 3, show_progress=False)
        with pytest.raises(PluginError) as caught:
            run.execute()
    finally:
        default_registry.cache_clear()
    assert caught.value.problem.startswith(f"{name} seed 3, domain 0 (alpha): method {name!r}, {said}")
    assert "docs/plugins.md" in caught.value.fix
    assert not run.layout.domain_done(0).exists() and not run.layout.checkpoint(0).exists()


# ----------------------------------------------------------------------------------------------
# Records: the checks every reader applies, applied before every write
# ----------------------------------------------------------------------------------------------
def _copy_records(out: Path, profile: str, n: int) -> list[Path]:
    """``n`` committed key-number records copied into ``out/results/<profile>/`` (a user's folder: no marker)."""
    folder = out / "results" / profile
    folder.mkdir(parents=True)
    return [copy_record(p, folder) for p in sorted((REPO / "results" / profile).glob("*.json"))[:n]]


EDITS = [
    (lambda r: r.update(method_label="ewc"), "its method_label 'ewc' is not 'das'"),
    (lambda r: r["environment"].update(torch_threads=-5), "environment.torch_threads -5 is not a whole number >= 1"),
    (lambda r: r.update(trainable_parameters="lots"), "trainable_parameters: input should be a valid integer"),
]


@pytest.mark.parametrize(("edit", "named"), EDITS, ids=["method_label", "torch_threads", "trainable_parameters"])
def test_an_edited_record_field_is_named_when_read_and_never_written(edit, named, tmp_path):
    path = _copy_records(tmp_path, "ci", 1)[0]
    record = whole_record(path)
    edit(record)
    path.write_text(json.dumps(record))
    with pytest.raises(DapbenchError, match=named):
        load_record(path)
    fresh = tmp_path / "fresh" / path.name
    with pytest.raises(DapbenchError, match=named):
        write_record(fresh, record)
    assert not fresh.parent.exists() or not list(fresh.parent.iterdir())


def test_a_record_with_a_non_finite_number_is_never_written(tmp_path):
    record = whole_record(_copy_records(tmp_path, "ci", 1)[0])
    record["lm_loss"]["base"]["general"] = math.nan
    fresh = tmp_path / "fresh" / f"{record['run_id']}.json"
    with pytest.raises(DapbenchError, match="lm_loss.base.general is nan"):
        write_record(fresh, record)
    assert not fresh.exists()


# ----------------------------------------------------------------------------------------------
# Silent wrong results: settings under which a measurement means nothing are refused before work
# ----------------------------------------------------------------------------------------------
MEANINGLESS = [
    (["--set", "finetune.epoch_scale=0.0001"], "under one pass its score measures the untrained head"),
    (["--set", "dap.mlm_probability=0.000001"], "a measurement needs at least 2 chunks and 10 scored tokens"),
    (["--set", "dap.seq_len=2"], "a measurement needs at least 2 chunks and 10 scored tokens"),
    (["--one-chunk"], "held-out set general: 1 chunk(s) of dap.seq_len="),
    (["--sequence", "alpha", "--set", "replay.past=0.25"], "there is no past to replay"),
]


@pytest.mark.parametrize(
    ("flags", "named"), MEANINGLESS, ids=["epoch_scale", "mlm_probability", "seq_len", "one_chunk", "past_without_past"]
)
def test_a_setting_whose_measurement_means_nothing_is_refused_before_work(
    flags, named, world_root, tiny_model, tmp_path, capsys, started
):
    if flags == ["--one-chunk"]:  # a general held-out text of one chunk (the sweep: seq_len 510, fraction 0.001)
        world = Path(shutil.copytree(world_root, tmp_path / "world"))
        words = (world / "general_heldout.txt").read_text().split()[:40]
        (world / "general_heldout.txt").write_text(" ".join(words) + "\n")
        world_root, flags = world, []
    args = quick_run_args(world_root, tiny_model, tmp_path / "out")
    if flags and flags[0] == "--sequence":
        args[args.index("--sequence") + 1] = flags[1]
        flags = flags[2:]
    try:
        code = main([*args, *flags])
    except TrainingStarted:
        pytest.fail(f"{flags} was accepted and training started")
    assert code == 2
    assert named in capsys.readouterr().err
    no_record(tmp_path / "out")


# ----------------------------------------------------------------------------------------------
# Low: what reaches a terminal, what a file's mode says
# ----------------------------------------------------------------------------------------------
class EscapingDoc(ContinualMethod):
    """A plugin \x1b[31mwhose docstring\x1b[0m paints the terminal\x07."""

    name: ClassVar[str] = "escaping_doc"


def test_dapbench_list_prints_no_control_bytes_of_a_plugins_docstring(capsys):
    default_registry().register("escaping_doc", "test_hostile_runs:EscapingDoc")
    try:
        assert main(["list"]) == 0
    finally:
        default_registry.cache_clear()
    said = capsys.readouterr().out
    assert "escaping_doc" in said and "whose docstring" in said
    assert not any(ch in said for ch in "\x1b\x07")


# ----------------------------------------------------------------------------------------------
# Property-based: these shapes of input, at random
# ----------------------------------------------------------------------------------------------
_leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.just(object())
_values = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


A_PLUGIN = SimpleNamespace(name="myplugin")
"""What the hook checks read of a method: its name (and its class's module)."""


@given(report=_values)
def test_a_domain_report_is_either_recordable_or_a_named_plugin_error(report):
    try:
        kept = checked_report(A_PLUGIN, report)
    except PluginError as exc:
        assert "hook domain_report" in exc.problem
        return
    assert isinstance(kept, dict)
    json.dumps(kept, allow_nan=False)  # what a record can hold


@given(shapes=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=1, max_size=3))
def test_loss_terms_are_accepted_exactly_when_every_one_is_a_scalar(shapes):
    terms = {f"t{i}": torch.zeros(shape) for i, shape in enumerate(shapes)}
    scalar = all(torch.zeros(shape).numel() == 1 for shape in shapes)
    try:
        checked_loss_terms(A_PLUGIN, terms)
    except PluginError as exc:
        assert not scalar and "must be a scalar tensor" in exc.problem
        return
    assert scalar


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(0, 1, exclude_max=True), replacement=st.characters(codec="ascii"))
def test_a_work_file_edited_anywhere_is_refused_or_reads_the_same(position, replacement, tmp_path):
    content = {"lm_loss": {"alpha": 3.25, "general": 4.5}, "predictions": [0, 1, 1], "acc": 0.5}
    path = tmp_path / "domain-0.json"
    write_work_file(path, content)
    text = path.read_text()
    at = int(position * len(text))
    path.write_text(text[:at] + replacement + text[at + 1 :])
    try:
        read = read_work_file(path, "domain progress file")
    except DapbenchError:  # a corrupt-state or unreadable-file error, by name
        return
    assert read == content  # an edit that changed nothing the run trusts (white space, a key's order)
