"""Multi-process DAP training (issue #17): 2 gloo processes on CPU compute what one process computes.

The update equivalence runs every registered method (each declares ``ContinualMethod.multi_process``)
through ``tests/distributed_update.py`` with one process (gradient accumulation over two micro-batches) and
under ``torchrun`` with two (one micro-batch each), two updates per stage over two stages, with the runner's
own sampled stream, masks and dropout, and compares the checkpoints: model weights and method state
(importance, Fisher, masks, experts, replay buffers). A negative control without DDP shows that the
comparison notices unsynchronised processes. Whole runs are compared record to record.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import REPO, TORCHRUN, one_thread_env, run_side_by_side, synthetic_run
from safetensors.torch import load_file

from benchmark.records.reproduce import Tolerance
from benchmark.registry import default_registry

HARNESS = REPO / "tests" / "distributed_update.py"
TOLERANCE = 1e-6
"""Largest accepted |difference| of a weight or state value after two stages of two updates. Summation order
(gradient accumulation in one process, an all-reduce across two) is the only thing that differs between the
two layouts. Measured: 0 (bit-identical weights) for every method on CPU, dropout included."""

VERIFIED = sorted(n for n in default_registry().names() if default_registry().get(n).multi_process)
REFUSED = sorted(n for n in default_registry().names() if not default_registry().get(n).multi_process)


def _torchrun(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [*TORCHRUN, *args]
    environment = one_thread_env(**(env or {}))
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environment, timeout=900)


@pytest.fixture(scope="module")
def layouts(tiny_model, world_root, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layouts")
    args = [str(tiny_model), str(world_root), *VERIFIED]  # with dropout: it is drawn per micro-batch too
    one, two = run_side_by_side(
        [sys.executable, str(HARNESS), str(root / "one"), *args], [*TORCHRUN, str(HARNESS), str(root / "two"), *args]
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    return {"one": root / "one", "two": root / "two"}


def _flat(value, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    return {k: v for key, item in items for k, v in _flat(item, f"{prefix}/{key}").items()}


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max([(a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].numel()] or [0.0])


def test_every_registered_method_is_verified_for_several_processes():
    assert set(VERIFIED) == set(default_registry().names()) and not REFUSED


def test_a_plugin_that_does_not_declare_multi_process_support_is_refused_by_name():
    from benchmark.engine.environment import require_multi_process_support
    from benchmark.errors import DapbenchError
    from methods.ncl import NCL

    class Undeclared(NCL):
        name = "undeclared"
        multi_process = False

    require_multi_process_support(Undeclared, 1)
    with pytest.raises(DapbenchError, match="method 'undeclared' is not verified for multi-process training"):
        require_multi_process_support(Undeclared, 2)


@pytest.mark.parametrize("method", VERIFIED)
def test_two_processes_update_like_one_with_the_same_global_batch(method, layouts):
    checkpoints = sorted(p.name for p in (layouts["one"] / method).glob("checkpoint-*"))
    assert checkpoints
    for name in checkpoints:
        one, two = layouts["one"] / method / name, layouts["two"] / method / name
        weights = _largest_difference(load_file(one / "model.safetensors"), load_file(two / "model.safetensors"))
        state = _largest_difference(
            _flat(torch.load(one / "method_state.pt", weights_only=True)),
            _flat(torch.load(two / "method_state.pt", weights_only=True)),
        )
        assert weights <= TOLERANCE and state <= TOLERANCE, f"{method} {name}: weights {weights}, state {state}"
    digests = sorted((layouts["two"] / "digests").glob(f"{method}-stage*-rank*.digest"))
    by_stage = {}
    for path in digests:
        by_stage.setdefault(path.name.rsplit("-rank", 1)[0], set()).add(path.read_text())
    assert by_stage and all(len(d) == 1 for d in by_stage.values()), f"{method}: the processes differ"


def test_without_ddp_the_comparison_notices_unsynchronised_processes(tiny_model, world_root, tmp_path):
    args = [str(HARNESS), str(tmp_path), str(tiny_model), str(world_root), "ncl"]
    done = _torchrun(*args, env={"DAPBENCH_TEST_WITHOUT_DDP": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = ((tmp_path / "digests" / f"ncl-stage0-rank{r}.digest").read_text() for r in (0, 1))
    assert rank0 != rank1


def _run_args(world_root: Path, model: Path, out: Path, methods: str) -> list[str]:
    settings = ("dap.steps=4", "dap.per_device_batch_size=16", "finetune.default_epochs=1")
    return ["-m", "benchmark.cli", *synthetic_run(world_root, model, out, methods, *settings)]


RECORD_METHODS = ("ncl", "das", "derpp")
"""Whole runs compared record to record: the naive baseline, the method with importance and a contrastive term,
and the one with a replay buffer."""

RECORD_TOLERANCE = Tolerance(score=0.0, loss=1e-5)
"""Two processes against one, whole synthetic runs: held-out losses within one unit of the record's rounding
(1e-5 nats), end-task scores identical. Measured: 0 difference in every held-out loss, drift figure and score of
NCL, DAS and DER++; loss logs within 1e-5 (one rounding unit)."""


def _numbers(path: Path) -> dict:
    record = json.loads(path.read_text())
    return {k: record[k] for k in ("run_id", "matrices", "lm_loss", "summary")}


@pytest.fixture(scope="module")
def record_runs(world_root, tiny_model, tmp_path_factory) -> dict[str, Path]:
    """The output folders of a one-process (``one``) and a two-process (``two``) run of :data:`RECORD_METHODS`, made
    side by side: the record test compares them, and the stopped-run test resumes to ``two``'s NCL record."""
    root, methods = tmp_path_factory.mktemp("record-runs"), ",".join(RECORD_METHODS)
    one, two = run_side_by_side(
        [sys.executable, *_run_args(world_root, tiny_model, root / "one", methods)],
        [*TORCHRUN, *_run_args(world_root, tiny_model, root / "two", methods)],
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("ncl seed 1: plasticity") == 1  # the main process speaks for both
    return {"one": root / "one", "two": root / "two"}


def test_a_two_process_run_gives_the_one_process_record_under_the_same_id(world_root, tiny_model, record_runs):
    from benchmark.records.reproduce import compare_records

    for method in RECORD_METHODS:
        (single,) = (record_runs["one"] / "results" / "synthetic").glob(f"{method}-*.json")
        (double,) = (record_runs["two"] / "results" / "synthetic").glob(f"{method}-*.json")
        assert single.name == double.name  # one run id: the layout does not change what is computed
        a, b = json.loads(single.read_text()), json.loads(double.read_text())
        assert (a["environment"]["num_processes"], b["environment"]["num_processes"]) == (1, 2)
        assert not compare_records(a, b, RECORD_TOLERANCE), method
    again = _torchrun(*_run_args(world_root, tiny_model, record_runs["two"], ",".join(RECORD_METHODS)))
    assert again.returncode == 0 and "ncl seed 1: complete, kept" in again.stdout


def test_a_global_batch_that_the_processes_cannot_share_evenly_is_refused(tiny_config):
    import dataclasses

    from benchmark.api import require_multi_process
    from benchmark.errors import DapbenchError

    config = dataclasses.replace(tiny_config, methods=("ncl",), dap=dataclasses.replace(tiny_config.dap, batch_size=8))
    require_multi_process(config, 2)  # 8 = 4 per process x 2 processes
    with pytest.raises(DapbenchError, match="not a multiple of dap.per_device_batch_size=4 x 4 processes") as caught:
        require_multi_process(config, 4)
    assert "per_device_batch_size=N with N dividing 2" in caught.value.fix


def test_fine_tunes_spread_over_processes_give_the_matrix_one_process_gives(world_root, tiny_model, tmp_path):
    """Each process takes whole fine-tunes; re-fine-tuning the same checkpoints in one process gives every cell."""
    import shutil

    from benchmark.cli import main

    args = _run_args(world_root, tiny_model, tmp_path, "ncl") + ["--set", "keep_checkpoints=true"]
    done = _torchrun(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (tmp_path / "results" / "synthetic").glob("*.json")
    spread = json.loads(path.read_text())
    single = tmp_path / "single"
    single_args = [a if a != str(tmp_path) else str(single) for a in args[2:]]  # the same command, one process
    from benchmark.api import planned_run_ids, resolve_config

    config = resolve_config(
        "synthetic",
        model=str(tiny_model),
        data_root=str(world_root),
        sequence="alpha,beta",
        methods=["ncl"],
        seeds=[1],
        general_heldout=str(world_root / "general_heldout.txt"),
        output_dir=str(single),
        overrides=["dap.steps=4", "dap.per_device_batch_size=16", "finetune.default_epochs=1", "keep_checkpoints=true"],
    )
    work = tmp_path / ".dapbench" / "runs" / spread["run_id"]
    copy = single / ".dapbench" / "runs" / planned_run_ids(config)[("ncl", 1)]
    shutil.copytree(work, copy)
    shutil.rmtree(copy / "finetune")  # DAP is kept; every fine-tune is redone by one process
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # resumed at the thread count each torchrun process ran at
    try:
        assert main(single_args) == 0
    finally:
        torch.set_num_threads(threads)
    (again,) = (single / "results" / "synthetic").glob("*.json")
    assert json.loads(again.read_text())["matrices"] == spread["matrices"]


@pytest.mark.parametrize(
    ("switch", "engine"), [("ACCELERATE_USE_FSDP", "accelerate's FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")]
)
def test_a_parameter_sharding_engine_is_refused_by_name_before_any_work(
    switch, engine, world_root, tiny_model, tmp_path
):
    done = _torchrun(*_run_args(world_root, tiny_model, tmp_path, "ncl"), env={switch: "true"})
    assert done.returncode != 0
    assert f"{engine} is not how dapbench shards a run" in done.stderr and "dap.sharding=fsdp" in done.stderr
    assert not (tmp_path / ".dapbench" / "runs").exists()


def test_a_two_process_run_stopped_by_sigterm_resumes_to_the_uninterrupted_record(
    world_root, tiny_model, tmp_path, record_runs
):
    import signal
    import time

    def numbers(out: Path) -> dict:
        (path,) = (out / "results" / "synthetic").glob("ncl-*.json")
        return _numbers(path)

    args = _run_args(world_root, tiny_model, tmp_path / "stopped", "ncl")
    env = one_thread_env()
    process = subprocess.Popen(
        [*TORCHRUN, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 300
    while time.time() < deadline and not list(tmp_path.glob("stopped/.dapbench/runs/*/domain-0.json")):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)  # what a scheduler sends; torchrun passes it to both processes
    process.communicate(timeout=300)
    assert not list(tmp_path.glob("stopped/results/synthetic/*.json")), "the run ended before it was stopped"
    resumed = _torchrun(*args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert numbers(tmp_path / "stopped") == numbers(record_runs["two"])  # NCL's record, run beside DAS and DER++


def test_all_gathered_contrastive_negatives_are_the_loss_over_every_process_views(tmp_path):
    result = _torchrun(str(REPO / "tests" / "contrast_negatives.py"), str(tmp_path / "loss"))
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"loss-{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        # every process computes the loss of all 16 anchors against all 16 positives and o_prev views...
        assert rank["all_processes"] == pytest.approx(rank["union"], abs=1e-6)
        assert rank["all_processes"] != pytest.approx(rank["micro"], abs=1e-3)  # ...not its own 8 (the default)
        assert rank["local_grad"]  # its own rows carry the gradient
    assert ranks[0]["all_processes"] == pytest.approx(ranks[1]["all_processes"], abs=1e-6)


def test_das_gathers_its_views_only_under_the_reference_scope(monkeypatch):
    from model_helpers import tiny_mlm, toy_batch

    import methods.das as das_module
    from benchmark.method import RunEnv, StepContext
    from methods.das import DAS, DASConfig

    calls = []
    monkeypatch.setattr(das_module, "gathered", lambda rows: calls.append(rows.shape) or rows)
    model = tiny_mlm()
    for options, gathers in (({}, False), ({"contrast_negatives": "all_processes"}, True)):
        calls.clear()
        das = DAS(DASConfig.from_options({**options, "ablation": "no_softmask"}), env=RunEnv(2, ("a", "b"), 0))
        ctx = StepContext(model, 0, 0, 1, 0, None)
        das.training_loss(toy_batch(), None, ctx)
        assert bool(calls) == gathers


def test_a_two_process_run_with_replay_gives_the_one_process_record(world_root, tiny_model, tmp_path):
    """Replay draws come from each micro-batch's own seed, so the process count changes no replayed chunk."""
    from benchmark.records.reproduce import compare_records

    recipe = [f"general_corpus={world_root / 'general.txt'}", "replay.general=0.25", "replay.past=0.25"]
    extra = [arg for setting in recipe for arg in ("--set", setting)]
    two, one = run_side_by_side(
        [*TORCHRUN, *_run_args(world_root, tiny_model, tmp_path / "two", "ncl"), *extra],
        [sys.executable, *_run_args(world_root, tiny_model, tmp_path / "one", "ncl"), *extra],
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert one.returncode == 0, one.stderr[-3000:]
    (single,) = (tmp_path / "one" / "results" / "synthetic").glob("ncl-*.json")
    (double,) = (tmp_path / "two" / "results" / "synthetic").glob("ncl-*.json")
    a, b = json.loads(single.read_text()), json.loads(double.read_text())
    assert single.name == double.name and a["method_label"] == "ncl[replay.general=0.25,replay.past=0.25]"
    assert not compare_records(a, b, RECORD_TOLERANCE)
