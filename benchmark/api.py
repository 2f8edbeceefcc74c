"""The library entry point: everything the ``dapbench`` command does, as calls a notebook or another tool can use.

>>> from benchmark.api import resolve_config, run_benchmark, leaderboard_table
>>> config = resolve_config("synthetic", methods=["ncl", "one"], output_dir="out")
>>> records = run_benchmark(config)           # list of RunRecord (typed dicts, benchmark.records)
>>> leaderboard_table("out/results")          # one pandas row per record

The CLI (``benchmark.cli``) only parses arguments into these calls and prints what they return.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmark.config import RunConfig, apply_overrides, profile_config
from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_json, path_inside, safe_name
from benchmark.launch import GridRun, SlurmOptions
from benchmark.records import RunRecord, load_record, load_records

Echo = Callable[[str], None]


def _silent(line: str) -> None:
    """The default ``echo`` of library calls: say nothing."""


def quiet_libraries() -> None:
    """Hide load reports and per-file progress bars of transformers/datasets (not dapbench's own progress)."""
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------
def resolve_config(
    profile: str = "synthetic", *, overrides: Sequence[str] = (), work_dir: str | None = None, **fields
) -> RunConfig:
    """Profile defaults <- ``fields`` (``methods``, ``seeds``, ``model``, ``data_root``, ``sequence``, ``matrix``,
    ``output_dir``, ``device``, ...; None means "the profile's") <- ``section.key=value`` overrides, checked
    (:func:`validate_config`) before anything runs."""
    config = profile_config(profile)
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items() if v is not None}
    output_dir = given.get("output_dir", config.output_dir)
    config = dataclasses.replace(config, **given, work_dir=work_dir or str(Path(output_dir) / ".dapbench"))
    config = apply_overrides(config, list(overrides))
    validate_config(config)
    return config


def validate_config(config: RunConfig) -> None:
    """Every check that needs no data: methods, their options, the matrix mode, the DAP budget, seeds, names."""
    from benchmark.registry import default_registry

    registry = default_registry()
    for name in config.methods:
        registry.get(name)  # unknown names fail here, before any work
    for name, options in config.method_options.items():
        _validate_method_options(registry, name, options)
    if config.matrix not in ("full", "final"):
        raise DapbenchError(f"invalid matrix mode {config.matrix!r}", "use full or final")
    dap = config.dap
    if dap.steps < 1 or dap.per_device_batch_size < 1 or dap.batch_size % dap.per_device_batch_size:
        raise DapbenchError(
            f"invalid DAP budget: steps={dap.steps}, batch_size={dap.batch_size}, "
            f"per_device_batch_size={dap.per_device_batch_size}",
            "steps >= 1 and batch_size a multiple of per_device_batch_size",
        )
    if not config.seeds:
        raise DapbenchError("no seeds given", "pass --seeds 2021 (comma-separated)")
    safe_name(config.profile, "profile")  # it names the results folder
    safe_name(config.sequence.replace(",", "-").replace(" ", ""), "sequence")  # it is part of every run id


def _validate_method_options(registry, name: str, options) -> None:
    """``--set <method>.<option>=value``: the section must be a registered method and every option one of its
    config class's fields with a value of the field's type."""
    import difflib

    if name not in registry.names():
        sections = ["dap", "finetune", *registry.names()]
        close = difflib.get_close_matches(name, sections, n=2)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise DapbenchError(
            f"unknown config section {name!r} in --set {name}.…{hint}",
            f"a --set key starts with a top-level field, dap., finetune. or a method name: {', '.join(sections)}",
        )
    if not isinstance(options, dict):
        raise DapbenchError(f"--set {name}=… sets no option", f"write --set {name}.<option>=<value>")
    registry.get(name).config_cls.from_options(options, section=name)


