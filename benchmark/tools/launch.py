"""Fan a method x seed x sequence grid out: N runs at a time on this machine, or one Slurm job per run.

Each run of the grid gets its resolved configuration as a file (``RunConfig.to_dict``, one method and one seed:
the one serialisable config between processes) and runs it through the library's single-run entry point
(``dapbench run --config FILE`` locally, ``benchmark.api.run_config_file`` in a Slurm job), so a run launched
here computes exactly what its planned run id names, resumes the same way, and takes its run directory's lock
(``benchmark.engine.layout.run_lock``). Runs whose record exists are not launched. Records land in one results
folder; the leaderboard is written once, after the grid (or by ``dapbench report``).

Local runs are separate processes scheduled by a thread pool (each thread waits on one child); with GPUs,
each run sees one (``CUDA_VISIBLE_DEVICES``), assigned round-robin over the free ones. Slurm jobs go through
``submitit`` (a maintained launcher; its ``local`` and ``debug`` executors run the same path without a cluster).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from benchmark.config import RunConfig
from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_json, path_inside
from benchmark.threads import threads_per_run

Echo = Callable[[str], None]


@dataclass(frozen=True)
class GridRun:
    """One run of a grid: a method, a seed and a domain sequence, and where its record goes."""

    method: str
    seed: int
    sequence: str
    run_id: str
    record: Path

    @property
    def name(self) -> str:
        """How messages name the run."""
        return f"{self.method} seed {self.seed} {self.sequence}"


@dataclass(frozen=True)
class SlurmOptions:
    """What one Slurm job of a grid asks for (``--slurm-*`` on the command line)."""

    partition: str | None = None
    time_min: int = 24 * 60
    gpus: int = 1
    cpus: int = 8
    mem_gb: int | None = None
    executor: str = "slurm"
    """``slurm``, or submitit's ``local`` / ``debug`` executor (same path, no cluster: for tests and trials)."""

    def __post_init__(self):
        bounds = {"time_min": (self.time_min, 1), "gpus": (self.gpus, 0), "cpus": (self.cpus, 1)}
        bounds["mem_gb"] = (self.mem_gb, 1)
        for name, (value, low) in bounds.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                flag = "--slurm-" + {"time_min": "time", "mem_gb": "mem"}.get(name, name)
                raise DapbenchError(f"{flag} {value!r} must be a whole number >= {low}", f"pass {flag} >= {low}")


def expand_sequences(text: str | None) -> list[str | None]:
    """``seq0..seq4`` -> ``[seq0, ..., seq4]``; ``seq0+seq3`` -> ``[seq0, seq3]``; anything else is one sequence."""
    if text is None:
        return [None]
    match = re.fullmatch(r"seq(\d+)\.\.seq(\d+)", text.strip())
    if match:
        first, last = int(match[1]), int(match[2])
        if first > last:
            raise DapbenchError(f"empty sequence range {text!r}", f"write seq{last}..seq{first}")
        return [f"seq{i}" for i in range(first, last + 1)]
    return [part.strip() for part in text.split("+") if part.strip()]


def planned_run_ids(config: RunConfig) -> dict[tuple[str, int], str]:
    """The run id of every method x seed of ``config`` (which reads and checksums its inputs): the names its
    records will have under ``results/<profile>/`` and its work directories under ``<work_dir>/runs/``."""
    from benchmark.data.inputs import prepare_data
    from benchmark.data.synthetic import materialise
    from benchmark.records.identity import run_identity
    from benchmark.registry import default_registry

    config = materialise(config)
    data = prepare_data(config)
    registry = default_registry()
    identities = {m: run_identity(config, registry.get(m), data.domains, data.checksums) for m in config.methods}
    return {(m, s): identities[m].run_id(s, config.sequence) for m in config.methods for s in config.seeds}


def plan_grid(configs: Sequence[RunConfig]) -> list[GridRun]:
    """Every method x seed of each config (one config per sequence), with its run id and record path."""
    runs = []
    for config in configs:
        for (method, seed), run_id in planned_run_ids(config).items():
            record = path_inside(config.output_dir, "results", config.profile, f"{run_id}.json")
            runs.append(GridRun(method, seed, config.sequence, run_id, record))
    return runs


