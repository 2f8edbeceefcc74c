"""The library entry point: every ``dapbench`` command is one call here (the CLI only parses arguments into them).

>>> from benchmark.api import resolve_config, run_benchmark, leaderboard_table
>>> config = resolve_config("synthetic", methods=["ncl", "one"], output_dir="out")
>>> records = run_benchmark(config)           # list of RunRecord (typed dicts, benchmark.records.schema)
>>> leaderboard_table("out/results")          # one pandas row per record
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from benchmark.config import DEFAULT_OUTPUT, RunConfig, apply_overrides, profile_config
from benchmark.errors import DapbenchError, did_you_mean
from benchmark.io import path_inside, read_json, safe_name
from benchmark.labels import is_row_label, label_method, option_pairs
from benchmark.preflight import check_inputs, require_multi_process
from benchmark.records.reproduce import Reproduction, StagesReproduction
from benchmark.records.schema import RunRecord
from benchmark.records.store import load_record, load_records, write_record
from benchmark.threads import MAX_THREADS
from benchmark.tools.launch import GridRun, SlurmOptions

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
    (:func:`validate_config`) before anything runs. Method names may be written in any case."""
    config = profile_config(profile)
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items() if v is not None}
    output_dir = given.get("output_dir", config.output_dir)
    config = dataclasses.replace(config, **given, work_dir=work_dir or str(Path(output_dir) / ".dapbench"))
    config = apply_overrides(config, list(overrides))
    config = dataclasses.replace(config, methods=_method_names(config.methods))
    validate_config(config)
    return config


def _method_names(names: Sequence[str]) -> tuple[str, ...]:
    """The registered spelling of every name, ``all`` standing for every registered method."""
    from benchmark.registry import default_registry

    if [n.lower() for n in names] == ["all"]:
        return tuple(default_registry().names())
    return tuple(_method_name(name) for name in names)


def _method_name(name: str) -> str:
    from benchmark.registry import default_registry

    if is_row_label(name):
        _refuse_row_label(name)
    return default_registry().canonical_name(name)


def _refuse_row_label(label: str) -> None:
    """A leaderboard row label (``ewc[strength=500.0]``, ``ncl[replay.general=0.25]``) given as a method: refused
    with the command that runs that row (a method option is ``--set METHOD.KEY``, a recipe option its own key)."""
    base = label_method(label)
    sets = " ".join(f"--set {key if '.' in key else f'{base}.{key}'}={value}" for key, value in option_pairs(label))
    raise DapbenchError(
        f"--methods takes method names; {label!r} is a leaderboard row label (method {base!r} with options)",
        f"run that row with --methods {base} {sets}",
    )


def _method_class(name: str):
    from benchmark.registry import default_registry

    return default_registry().get(name)


def continual_run(config: RunConfig, data, method: str, seed: int, show_progress: bool = True, position=None):
    """The :class:`~benchmark.engine.runner.ContinualRun` of the registered method ``method`` (any spelling the
    registry accepts) with ``seed`` over ``data``: where a method name becomes its class."""
    from benchmark.engine.runner import ContinualRun

    return ContinualRun(config, data, _method_class(method), seed, show_progress, position)


def validate_config(config: RunConfig) -> None:
    """Every check that needs no data: methods, their options, end-task protocol, DAP budget, seeds, path names."""
    from benchmark.protocols import protocols_of
    from benchmark.registry import default_registry

    protocols = protocols_of(config.finetune)  # registered ones, named before any work
    if config.finetune.seeds > 1 and not any(protocol.trains for protocol in protocols):
        raise DapbenchError(
            f"finetune.seeds={config.finetune.seeds} repeats fine-tunes, but no end-task protocol of this run trains"
            f" ({', '.join(p.name for p in protocols)}: scored alike every time)",
            "set finetune.protocol=finetune or finetune.beside=finetune, or leave finetune.seeds at 1",
        )
    registry = default_registry()
    for name in config.methods:
        registry.get(name)  # unknown names fail here, before any work
    for name, options in config.method_options.items():
        _validate_method_options(registry, name, options)
    dap = config.dap
    if dap.batch_size % dap.per_device_batch_size:
        raise DapbenchError(
            f"dap.batch_size={dap.batch_size} is not a multiple of"
            f" dap.per_device_batch_size={dap.per_device_batch_size}",
            "set dap.per_device_batch_size to a divisor of dap.batch_size",
        )
    if not config.seeds:
        raise DapbenchError("no seeds given", "pass --seeds 2021 (comma-separated)")
    safe_name(config.profile, "profile")  # it names the results folder
    safe_name(config.sequence.replace(",", "-").replace(" ", ""), "sequence")  # it is part of every run id