def materialise(config: RunConfig, show_progress: bool = False, echo: Echo = _silent) -> RunConfig:
    """``config`` with its inputs in place: for the synthetic profile, the generated world and its tiny base
    model (built once, cached in the work folder); any other config as it is."""
    if config.profile != "synthetic" or config.model != "synthetic":
        return config
    from benchmark.synthetic import VERSION, build_world, pretrain_synthetic_base, write_world

    root = Path(config.work_dir) / f"synthetic-v{VERSION}"
    data_root, model_dir = root / "data", root / "base-model"
    if not data_root.exists():
        write_world(build_world(seed=0), data_root)
    if not model_dir.exists():
        echo("synthetic: pre-training the tiny base model on the general corpus (once)")
        pretrain_synthetic_base(data_root, model_dir, show_progress=show_progress)
    return dataclasses.replace(
        config,
        model=str(model_dir),
        data_root=str(data_root),
        general_heldout=str(data_root / "general_heldout.txt"),
        general_corpus=str(data_root / "general.txt"),
    )


def check_inputs(config: RunConfig) -> None:
    """What would otherwise fail after training: an unwritable output folder, a corrupt record already under
    ``results/`` (the leaderboard is rebuilt from all of them), a missing data root, a model directory that is
    missing or truncated."""
    import tempfile

    from benchmark.data import require_data_root
    from benchmark.modeling import check_model_files

    results = path_inside(config.output_dir, "results", config.profile)
    existing = next(p for p in (results, *results.parents) if p.exists())  # nothing is created here
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        raise DapbenchError(
            f"cannot write results under {results}: {exc.strerror}", "pass a writable --output-dir"
        ) from exc
    if results.parent.is_dir():
        load_records(results.parent)  # a corrupt record is named now, not after hours of training
    if config.data_root:
        require_data_root(config.data_root)
    for field in ("general_heldout", "general_corpus"):
        source = getattr(config, field)
        if source and not source.startswith("hub:") and not Path(source).is_file():
            raise DapbenchError(
                f"{field} {source!r} is not a file",
                f"pass an existing text file, one passage per line (--{field.replace('_', '-')} PATH"
                f" or --set {field}=PATH), or a hub:NAME dataset",
            )
    check_model_files(config.model)


# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------
def run_benchmark(
    config: RunConfig, *, show_progress: bool = False, write_leaderboard: bool = True, echo: Echo = _silent
) -> list[RunRecord]:
    """Run every method x seed of ``config`` (resuming finished work, keeping finished records), write one record
    per run under ``<output_dir>/results/<profile>/`` and, unless told not to, the leaderboard; return the
    records of this grid (a run that another process holds is skipped: that process writes its record).
    Like the CLI it hides transformers'/datasets' load reports and per-file bars (:func:`quiet_libraries`)."""
    from benchmark.environment import process_state
    from benchmark.inputs import prepare_data
    from benchmark.runner import ContinualRun

    quiet_libraries()
    processes = process_state(config)  # one, or those of `accelerate launch` / `torchrun`, who share every run
    require_multi_process(config, processes.num_processes)
    echo = echo if processes.is_main_process else _silent
    with processes.main_process_first():  # one process builds the synthetic world and the data caches
        config = materialise(config, show_progress, echo)
        check_inputs(config)
        data = prepare_data(config)
    records = []
    for method in config.methods:
        for seed in config.seeds:
            run = ContinualRun(config, data, method, seed, show_progress=show_progress)
            record = _run_once(
                run, path_inside(config.output_dir, "results", config.profile, f"{run.run_id}.json"), echo
            )
            if record is not None:
                records.append(record)
    if records and write_leaderboard and processes.is_main_process:
        report(config.output_dir)
    return records


def require_multi_process(config: RunConfig, num_processes: int) -> None:
    """Refuse, before any work, a multi-process run of a method not verified for it (``multi_process``)."""
    from benchmark.environment import require_multi_process_support, require_supported_engine
    from benchmark.registry import default_registry

    require_supported_engine()
    for method in config.methods:
        require_multi_process_support(default_registry().get(method), num_processes)
    dap = config.dap
    if dap.batch_size % (dap.per_device_batch_size * num_processes):
        fitting = dap.batch_size // num_processes
        raise DapbenchError(
            f"dap.batch_size={dap.batch_size} is not a multiple of dap.per_device_batch_size="
            f"{dap.per_device_batch_size} x {num_processes} processes: the global batch would not be the profile's",
            f"set --set dap.per_device_batch_size=N with N dividing {fitting}"
            if dap.batch_size % num_processes == 0
            else f"use a process count that divides dap.batch_size={dap.batch_size}",
        )


