"""Sharded training (dap.sharding=fsdp, torch FSDP2 over gloo on CPU): two processes holding half of every
parameter, gradient and optimizer state compute the record one unsharded process computes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_helpers import TORCHRUN, run_side_by_side, synthetic_run

from benchmark.records.reproduce import Tolerance, compare_records
from benchmark.registry import default_registry

SHARDED = ("ncl", "ewc", "das", "hat")
"""The naive baseline, a method with a per-parameter hook (EWC's penalty on the shards each process holds) and two
per-unit methods (DAS: importance on the whole model, soft masks on each process's shard of the gradients; HAT:
task embeddings outside the blocks, gradient blocking on each shard)."""
TOLERANCE = Tolerance(score=0.0, loss=1e-5, drift=1e-5, report=1e-5)
"""Sharded against unsharded: reduce-scatter sums in another order than one process accumulating, so held-out
losses and logs within one rounding unit of the record (1e-5), end-task scores identical."""


def _args(world_root: Path, model: Path, out: Path, *extra: str) -> list[str]:
    settings = ("dap.steps=4", "dap.per_device_batch_size=16", "finetune.default_epochs=1", *extra)
    return ["-m", "benchmark.cli", *synthetic_run(world_root, model, out, ",".join(SHARDED), *settings)]


@pytest.mark.parametrize("model", ["tiny_model", "tiny_llama"])
def test_two_sharded_processes_give_the_unsharded_record(model, world_root, tmp_path, request):
    path = request.getfixturevalue(model)
    sharded, single = run_side_by_side(
        [*TORCHRUN, *_args(world_root, path, tmp_path / "sharded", "dap.sharding=fsdp")],
        [sys.executable, *_args(world_root, path, tmp_path / "single")],
    )
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert single.returncode == 0, single.stderr[-3000:]
    for method in SHARDED:
        (a,) = (tmp_path / "single" / "results" / "synthetic").glob(f"{method}-*.json")
        (b,) = (tmp_path / "sharded" / "results" / "synthetic").glob(f"{method}-*.json")
        assert a.name == b.name  # sharding changes how, not what: one run id
        one, two = json.loads(a.read_text()), json.loads(b.read_text())
        assert two["environment"]["num_processes"] == 2
        assert not compare_records(one, two, TOLERANCE), method


def test_methods_whose_hooks_need_whole_parameters_are_refused_by_name(world_root, tiny_model, tmp_path, capsys):
    from benchmark.cli import main

    refused = sorted(n for n in default_registry().names() if default_registry().get(n).fsdp_refusal)
    assert {"kd", "derpp"} <= set(refused) and not set(SHARDED) & set(refused)
    args = _args(world_root, tiny_model, tmp_path, "dap.sharding=fsdp")[2:]
    args[args.index("--methods") + 1] = "ncl,kd"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "method 'kd' cannot train with dap.sharding=fsdp: its teacher is a whole copy of the model" in err
    assert not (tmp_path / "results").exists()