def _validate_method_options(registry, name: str, options) -> None:
    """``--set <method>.<option>=value``: the section must be a registered method and every option one of its
    config class's fields with a value of the field's type and range."""
    if name not in registry.names():
        sections = ["dap", "finetune", "replay", "schedule", *registry.names()]
        hint = did_you_mean(name, sections, n=2, form=" ({})")
        raise DapbenchError(
            f"unknown config section {name!r} in --set {name}.…{hint}",
            "a --set key starts with a top-level field, dap., finetune., replay., schedule. or a method name: "
            + ", ".join(sections),
        )
    if not isinstance(options, dict):
        raise DapbenchError(f"--set {name}=… sets no option", f"write --set {name}.<option>=<value>")
    registry.get(name).config_cls.from_options(options, section=name)


def materialise(config: RunConfig, show_progress: bool = False, echo: Echo = _silent) -> RunConfig:
    """``config`` with its inputs in place (the synthetic world and base model, built once; others as they are)."""
    from benchmark.data.synthetic import materialise as build

    return build(config, show_progress, echo)


# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------
def run_benchmark(
    config: RunConfig, *, show_progress: bool = False, write_leaderboard: bool = True, echo: Echo = _silent
) -> list[RunRecord]:
    """Run every method x seed of ``config`` (resuming finished work, keeping finished records), write one record
    per run under ``<output_dir>/results/<profile>/`` and, unless told not to, the leaderboard; return the
    records of this grid (a run that another process holds is skipped: that process writes its record)."""
    from benchmark.engine.environment import process_state
    from benchmark.engine.progress import MIN_TIMED_SECONDS, RunPosition
    from benchmark.engine.runner import ContinualRun, run_once
    from benchmark.report.summary import one_line

    quiet_libraries()
    processes = process_state(config)  # one, or those of `accelerate launch` / `torchrun`, who share every run
    require_multi_process(config, processes.num_processes)
    echo = echo if processes.is_main_process else _silent
    with processes.main_process_first():  # one process builds the synthetic world and the data caches
        config = materialise(config, show_progress, echo)
        (data,) = check_inputs([config])
    records, grid = [], [(method, seed) for method in config.methods for seed in config.seeds]
    earlier, timed = 0.0, 0
    for index, (method, seed) in enumerate(grid, 1):
        position = RunPosition(index, len(grid), earlier, timed)
        run = ContinualRun(config, data, _method_class(method), seed, show_progress, position)
        path = path_inside(config.output_dir, "results", config.profile, f"{run.run_id}.json")
        start = time.monotonic()
        record = run_once(run, path, echo, describe=one_line)
        if record is not None:
            records.append(record)
        if (seconds := time.monotonic() - start) >= MIN_TIMED_SECONDS:  # a run found finished says nothing ahead
            earlier, timed = earlier + seconds, timed + 1
    if records and write_leaderboard and processes.is_main_process:
        report(config.output_dir)
    return records


def run_config_file(path: str | Path) -> list[RunRecord]:
    """Run the configuration a grid launcher wrote (``RunConfig.to_dict`` as JSON) without a leaderboard: the
    single-run entry point of local grid processes and Slurm jobs."""
    config = RunConfig.from_dict(read_json(path, "run configuration"))
    validate_config(config)
    return run_benchmark(config, write_leaderboard=False)