def launch_grid(
    configs: Sequence[RunConfig],
    launcher: str,
    *,
    overrides: Sequence[str] = (),
    slurm: SlurmOptions | None = None,
    wait: bool = True,
    echo: Echo = _silent,
) -> list[GridRun]:
    """Run the unfinished method x seed runs of ``configs`` (one per sequence) through ``launcher``: ``local:N``
    (N processes at a time, see :mod:`benchmark.launch`) or ``slurm`` (one submitit job each; ``wait`` blocks
    until they end). Finished runs are kept; the leaderboard is written once every launched run has ended.
    Returns the runs that failed. ``overrides`` are the ``--set`` strings each run is given."""
    from benchmark.launch import launch_local, plan_grid, run_command, submit_slurm

    kind, processes = _parse_launcher(launcher)
    configs = [materialise(config, echo=echo) for config in configs]
    check_inputs(configs[0])  # the configs differ only in their sequence; the inputs checked are shared
    by_sequence, todo = {config.sequence: config for config in configs}, {}
    for run in plan_grid(configs):
        if run.record.is_file():
            echo(f"{run.name}: complete, kept {run.record} (delete it to run again)")
        else:
            todo[run] = run_command(by_sequence[run.sequence], run, overrides)
    output_dir, work_dir = Path(configs[0].output_dir), Path(configs[0].work_dir)
    if kind == "local":
        failed = launch_local(todo, processes, work_dir / "grid-logs", echo) if todo else []
    else:
        jobs = submit_slurm(todo, slurm or SlurmOptions(), work_dir / "slurm") if todo else {}
        for run, job in jobs.items():
            echo(f"{run.name}: submitted as job {job.job_id}")
        if not wait:
            echo(f"when the jobs have ended: dapbench report --output-dir {output_dir}")
            return []
        failed = [run for run, job in jobs.items() if not _job_succeeded(job, run, echo)]
    report(output_dir)
    echo(f"leaderboard: {output_dir / 'leaderboard.md'}" + (f"; {len(failed)} run(s) failed" if failed else ""))
    return failed


def _parse_launcher(launcher: str) -> tuple[str, int]:
    """``local:N`` -> ("local", N); ``slurm`` -> ("slurm", 0); anything else is a named error."""
    kind, _, count = launcher.partition(":")
    if kind == "slurm" and not count:
        return kind, 0
    if kind == "local" and count.isdigit() and int(count) >= 1:
        return kind, int(count)
    raise DapbenchError(f"unknown launcher {launcher!r}", "use local:N (N >= 1 runs at a time) or slurm")


def _job_succeeded(job, run: GridRun, echo: Echo) -> bool:
    """Wait for a submitit job; report a failure with where its log is."""
    try:
        job.result()
    except Exception as exc:  # noqa: BLE001 - submitit re-raises the job's error, of any type
        echo(f"{run.name}: job {job.job_id} failed ({str(exc).strip().splitlines()[-1]}); log {job.paths.stderr}")
        return False
    echo(f"{run.name}: job {job.job_id} finished")
    return True


def planned_run_ids(config: RunConfig) -> dict[tuple[str, int], str]:
    """The run id of every method x seed of ``config`` (which reads and checksums its inputs): the names its
    records will have under ``results/<profile>/`` and its work directories under ``<work_dir>/runs/``."""
    from benchmark.identity import run_identity
    from benchmark.inputs import prepare_data
    from benchmark.registry import default_registry

    config = materialise(config)
    data = prepare_data(config)
    registry = default_registry()
    identities = {m: run_identity(config, registry.get(m), data.domains, data.checksums) for m in config.methods}
    return {(m, s): identities[m].run_id(s, config.sequence) for m in config.methods for s in config.seeds}


def _run_once(run, path: Path, echo: Echo) -> RunRecord | None:
    """The record of ``run``: kept if it exists, else made now; None if another command holds the run. With
    several processes, the main one takes the lock and decides for all, and only it writes the record."""
    from accelerate import PartialState

    from benchmark.layout import run_lock

    name, main = f"{run.method.name} seed {run.seed}", PartialState().is_main_process
    with run_lock(run.layout.root) if main else contextlib.nullcontext(True) as locked:
        decision = _main_decides("run" if locked and not path.is_file() else "kept" if locked else "held")
        if decision == "held":
            echo(f"{name}: in progress in another process, skipped (its record lands in {path})")
            return None
        if decision == "kept":  # a finished run is not redone, rewritten or counted again
            echo(f"{name}: complete, kept {path} (delete it to run again)")
            return load_record(path)
        record = run.execute()
        if main:
            atomic_write_json(path, record)
            echo(f"{name}: {one_line(record)} -> {path}")
        return record