def write_child_config(config: RunConfig, run: GridRun, folder: Path) -> Path:
    """The resolved configuration of one grid run (its method and seed, absolute folders) as a JSON file under
    ``folder``: what the run's process reads instead of a command line that could drop a field."""
    child = dataclasses.replace(
        config,
        methods=(run.method,),
        seeds=(run.seed,),
        output_dir=str(Path(config.output_dir).resolve()),
        work_dir=str(Path(config.work_dir).resolve()),
    )
    path = folder / f"{run.run_id}.json"
    atomic_write_json(path, child.to_dict())
    return path


def child_command(config_file: Path) -> list[str]:
    """The ``dapbench`` arguments that run one grid run's configuration file, without a leaderboard."""
    return ["run", "--config", str(config_file), "--quiet", "--no-leaderboard"]


def launch_local(commands: dict[GridRun, list[str]], processes: int, logs: Path, echo: Echo) -> list[GridRun]:
    """Run every command, ``processes`` at a time, each in its own Python process with its own log file; with
    GPUs, each on one GPU. Returns the runs that failed (their logs say why)."""
    gpus = _visible_gpus()
    free: queue.Queue[str | None] = queue.Queue()
    for slot in range(processes):
        free.put(gpus[slot % len(gpus)] if gpus else None)

    # Runs share the cores: N runs of all cores each would oversubscribe them (unless the user chose).
    threads = threads_per_run(processes)

    def launch(run: GridRun) -> bool:
        gpu = free.get()
        try:
            return _run_child(commands[run], logs / f"{run.run_id}.log", gpu, threads, echo, run)
        finally:
            free.put(gpu)

    logs.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=processes) as pool:
        outcomes = dict(zip(commands, pool.map(launch, commands), strict=True))
    return [run for run, ok in outcomes.items() if not ok]


def _run_child(argv: list[str], log: Path, gpu: str | None, threads: str, echo: Echo, run: GridRun) -> bool:
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    echo(f"{run.name}: started" + (f" on GPU {gpu}" if gpu is not None else "") + f" (log {log})")
    with open(log, "w", encoding="utf-8") as out:
        code = subprocess.call([sys.executable, "-m", "benchmark.cli", *argv], stdout=out, stderr=out, env=env)
    echo(f"{run.name}: " + ("finished" if code == 0 else f"failed with exit code {code}, see {log}"))
    return code == 0


def _visible_gpus() -> list[str]:
    """The GPU ids this process may hand out (``CUDA_VISIBLE_DEVICES`` when set, else every GPU torch sees)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def check_slurm(options: SlurmOptions) -> None:
    """Before anything is written: ``--launcher slurm`` needs submitit and, for its ``slurm`` executor, a Slurm
    here (``sbatch`` on the PATH); submitit would otherwise run the jobs as detached local processes, unasked."""
    import shutil

    try:
        import submitit  # noqa: F401
    except ImportError as exc:
        raise DapbenchError("--launcher slurm needs submitit", "pip install 'dapbench[cluster]'") from exc
    if options.executor == "slurm" and shutil.which("sbatch") is None:
        raise DapbenchError(
            "--launcher slurm: no Slurm on this machine (sbatch is not on the PATH), so no job could be submitted",
            "run it on a Slurm login node, or use --launcher local:N here",
        )


def submit_slurm(
    config_files: dict[GridRun, Path], options: SlurmOptions, folder: Path, job: Callable[[str], object]
) -> dict[GridRun, object]:
    """Submit one job per run through submitit (one job array); each job calls ``job`` (the library's single-run
    entry point, ``benchmark.api.run_config_file``) on its configuration file (:func:`check_slurm` first). Returns
    the jobs."""
    import submitit  # present: the launcher ran check_slurm before anything was written

    executor = submitit.AutoExecutor(folder=folder, cluster=options.executor)
    parameters = {"timeout_min": options.time_min, "gpus_per_node": options.gpus, "cpus_per_task": options.cpus}
    parameters |= {"name": "dapbench", "slurm_partition": options.partition, "mem_gb": options.mem_gb}
    executor.update_parameters(**{k: v for k, v in parameters.items() if v is not None})
    runs = list(config_files)
    with executor.batch():  # one job array: a single submission for the whole grid
        jobs = [executor.submit(job, str(config_files[run])) for run in runs]
    return dict(zip(runs, jobs, strict=True))
