"""The ``dapbench run`` command line the end-to-end tests build: the synthetic world's domains alpha and beta."""

from __future__ import annotations

from pathlib import Path


def synthetic_run(
    world_root: Path, model: Path, out: Path, methods: str, *settings: str, seeds: str = "1"
) -> list[str]:
    """Arguments of ``dapbench run`` (after ``dapbench`` or ``python -m benchmark.cli``) of ``methods`` x ``seeds``
    over alpha, beta of the synthetic world at ``world_root`` with ``model``, records under ``out``, each of
    ``settings`` passed as ``--set``."""
    args = ["run", "--profile", "synthetic", "--model", str(model), "--data-root", str(world_root)]
    args += ["--general-heldout", str(world_root / "general_heldout.txt"), "--sequence", "alpha,beta"]
    args += ["--methods", methods, "--seeds", seeds, "--output-dir", str(out), "--quiet"]
    for setting in settings:
        args += ["--set", setting]
    return args


class TrainingStarted(Exception):
    """Raised by the ``started`` fixture's hook in place of the first DAP stage: the input was accepted."""


def quick_run_args(world: Path, model: Path, out: Path, *extra: str, methods: str = "ncl") -> list[str]:
    """A one-seed ``dapbench run`` over alpha, beta with a two-update budget (no leaderboard), then ``extra``."""
    args = ["run", "--profile", "synthetic", "--model", str(model), "--data-root", str(world)]
    args += ["--general-heldout", str(world / "general_heldout.txt"), "--sequence", "alpha,beta"]
    args += ["--methods", methods, "--seeds", "1", "--output-dir", str(out), "--quiet", "--no-leaderboard"]
    for setting in ("dap.steps=2", "dap.heldout_chunks=4", "finetune.max_train_examples=16"):
        args += ["--set", setting]
    return [*args, *extra]


def no_record(out: Path) -> None:
    """Fail if a run record was written under ``out``."""
    assert not list(out.glob("results/**/*.json")), "a record was written"