def _main_decides(decision: str) -> str:
    """The main process's ``decision``, on every process of a multi-process run (itself when alone)."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    if PartialState().num_processes == 1:
        return decision
    return broadcast_object_list([decision], from_process=0)[0]


def one_line(record: RunRecord) -> str:
    """A record's headline numbers in one line."""
    s = record["summary"]
    parts = [f"final acc {100 * s['acc']['final']:.1f}", f"final MF1 {100 * s['macro_f1']['final']:.1f}"]
    if s["acc"]["forgetting"] is not None:
        parts.append(f"forgetting(acc) {100 * s['acc']['forgetting']:.1f}")
    return ", ".join(parts)


def run_study(config: RunConfig, method: str, study: str, options: Mapping[str, str] | None = None) -> dict:
    """A method's named measurement (``ContinualMethod.studies``), e.g. DAS's ``importance-stability``."""
    from benchmark.registry import default_registry

    cls = default_registry().get(method)
    if study not in cls.studies:
        raise DapbenchError(
            f"method {method!r} offers no study {study!r}",
            f"its studies: {', '.join(cls.studies) or '(none)'}; `dapbench list` shows every method's",
        )
    return cls.studies[study](materialise(config), dict(options or {}))


# ----------------------------------------------------------------------------------------------
# Reproduce
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reproduction:
    """The outcome of :func:`reproduce`: the new record, where it was written, and what differs."""

    record: RunRecord
    path: Path
    threads: int | None
    recorded_threads: int | None
    """The CPU thread count the reproduced record was made with (None for accelerator records)."""
    tolerance: object
    compared: int
    mismatches: list
    largest: dict[str, tuple[str, float]]

    @property
    def ok(self) -> bool:
        """Whether every number matched within the tolerance."""
        return not self.mismatches


def reproduce(
    record_path: str | Path,
    *,
    output_dir: str | Path | None = None,
    paths: Mapping[str, str | None] | None = None,
    overrides: Iterable[str] = (),
    threads: int | None = None,
    tolerance=None,
    show_progress: bool = False,
) -> Reproduction:
    """Re-run a record's method and seed from scratch (its recorded thread count by default: CPU float
    summation order depends on it) and compare every number it reports within ``tolerance``."""
    quiet_libraries()
    from benchmark.inputs import prepare_data
    from benchmark.reproduce import (
        DEFAULT_TOLERANCE,
        check_data,
        compare_records,
        cpu_threads,
        key_numbers,
        largest_differences,
        recorded_cpu_threads,
        reproduction_config,
    )
    from benchmark.runner import ContinualRun

    record = load_record(record_path)
    require_current_numerics(record, record_path)
    threads = threads if threads is not None else recorded_cpu_threads(record)  # float order depends on it
    if threads is not None and threads < 1:
        raise DapbenchError(f"--threads must be >= 1, got {threads}", "pass a positive thread count")
    out = Path(output_dir) if output_dir else Path("reproduce") / record["run_id"]
    config = apply_overrides(reproduction_config(record, out, dict(paths or {})), list(overrides))
    with cpu_threads(threads) if threads else contextlib.nullcontext():
        config = materialise(config)  # a synthetic base model is rebuilt with the record's thread count too
        data = prepare_data(config)
        check_data(record, data.checksums)
        run = ContinualRun(config, data, record["method"], record["seed"], show_progress=show_progress)
        new = run.execute()
    path = out / "results" / config.profile / f"{run.run_id}.json"
    atomic_write_json(path, new)
    tolerance = tolerance or DEFAULT_TOLERANCE
    compared = len(set(key_numbers(record)) | set(key_numbers(new)))
    mismatches = compare_records(record, new, tolerance)
    recorded = recorded_cpu_threads(record)
    return Reproduction(new, path, threads, recorded, tolerance, compared, mismatches, largest_differences(record, new))