def launch_grid(
    configs: Sequence[RunConfig],
    launcher: str,
    *,
    slurm: SlurmOptions | None = None,
    wait: bool = True,
    echo: Echo = _silent,
) -> list[GridRun]:
    """Run the unfinished method x seed runs of ``configs`` (one per sequence) through ``launcher``: ``local:N``
    (N processes at a time) or ``slurm`` (one submitit job each; ``wait`` blocks until they end). Each run gets
    its resolved configuration as a file. Finished runs are kept; the leaderboard is written once every launched
    run has ended. Returns the runs that failed."""
    from benchmark.tools.launch import (
        check_slurm,
        child_command,
        launch_local,
        plan_grid,
        submit_slurm,
        write_child_config,
    )

    kind, processes = _parse_launcher(launcher)
    if kind == "slurm":
        check_slurm(slurm or SlurmOptions())
    configs = [materialise(config, echo=echo) for config in configs]
    check_inputs(configs)
    by_sequence, todo = {config.sequence: config for config in configs}, {}
    work_dir = Path(configs[0].work_dir)
    for run in plan_grid(configs):
        if run.record.is_file():
            echo(f"{run.name}: complete, kept {run.record} (delete it to run again)")
        else:
            todo[run] = write_child_config(by_sequence[run.sequence], run, work_dir / "grid-configs")
    output_dir = Path(configs[0].output_dir)
    if kind == "local":
        commands = {run: child_command(path) for run, path in todo.items()}
        failed = launch_local(commands, processes, work_dir / "grid-logs", echo) if todo else []
    else:
        jobs = submit_slurm(todo, slurm or SlurmOptions(), work_dir / "slurm", run_config_file) if todo else {}
        for run, job in jobs.items():
            echo(f"{run.name}: submitted as job {job.job_id}")
        if not wait:
            echo(f"when the jobs have ended: dapbench report --output-dir {output_dir}")
            return []
        failed = [run for run, job in jobs.items() if not _job_succeeded(job, run, echo)]
    if len(failed) < len(todo) or not todo:
        report(output_dir)
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
    """The run id of every method x seed of ``config`` (which reads and checksums its inputs)."""
    from benchmark.tools.launch import planned_run_ids as planned

    return planned(config)


def run_study(config: RunConfig, method: str, study: str, options: Mapping[str, str] | None = None) -> dict:
    """A method's named measurement (``ContinualMethod.studies``), e.g. DAS's ``importance-stability``."""
    from benchmark.registry import default_registry

    cls = default_registry().get(_method_name(method))
    if study not in cls.studies:
        raise DapbenchError(
            f"method {cls.name!r} offers no study {study!r}",
            f"its studies: {', '.join(cls.studies) or '(none)'}; `dapbench list` shows every method's",
        )
    return cls.studies[study](materialise(config), dict(options or {}))


def bench(
    config: RunConfig,
    steps: int,
    trace_dir: str | Path | None = None,
    show_progress: bool = False,
    warmup: int = 0,
    finetune: bool = False,
) -> dict:
    """Each method's DAP update (``finetune``: the fine-tuning update) against the hardware (``tools.bench``),
    ``steps`` timed updates per method after ``warmup`` untimed ones (0: the stage's whole time)."""
    from benchmark.tools.bench import bench as measure

    if warmup < 0 or steps < 1:
        raise DapbenchError(
            f"bench needs steps >= 1 and warmup >= 0, got {steps} and {warmup}", "e.g. --steps 8 --warmup 2"
        )
    quiet_libraries()
    config = materialise(config, show_progress)
    check_inputs([config])
    trace = Path(trace_dir) if trace_dir else None
    return measure(config, list(config.methods), steps, trace_dir=trace, warmup=warmup, finetune=finetune)


def pretrain_base(corpus: str | Path, out_dir: str | Path, spec=None) -> Path:
    """A small base masked LM (and its tokenizer) trained on ``corpus`` (``dapbench pretrain-base``)."""
    from benchmark.data.pretrain import BaseModelSpec
    from benchmark.data.pretrain import pretrain_base as train

    quiet_libraries()
    return train(str(corpus), out_dir, spec or BaseModelSpec())


