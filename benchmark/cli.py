"""The ``dapbench`` command line: argument parsing over :mod:`benchmark.api` (run, report, reproduce, bench,
study, list, pretrain-base)."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from pathlib import Path

from benchmark.config import RunConfig
from benchmark.errors import DapbenchError


def console_main() -> int:
    """Entry point of the ``dapbench`` console script (and ``python -m benchmark.cli``): :func:`main`, after which
    an interrupted process keeps ignoring further signals while the interpreter winds down."""
    return main(console=True)


def main(argv: list[str] | None = None, *, console: bool = False) -> int:
    """Run one ``dapbench`` command in this process and return its exit code (0 ok, 1 a check failed, 2 bad input,
    130/143 interrupted); signal handlers are restored afterwards unless ``console``."""
    parser = _parser()
    args = parser.parse_args(argv)
    _quiet_libraries()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if _main_thread() else {}
    if handlers:
        signal.signal(signal.SIGTERM, _terminated)
    try:
        return args.func(args)
    except DapbenchError as exc:
        print(f"dapbench: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, _Terminated) as exc:
        # Every finished domain and fine-tune is already on disk (atomic writes); the unfinished unit is redone.
        # A second signal while the process winds down (libraries' finalisers run then) would print a traceback.
        _ignore_further_signals()
        code = 143 if isinstance(exc, _Terminated) else 130
        print(
            f"dapbench: {'terminated' if code == 143 else 'interrupted'}; finished domains and fine-tunes are kept:"
            " run the same command again to resume",
            file=sys.stderr,
        )
        return code
    finally:
        if not console:  # an in-process caller (a Slurm job, a test) gets its own handlers back
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


class _Terminated(Exception):
    """SIGTERM, turned into an exception so that the run stops like on Ctrl-C (cluster schedulers send it)."""


def _terminated(signum, frame) -> None:
    raise _Terminated


def _ignore_further_signals() -> None:
    """Ignore SIGINT and SIGTERM from now on (the run is already stopping), where this thread may set handlers."""
    if _main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dapbench", description=__doc__)
    sub = parser.add_subparsers(required=True, dest="command")

    run = sub.add_parser("run", help="pre-train through a domain sequence, fine-tune, write records")
    _add_run_arguments(run)
    _add_launch_arguments(run)
    run.set_defaults(func=cmd_run)

    bench = sub.add_parser("bench", help="DAP update cost per method: time, FLOPs, MFU, memory, vs a plain step")
    _add_run_arguments(bench)
    bench.add_argument("--steps", type=int, default=20, help="timed updates per method")
    bench.add_argument("--save", metavar="DIR", help="write the JSON report to DIR/<device>-<profile>.json")
    bench.add_argument(
        "--trace", metavar="DIR", help="also record a torch.profiler trace of a few updates per method under DIR"
    )
    bench.set_defaults(func=cmd_bench)

    study = sub.add_parser("study", help="a method's named measurement, e.g. study das importance-stability")
    study.add_argument("method", help="a registered method (`dapbench list` shows its studies)")
    study.add_argument("study", help="the study's name")
    study.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="e.g. chunks=64,256")
    _add_run_arguments(study)
    study.set_defaults(func=cmd_study)

    reproduce = sub.add_parser("reproduce", help="re-run a committed record from scratch and compare its numbers")
    reproduce.add_argument("record", help="a run record JSON, e.g. results/mini/ncl-seq0-seed2021-<hash>.json")
    reproduce.add_argument("--output-dir", help="where the new record goes (default: reproduce/<run id>)")
    for name in ("model", "data-root", "general-heldout", "general-corpus"):
        reproduce.add_argument(f"--{name}", help=f"replace the recorded {name} path")
    reproduce.add_argument("--score-tolerance", type=float, help="accepted |difference| of acc/F1 (fraction)")
    reproduce.add_argument("--loss-tolerance", type=float, help="accepted |difference| of MLM losses")
    reproduce.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="e.g. device=cpu")
    reproduce.add_argument(
        "--threads", type=int, help="CPU threads (default: the record's own count; results depend on it)"
    )
    reproduce.add_argument("--quiet", action="store_true", help="no progress bars")
    reproduce.set_defaults(func=cmd_reproduce)

    report = sub.add_parser("report", help="tables, heatmaps and leaderboard.md from results/")
    report.add_argument("--output-dir", default=".")
    report.set_defaults(func=cmd_report)

    migrate = sub.add_parser("migrate", help="rewrite older-schema records as the current schema")
    migrate.add_argument("--output-dir", default=".")
    migrate.set_defaults(func=cmd_migrate)

    listing = sub.add_parser("list", help="registered methods, tasks, sequences and profiles")
    listing.add_argument("--data-root", help="list a custom suite instead of the built-in one")
    listing.set_defaults(func=cmd_list)

    base = sub.add_parser("pretrain-base", help="build a small base masked LM from a general corpus")
    base.add_argument("corpus", help="text file, one passage per line")
    base.add_argument("out_dir", help="model directory to write")
    for field in dataclasses.fields(_base_spec_cls()):
        base.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    base.set_defaults(func=cmd_pretrain_base)
    return parser


def _add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--profile", default="synthetic", help="synthetic (default), mini, ci or paper")
    run.add_argument("--methods", help="comma-separated method names (default: the profile's)")
    run.add_argument("--model", help="hub id or local directory of the base masked LM")
    run.add_argument("--data-root", help="the paper's data-release folder (or env DAPBENCH_DATA)")
    run.add_argument("--general-heldout", help="general-domain text whose MLM loss is tracked")
    run.add_argument(
        "--sequence", help="seq0 ... seq4, a comma-separated list of domains; for run also seq0..seq4 or seq0+seq3"
    )
    run.add_argument("--seeds", help="comma-separated seeds")
    run.add_argument("--matrix", choices=("full", "final"), help="lower triangle, or diagonal + last row")
    run.add_argument("--output-dir", default=".", help="where results/ and leaderboard.md go (default: .)")
    run.add_argument("--work-dir", help="checkpoints and caches (default: <output-dir>/.dapbench)")
    run.add_argument("--device", choices=("auto", "cpu"), help="auto (accelerate decides) or cpu")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config field, e.g. dap.steps=100 or das.contrast_lambda=0.5",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_launch_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--launcher",
        help="fan the method x seed x sequence grid out: local:N (N runs at a time on this machine, one GPU each"
        " where there are GPUs) or slurm (one job per run through submitit); default: one run after another here",
    )
    run.add_argument("--no-leaderboard", action="store_true", help="write records only (a launcher's runs do)")
    run.add_argument("--slurm-partition", help="Slurm partition of the grid's jobs")
    run.add_argument("--slurm-time", type=int, default=24 * 60, help="minutes per job (default 1440)")
    run.add_argument("--slurm-gpus", type=int, default=1, help="GPUs per job (default 1)")
    run.add_argument("--slurm-cpus", type=int, default=8, help="CPU cores per job (default 8)")
    run.add_argument("--slurm-mem", type=int, help="memory per job in GB (default: the partition's)")
    run.add_argument(
        "--slurm-executor", choices=("slurm", "local", "debug"), default="slurm",
        help="submitit's executor: slurm, or local/debug to try the grid's jobs without a cluster",
    )  # fmt: skip
    run.add_argument("--wait", action="store_true", help="with slurm: wait for the jobs, then write the leaderboard")


def _base_spec_cls():
    from benchmark.pretrain import BaseModelSpec

    return BaseModelSpec


def _quiet_libraries() -> None:
    from benchmark.api import quiet_libraries

    quiet_libraries()


def _config(args: argparse.Namespace, sequence: str | None = None) -> RunConfig:
    """The run arguments as a checked :class:`RunConfig` (``benchmark.api.resolve_config``), for ``sequence``
    where the command names a grid of sequences."""
    from benchmark.api import resolve_config

    return resolve_config(
        args.profile,
        overrides=args.set,
        work_dir=args.work_dir,
        model=args.model,
        data_root=args.data_root,
        general_heldout=args.general_heldout,
        sequence=sequence or args.sequence,
        matrix=args.matrix,
        output_dir=args.output_dir,
        device=args.device,
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()) if args.methods else None,
        seeds=_parse_seeds(args.seeds) if args.seeds else None,
    )


def _parse_seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError as exc:
        raise DapbenchError(f"--seeds {text!r} is not a list of integers", "write e.g. --seeds 2021,111,222") from exc


def cmd_run(args: argparse.Namespace) -> int:
    """``dapbench run``: every method x seed x sequence, here one after another or through a launcher."""
    from benchmark.api import report, run_benchmark, synthetic_reading
    from benchmark.launch import expand_sequences

    configs = [_config(args, sequence) for sequence in expand_sequences(args.sequence)]
    if args.launcher:
        return _launch(args, configs)
    records = []
    for config in configs:
        records += run_benchmark(config, show_progress=not args.quiet, echo=print, write_leaderboard=False)
    if records and not args.no_leaderboard and _main_process():
        report(configs[0].output_dir)
        print(synthetic_reading(records) if configs[0].profile == "synthetic" else "")
        print(f"leaderboard: {Path(configs[0].output_dir) / 'leaderboard.md'}")
    return 0


def _main_process() -> bool:
    """False on the other processes of an ``accelerate launch``/``torchrun`` run: they print and report nothing."""
    from accelerate import PartialState

    return PartialState().is_main_process


def _launch(args: argparse.Namespace, configs: list[RunConfig]) -> int:
    """``run --launcher``: the grid's unfinished runs as separate processes or Slurm jobs."""
    from benchmark.api import launch_grid
    from benchmark.launch import SlurmOptions

    slurm = SlurmOptions(
        partition=args.slurm_partition, time_min=args.slurm_time, gpus=args.slurm_gpus, cpus=args.slurm_cpus,
        mem_gb=args.slurm_mem, executor=args.slurm_executor,
    )  # fmt: skip
    failed = launch_grid(configs, args.launcher, overrides=args.set, slurm=slurm, wait=args.wait, echo=print)
    return 1 if failed else 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``dapbench bench``: each method's DAP update against the GEMM peak and a plain transformers step."""
    import json

    from benchmark.api import check_inputs, materialise
    from benchmark.bench import bench, device_slug, markdown_table
    from benchmark.io import atomic_write_json

    config = materialise(_config(args), show_progress=not args.quiet, echo=print)
    check_inputs(config)
    trace = Path(args.trace) if args.trace else None
    report = bench(config, list(config.methods), args.steps, trace_dir=trace)
    print(markdown_table(report))
    if args.save:
        path = Path(args.save) / f"{device_slug(report['device'])}-{config.profile}.json"
        atomic_write_json(path, report)
        print(f"bench: {path}")
    else:
        print(json.dumps(report, indent=2))
    if trace:
        print(f"bench: profiler traces (Chrome format, open in Perfetto) and operator tables under {trace}")
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    """``dapbench study METHOD NAME``: a method's named measurement, printed as JSON."""
    import json

    from benchmark.api import run_study

    options = {}
    for item in args.option:
        if "=" not in item:
            raise DapbenchError(f"--option {item!r} has no '='", "write --option key=value")
        key, value = item.split("=", 1)
        options[key.strip()] = value.strip()
    print(json.dumps(run_study(_config(args), args.method, args.study, options), indent=2))
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    """``dapbench reproduce``: exit 0 if every number matches within tolerance, 1 otherwise."""
    from benchmark.api import reproduce
    from benchmark.reproduce import DEFAULT_TOLERANCE, Tolerance

    tolerance = Tolerance(
        score=DEFAULT_TOLERANCE.score if args.score_tolerance is None else args.score_tolerance,
        loss=DEFAULT_TOLERANCE.loss if args.loss_tolerance is None else args.loss_tolerance,
    )
    result = reproduce(
        args.record,
        output_dir=args.output_dir,
        paths={name: getattr(args, name) for name in ("model", "data_root", "general_heldout", "general_corpus")},
        overrides=args.set,
        threads=args.threads,
        tolerance=tolerance,
        show_progress=not args.quiet,
    )
    record = result.record
    print(f"reproduced {record['method_label']} seed {record['seed']} -> {result.path}")
    if result.threads:
        print(f"CPU threads: {result.threads} (the record's: {result.recorded_threads})")
    print(f"{result.compared} numbers compared, {len(result.mismatches)} outside tolerance {tolerance}")
    for kind, (name, diff) in result.largest.items():
        print(f"  largest {kind} difference: {diff:.5f} ({name})")
    for mismatch in result.mismatches:
        print(f"  {mismatch}")
    return 0 if result.ok else 1