def require_current_numerics(record: RunRecord, record_path: str | Path) -> None:
    """Refuse to reproduce a record whose numerics versions (core and method) this checkout does not compute:
    its numbers come from another training stream or method code, so every comparison would fail."""
    from benchmark.identity import RESULTS_VERSION
    from benchmark.registry import default_registry

    made = record.get("identity") or {}
    here = {"results_version": RESULTS_VERSION, "method_version": default_registry().get(record["method"]).version}
    differing = {k: (made.get(k, 1), v) for k, v in here.items() if made.get(k, 1) != v}
    if differing:
        said = ", ".join(f"{k} {was} (this checkout: {now})" for k, (was, now) in differing.items())
        commit = record["environment"].get("git_commit") or "the commit that made it"
        raise DapbenchError(
            f"{record_path} was computed by other numerics: {said}",
            f"check out {commit} (the record's environment.git_commit) and reproduce it there",
        )


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------
def report(output_dir: str | Path = ".") -> dict[str, int]:
    """Regenerate tables, plots and ``leaderboard.md`` under ``output_dir`` from ``output_dir/results``."""
    from benchmark.report import write_report

    return write_report(output_dir)


def migrate_results(results_dir: str | Path) -> list[Path]:
    """Rewrite every record under ``results_dir`` of an older schema as the current one, in place and atomically
    (numbers unchanged); return the rewritten files. Readers migrate on load anyway: this makes committed
    records match the schema on disk (and drops what schema 1 recorded about the machine's paths)."""
    from benchmark.io import read_json
    from benchmark.records import SCHEMA_VERSION, migrate_record, record_paths, validate_record

    rewritten = []
    for path in record_paths(results_dir):
        raw = read_json(path, "run record")
        record = validate_record(raw if not isinstance(raw, dict) else migrate_record(raw, str(path)), str(path))
        if raw.get("schema") != SCHEMA_VERSION:
            atomic_write_json(path, record)
            rewritten.append(path)
    return rewritten


def leaderboard_table(results_dir: str | Path):
    """One pandas row per record under ``results_dir``: its leaderboard group, method label, seed and every
    leaderboard column."""
    from benchmark.report import leaderboard_frame

    return leaderboard_frame(load_records(results_dir))


def synthetic_reading(records: Sequence[RunRecord]) -> str:
    """The questions the synthetic profile is built to answer, from its records: does DAP help (per-domain DAP
    against no DAP), and does naive continual DAP raise the general loss and forget."""

    def mean(pick: Callable[[RunRecord], bool], metric: str, key: str) -> float | None:
        values = [r["summary"][metric][key] for r in records if pick(r)]
        return None if not values or None in values else 100 * sum(values) / len(values)

    def per_domain(r: RunRecord) -> bool:
        return r["capabilities"]["independent_per_domain"] and r["capabilities"]["pretrains"]

    def no_dap(r: RunRecord) -> bool:
        return not r["capabilities"]["pretrains"]

    def naive(r: RunRecord) -> bool:
        return r["method"] == _role_method("naive_continual")

    lines = []
    dap, none = mean(per_domain, "acc", "final"), mean(no_dap, "acc", "final")
    if dap is not None and none is not None:
        verdict = "DAP helps" if dap > none else "DAP does not help"
        lines.append(
            f"synthetic: per-domain DAP {dap:.1f} vs no DAP {none:.1f} final acc -> {verdict} ({dap - none:+.1f})"
        )
    for record in [r for r in records if naive(r)][:1]:
        losses = record["mlm_loss"]
        if "general" in losses["columns"]:
            base, after = losses["base"]["general"], losses["after_domain"][-1]["general"]
            lines.append(
                f"synthetic: general held-out MLM loss {base:.2f} (base) -> {after:.2f} after naive continual DAP"
            )
    forgetting = mean(naive, "acc", "forgetting")
    if forgetting is not None:
        verdict = "it forgets" if forgetting > 0 else "it does not forget"
        lines.append(f"synthetic: naive continual DAP forgetting rate (acc) {forgetting:.1f} points -> {verdict}")
    return "\n".join(lines)


def _role_method(role: str) -> str | None:
    """The registered method that declares ``comparison_role == role``."""
    from benchmark.registry import default_registry

    registry = default_registry()
    return next((n for n in registry.names() if registry.get(n).comparison_role == role), None)