def learning_rates(record: Mapping) -> list[float]:
    """The DAP learning rate of every update of a recorded run, as its configuration and method schedule it
    (:func:`benchmark.engine.recipe.recorded_learning_rates`)."""
    from benchmark.engine.recipe import recorded_learning_rates

    return recorded_learning_rates(record)


def plot_learning_rates(record_paths: Sequence[str | Path], output: str | Path) -> Path:
    """Draw :func:`learning_rates` of each record (one line per record, labelled by its row) into ``output``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmark.io import atomic_write_bytes
    from benchmark.records.store import load_record

    output = Path(output)
    if output.suffix.lower() != ".png" or any(output.resolve() == Path(p).resolve() for p in record_paths):
        raise DapbenchError(
            f"--output {output} is not a new PNG file (it would overwrite a record, or hold a PNG under another name)",
            "pass --output with a .png name that is none of the records, e.g. --output lr-curve.png",
        )
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for path in record_paths:
        record = load_record(Path(path))
        ax.plot(range(1, len(rates := learning_rates(record)) + 1), rates, label=record["method_label"])
    ax.set_xlabel("update (whole sequence)")
    ax.set_ylabel("learning rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write_bytes(Path(output), lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)
    return Path(output)


def describe(data_root: str | None = None) -> dict:
    """What ``dapbench list`` shows: methods (first doc line, options with defaults, studies), the recipe options
    every pre-training method takes (replay, schedule), the task suite
    (domains, end tasks, sequences), the end-task protocols and the profiles."""
    from benchmark.config import PROFILES, RECIPE_SECTIONS, SECTION_TYPES
    from benchmark.data.suite import load_suite
    from benchmark.protocols import PROTOCOLS
    from benchmark.registry import default_registry

    registry, suite = default_registry(), load_suite(data_root)
    methods = {}
    for name in registry.names():
        try:
            cls = registry.get(name)
        except DapbenchError as exc:  # named in the listing with its fix; the other methods are listed as ever
            methods[name] = {"doc": f"cannot be loaded: {exc}", "options": {}, "choices": {}, "studies": []}
            continue
        options = {f.name: _shown(f) for f in dataclasses.fields(cls.config_cls)}
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        choices = _choices(cls.config_cls)
        methods[name] = {"doc": doc, "options": options, "choices": choices, "studies": list(cls.studies)}
    domains = {d.name: {"corpus": d.corpus, "end_task": d.end_task} for d in suite.domains.values()}
    tasks = {name: len(spec.labels) for name, spec in suite.end_tasks.items()}
    recipes = {
        section: {f.name: _shown(f) for f in dataclasses.fields(SECTION_TYPES[section])} for section in RECIPE_SECTIONS
    }
    return {
        "methods": methods,
        "recipes": recipes,
        "recipe_choices": {section: _choices(SECTION_TYPES[section]) for section in RECIPE_SECTIONS},
        "domains": domains,
        "end_tasks": tasks,
        "protocols": {name: (type(p).__doc__ or "").strip().splitlines()[0] for name, p in PROTOCOLS.items()},
        "sequences": suite.sequences,
        "profiles": list(PROFILES),
    }


def _choices(config_cls) -> dict[str, list]:
    """The options of ``config_cls`` that take one of named values, with those values."""
    from benchmark.settings import declaration

    declared = {f.name: declaration(f) for f in dataclasses.fields(config_cls)}
    return {name: list(d.choices) for name, d in declared.items() if d is not None and d.choices is not None}


def _shown(field: dataclasses.Field):
    from benchmark.method import default_of

    value = default_of(field)
    return list(value) if isinstance(value, tuple) else value


# ----------------------------------------------------------------------------------------------
# Tuning
# ----------------------------------------------------------------------------------------------
TUNING_CRITERION = (
    "lowest mean validation loss after the last domain, over every domain of the sequence and general text"
)
"""How ``dapbench tune`` chooses: one number per candidate, the mean of the final row of its validation-loss matrix
(every domain's slice and general text weigh alike: learning the new domains and keeping general knowledge both
count)."""


def tune_option(
    config: RunConfig, method: str, option: str, values: Sequence[float], seed: int, show_progress: bool = False
) -> dict:
    """``dapbench tune``: run ``method`` once per value of its ``option`` (``method.key``) on validation slices,
    choose by :data:`TUNING_CRITERION`, write and return the result.

    Each candidate value is one continual DAP run through the profile's sequence at the profile's budget, with
    ``dap.evaluate_on=validation``: the loss matrix is measured on a validation slice of every domain, as many lines
    as its held-out part and disjoint from it and from the training lines
    (:func:`benchmark.data.corpora.validation_split`), and on as many lines from the end of the general training
    corpus as the general held-out text has. End tasks are not run: the choice rests on the declared
    :data:`TUNING_CRITERION` alone, and the held-out sets and end tasks that rank methods play no part in it.
    Candidates are ordinary runs in the work folder (their own run ids: ``evaluate_on`` is part of the
    configuration), so an interrupted tuning resumes where it stopped.

    The result, every candidate's validation losses, the criterion and the choice, is written to
    ``<output-dir>/tuning/<profile>/<method>-<option>-seed<seed>.json``.
    """
    from benchmark.io import atomic_write_json

    if len(values) < 2 or len(set(values)) != len(values):
        raise DapbenchError(f"--values {list(values)}: a choice needs two or more different values", "e.g. 1e-4,1e-3")
    quiet_libraries()
    candidates = [_tuning_candidate(config, method, option, value, seed) for value in values]
    for candidate in candidates:  # every candidate's inputs checked before the first trains
        candidate.update(config=materialise(candidate["config"], show_progress))
        candidate.update(data=check_inputs([candidate["config"]])[0])
    rows = []
    for candidate in candidates:
        run = continual_run(candidate["config"], candidate["data"], method, seed, show_progress=show_progress)
        losses = run.pretrain_only()
        label = run.method.label()  # the row it names, with every option the candidate ran with
        rows.append({"value": candidate["value"], "label": label, "run_id": run.run_id, "losses": losses})
        rows[-1]["mean"] = _mean_loss(losses)
    result = {
        "method": method,
        "option": option,
        "profile": config.profile,
        "seed": seed,
        "sequence": config.sequence,
        "criterion": TUNING_CRITERION,
        "candidates": rows,
        "chosen": min(rows, key=lambda row: row["mean"])["value"],
    }
    name = f"{method}-{option.partition('.')[2]}-seed{seed}.json"
    atomic_write_json(path_inside(config.output_dir, "tuning", config.profile, name), result)
    return result


def _tuning_candidate(config: RunConfig, method: str, option: str, value: float, seed: int) -> dict:
    """The configuration of one candidate: ``option=value`` on validation slices, one method and seed."""
    section, _, key = option.partition(".")
    if section != method or not key:
        raise DapbenchError(
            f"--option {option!r} is not an option of method {method!r}",
            f"name one of its options as {method}.KEY (`dapbench list` shows them)",
        )
    if not (isinstance(value, int | float) and math.isfinite(value)):
        raise DapbenchError(f"--values: {value!r} is not a finite number", "e.g. --values 1e-4,3e-4,1e-3")
    tuned = apply_overrides(config, [f"{option}={value!r}", "dap.evaluate_on=validation"])
    tuned = dataclasses.replace(tuned, methods=(method,), seeds=(seed,))
    validate_config(tuned)  # the option exists and the value is in its declared range, before any work
    return {"value": value, "config": tuned}


def _mean_loss(losses: dict[str, float]) -> float:
    return sum(losses.values()) / len(losses)


# ----------------------------------------------------------------------------------------------
# Reproduce
# ----------------------------------------------------------------------------------------------
def reproduce(
    record_path: str | Path,
    *,
    output_dir: str | Path | None = None,
    paths: Mapping[str, str | None] | None = None,
    overrides: Iterable[str] = (),
    threads: int | None = None,
    tolerance=None,
    show_progress: bool = False,
    work_dir: str | Path | None = None,
) -> Reproduction:
    """Re-run a record's method and seed from scratch (its recorded thread count by default: CPU float
    summation order depends on it) and compare every number it reports within ``tolerance``. ``work_dir``: a work
    folder whose caches (prepared data, recipe-built base models) other runs share; one already holding this run is
    refused (:func:`_rerun`)."""
    from benchmark.engine.environment import cpu_kernels
    from benchmark.records import reproduce as rep

    record = load_record(record_path)
    rerun = _rerun(record, record_path, output_dir, paths, overrides, threads, show_progress, work_dir)
    with rerun as (run, out, threads):
        new = run.execute()
    path = out / "results" / record["profile"] / f"{run.run_id}.json"
    write_record(path, new)
    tolerance = tolerance or rep.DEFAULT_TOLERANCE
    compared = len(set(rep.key_numbers(record)) | set(rep.key_numbers(new)))
    mismatches = rep.compare_records(record, new, tolerance)
    recorded = rep.recorded_cpu_threads(record)
    largest = rep.largest_differences(record, new)
    kernels = rep.kernels_line(record, cpu_kernels())
    return rep.Reproduction(new, path, threads, recorded, tolerance, compared, mismatches, largest, kernels)


def reproduce_stages(
    record_path: str | Path,
    *,
    output_dir: str | Path | None = None,
    paths: Mapping[str, str | None] | None = None,
    overrides: Iterable[str] = (),
    threads: int | None = None,
    tolerance=None,
    show_progress: bool = False,
    own_domain_only: bool = False,
    work_dir: str | Path | None = None,
) -> StagesReproduction:
    """Re-run only a record's stages (its DAP and held-out evaluations, no end task) and compare every number they
    make; where every one matches and the record predates per-stage update sizes (issue #45), write the record
    with the re-run's sizes added (``update_sizes_measured`` says how) under ``output_dir``. The record's own file
    is never touched: copy the written one over it to keep the sizes. ``own_domain_only``: evaluate each stage on its
    own domain's held-out set alone and compare on what that makes
    (:func:`benchmark.records.reproduce.own_domain_view`): about a third of the time on the mini profile.
    ``work_dir`` as for :func:`reproduce`."""
    from benchmark.engine.environment import cpu_kernels, git_commit
    from benchmark.engine.stages import OWN_DOMAIN
    from benchmark.records import reproduce as rep

    record = load_record(record_path)
    rerun = _rerun(record, record_path, output_dir, paths, overrides, threads, show_progress, work_dir)
    with rerun as (run, out, threads):
        stages = run.pretrained_stages(own_domain_only)
    tolerance = tolerance or rep.DEFAULT_TOLERANCE
    compared, mismatches = rep.compare_stages(record, stages, tolerance, own_domain_only)
    largest = rep.largest_loss_difference(record, stages, own_domain_only)
    kernels = cpu_kernels()
    outcome = functools.partial(
        rep.StagesReproduction,
        threads=threads,
        tolerance=tolerance,
        compared=compared,
        mismatches=mismatches,
        largest_loss_difference=largest,
        kernels=rep.kernels_line(record, kernels),
    )
    if mismatches:
        return outcome(record, None)
    facts = {
        "git_commit": git_commit(),
        "torch_threads": threads,
        "cpu_kernels": kernels,
        "compared": compared,
        "largest_loss_difference": largest,
        **({"heldout_scope": OWN_DOMAIN} if own_domain_only else {}),
    }
    added = rep.with_measured_update_sizes(record, stages, facts)
    if added is record:
        return outcome(record, None)
    path = out / "results" / record["profile"] / f"{record['run_id']}.json"
    write_record(path, added)
    return outcome(added, path)


@contextlib.contextmanager
def _rerun(record, record_path, output_dir, paths, overrides, threads, show_progress, work_dir=None):
    """A fresh run of ``record``'s method and seed under ``output_dir`` (default ``dapbench-out/reproduce/<id>``),
    its data checked against the record's, inside the record's CPU thread count (or ``threads``): yields the run,
    its output folder and the thread count. A shared ``work_dir`` that already holds the run (the record's own run,
    or an earlier re-run) is refused before any work: resuming it would compare the record with itself."""
    from benchmark.data.inputs import prepare_data
    from benchmark.records import reproduce as rep

    quiet_libraries()
    require_current_numerics(record, record_path)
    threads = threads if threads is not None else rep.recorded_cpu_threads(record)  # float order depends on it
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise DapbenchError(
            f"--threads must be 1 to {MAX_THREADS}, got {threads} (given, or the record's environment.torch_threads)",
            "pass a thread count in that range",
        )
    out = Path(output_dir) if output_dir else Path(DEFAULT_OUTPUT) / "reproduce" / record["run_id"]
    config = apply_overrides(rep.reproduction_config(record, out, dict(paths or {}), work_dir), list(overrides))
    held = Path(config.work_dir) / "runs" / record["run_id"]
    if work_dir is not None and held.exists():
        raise DapbenchError(
            f"the work folder {work_dir} already holds run {record['run_id']} ({held}): a re-run from scratch needs"
            " a folder of its own",
            "pass another --work-dir, or none (the re-run then works under its --output-dir)",
        )
    with rep.cpu_threads(threads) if threads else contextlib.nullcontext():
        config = materialise(config)  # a synthetic base model is rebuilt with the record's thread count too
        data = prepare_data(config)
        rep.check_data(record, data.checksums)
        yield continual_run(config, data, record["method"], record["seed"], show_progress=show_progress), out, threads


def rescore(
    record_path: str | Path,
    *,
    overrides: Iterable[str],
    work_dir: str | Path,
    output_dir: str | Path = DEFAULT_OUTPUT,
    paths: Mapping[str, str | None] | None = None,
    show_progress: bool = False,
) -> tuple[RunRecord, Path]:
    """Score a finished run's kept checkpoints again under other end-task settings (issue #86): ``overrides`` change
    ``finetune.*`` only, the run under ``work_dir`` must have kept every stage's checkpoint (``keep_checkpoints``),
    and the new record (its own run id) carries the run's own DAP stages, linked into a run folder of its own, not
    re-run; its end tasks are scored afresh at the record's thread count. Returns the new record and its file."""
    from benchmark.data.inputs import prepare_data
    from benchmark.engine.layout import RunPaths, link_finished_stages
    from benchmark.preflight import check_run_data
    from benchmark.records import reproduce as rep

    quiet_libraries()
    record = load_record(record_path)
    require_current_numerics(record, record_path)
    outside = [item for item in overrides if not item.split("=", 1)[0].strip().startswith("finetune.")]
    if outside or not overrides:
        raise DapbenchError(
            f"a re-scoring changes end-task settings only; got {', '.join(outside) or 'no --set'}",
            "pass --set finetune.KEY=VALUE (anything else would need the DAP stages re-run: use dapbench run)",
        )
    config = apply_overrides(rep.reproduction_config(record, output_dir, dict(paths or {}), work_dir), list(overrides))
    threads = rep.recorded_cpu_threads(record)
    with rep.cpu_threads(threads) if threads else contextlib.nullcontext():
        config = materialise(config)
        data = prepare_data(config)
        rep.check_data(record, data.checksums)
        check_run_data(config, data)
        run = continual_run(config, data, record["method"], record["seed"], show_progress=show_progress)
        if run.run_id == record["run_id"]:
            raise DapbenchError(
                f"--set {' '.join(overrides)} leaves {record['run_id']}'s numbers as they are: nothing to re-score",
                "change an end-task setting the record does not already have",
            )
        link_finished_stages(RunPaths(Path(config.work_dir) / "runs" / record["run_id"]), run.layout)
        new = run.execute()
    path = path_inside(output_dir, "results", record["profile"], f"{run.run_id}.json")
    write_record(path, new)
    return new, path


def require_current_numerics(record: RunRecord, record_path: str | Path) -> None:
    """Refuse to reproduce a record whose numerics versions (core, method, replay) this checkout does not compute:
    its numbers come from another training stream or method code, so every comparison would fail."""
    from benchmark.records.identity import REPLAY_VERSION, RESULTS_VERSION, canonical_recipe
    from benchmark.registry import default_registry

    made = record.get("identity") or {}
    here = {"results_version": RESULTS_VERSION, "method_version": default_registry().get(record["method"]).version}
    if "replay" in canonical_recipe(record["config"]):
        here["replay_version"] = REPLAY_VERSION
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
def report(output_dir: str | Path = DEFAULT_OUTPUT, show_progress: bool = False, check: bool = False) -> dict:
    """Regenerate what changed of the tables, plots, site and ``leaderboard.md`` under ``output_dir`` from its
    records; with ``check``, write nothing and name under ``stale`` what a report would change."""
    from benchmark.report import write_report

    return write_report(output_dir, show_progress, check=check)


def run_summary(records: Sequence[RunRecord], output_dir: str | Path) -> list[str]:
    """What the leaderboard of ``output_dir`` says about the groups of ``records``, as plain text lines: the
    same numbers, intervals and verdicts (:mod:`benchmark.report.summary`)."""
    from benchmark.records.store import leaderboard_records
    from benchmark.report.summary import terminal_summary

    return terminal_summary(records, leaderboard_records(Path(output_dir) / "results"))


def migrate_results(results_dir: str | Path) -> list[Path]:
    """Rewrite every record under ``results_dir`` of an older schema as the current one, and complete every record
    that lacks a field a run writes today (:func:`~benchmark.records.store.completed_record`, from the plugins
    installed here), in place and atomically
    (numbers unchanged; samples into their sidecars); return the rewritten files. Readers migrate on load anyway."""
    from benchmark.records.schema import SCHEMA_VERSION
    from benchmark.records.store import completed_record, record_paths
    from benchmark.registry import installed_method

    rewritten = []
    for path in record_paths(results_dir):
        raw = read_json(path, "run record")
        loaded = load_record(path)  # every check a reader applies, before anything is rewritten
        record = completed_record(loaded, installed_method)
        if not isinstance(raw, dict) or raw.get("schema") != SCHEMA_VERSION or record != loaded:
            write_record(path, record)
            rewritten.append(path)
    return rewritten


def export_results(results_dir: str | Path, out: str | Path) -> dict[str, int]:
    """Write every leaderboard record under ``results_dir`` as a dataset under ``out`` (Parquet tables and a dataset
    card, :mod:`benchmark.report.export`); return the rows of each table."""
    from benchmark.records.store import leaderboard_records
    from benchmark.report.export import export_results as export

    return export(leaderboard_records(results_dir), out)


def finetune_frontier(results_dir: str | Path) -> list[str]:
    """The fine-tuning settings of the no-DAP records under ``results_dir``: cost, fine-tuning noise and the difference
    each resolves, the frontier marked (:mod:`benchmark.report.frontier`), as Markdown lines."""
    from benchmark.records.store import leaderboard_records
    from benchmark.report.frontier import frontier_markdown, protocol_points

    return frontier_markdown(protocol_points(leaderboard_records(results_dir)))


def versus(results_dir: str | Path, label: str) -> list[str]:
    """``dapbench versus``: the row ``label`` against every other row of each group under ``results_dir`` that holds
    it, through the leaderboard's calibrated comparison (:mod:`benchmark.report.versus`), as Markdown lines."""
    from benchmark.records.store import leaderboard_records
    from benchmark.report.groups import group_records
    from benchmark.report.versus import versus_markdown
    from benchmark.report.writer import group_statistics

    groups, _ = group_records(leaderboard_records(results_dir))
    return versus_markdown(groups, label, group_statistics)


def leaderboard_table(results_dir: str | Path):
    """One pandas row per record under ``results_dir``: its leaderboard group, method label, seed, every column."""
    from benchmark.report import leaderboard_frame

    return leaderboard_frame(load_records(results_dir))


def config_json(config: RunConfig) -> str:
    """The resolved configuration as the JSON every process reads (``RunConfig.to_dict``)."""
    return json.dumps(config.to_dict(), indent=2)
