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