def cmd_report(args: argparse.Namespace) -> int:
    """``dapbench report``."""
    from benchmark.api import report

    counts = report(args.output_dir)
    print(
        f"report: {counts['records']} records -> {counts['files']} files; "
        f"leaderboard: {Path(args.output_dir) / 'leaderboard.md'}"
    )
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """``dapbench migrate``."""
    from benchmark.api import migrate_results

    rewritten = migrate_results(Path(args.output_dir) / "results")
    print(f"migrate: {len(rewritten)} record(s) rewritten to the current schema")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """``dapbench list``."""
    from benchmark.config import PROFILES
    from benchmark.data import load_suite
    from benchmark.registry import default_registry

    registry = default_registry()
    print("methods:")
    for name in registry.names():
        cls = registry.get(name)
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        studies = f" [studies: {', '.join(cls.studies)}]" if cls.studies else ""
        print(f"  {name:12s} {doc}{studies}")
    suite = load_suite(args.data_root)
    print("domains and end tasks:")
    for domain in suite.domains.values():
        spec = suite.end_tasks[domain.end_task]
        print(f"  {domain.name:12s} {domain.corpus:32s} -> {spec.name} ({len(spec.labels)} labels)")
    print("sequences:")
    for name, order in suite.sequences.items():
        print(f"  {name:12s} {' -> '.join(order)}")
    print(f"profiles: {', '.join(PROFILES)} (default: synthetic)")
    return 0


def cmd_pretrain_base(args: argparse.Namespace) -> int:
    """``dapbench pretrain-base``."""
    from benchmark.pretrain import BaseModelSpec, pretrain_base

    spec = BaseModelSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BaseModelSpec)})
    out = pretrain_base(args.corpus, args.out_dir, spec)
    print(f"base model written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(console_main())
