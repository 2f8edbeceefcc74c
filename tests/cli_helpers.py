"""The ``dapbench run`` command line the end-to-end tests build: the synthetic world's domains alpha and beta."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
"""The start of a two-process command on this machine (gloo on CPU); the script or ``-m module`` and its arguments
follow."""


def one_thread_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child process at one thread, with ``extra`` on top: a one-thread run's float
    sums come in the same order whatever runs beside it, and two such children fill the machine's two cores."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


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


def run_side_by_side(*commands: list[str], timeout: float = 900) -> list[subprocess.CompletedProcess]:
    """Run ``commands`` at once from the repository root, each process at one thread (a one-thread run's numbers do
    not depend on what runs beside it), and return each one's result, in order: a single-process run and a
    two-process one together fill the machine's two cores instead of leaving one idle."""
    env = one_thread_env()
    started = [
        subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for command in commands
    ]
    try:
        outputs = [process.communicate(timeout=timeout) for process in started]
    finally:
        for process in started:
            process.kill()  # only one that a timeout left running
    return [
        subprocess.CompletedProcess(process.args, process.returncode, out, err)
        for process, (out, err) in zip(started, outputs, strict=True)
    ]


def copy_record(path: Path, folder: Path) -> Path:
    """Copy the record file ``path`` into ``folder`` with the sidecars it names (its samples and its group's)."""
    import json
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    pointer = json.loads(path.read_text()).get("samples") or {}
    for name in (pointer.get("file"), pointer.get("shared_file")):
        if name:
            shutil.copy(path.parent / name, folder / name)
    return Path(shutil.copy(path, folder / path.name))


def whole_record(path: Path) -> dict:
    """The record file ``path`` as one dictionary, samples joined in from its sidecars, with no check applied: what a
    test edits and writes back whole (a record in one JSON file is read as it is)."""
    import json

    from benchmark.records.store import with_samples

    return with_samples(json.loads(path.read_text()), path)


def record_with_options(path: Path, folder: Path, **options: object) -> Path:
    """The record file ``path`` rewritten whole into ``folder`` as if its method had run with ``options`` on top of its
    own: label, identity and run id re-derived, so it passes every check a reader applies (the numbers stay the
    original's). What a hostile option value, from a plugin's string option, would put before a reader."""
    import json

    from benchmark.records.identity import canonical_recipe, record_identity, row_label

    record = whole_record(path)
    record["identity"]["method_options"] = {**record["identity"]["method_options"], **options}
    record["method_label"] = row_label(
        record["method"], record["identity"]["method_options"], canonical_recipe(record["config"])
    )
    record["run_id"] = record_identity(record).run_id(record["seed"], record["config"].get("sequence", ""))
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{record['run_id']}.json"
    out.write_text(json.dumps(record))
    return out


def foreign_folder(tmp_path: Path) -> Path:
    """A folder outside the output, holding a file that must survive untouched (what a link points a writer at)."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "keep.txt").write_text("someone else's\n")
    return folder


def is_untouched(folder: Path) -> bool:
    """Whether :func:`foreign_folder`'s folder holds its one file, as it was."""
    return sorted(p.name for p in folder.iterdir()) == ["keep.txt"] and (folder / "keep.txt").read_text() == (
        "someone else's\n"
    )
