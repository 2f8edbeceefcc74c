"""The ``dapbench`` command line: argument parsing over benchmark.api, one call per command."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path

from benchmark.config import DEFAULT_OUTPUT, PROFILES
from benchmark.errors import DapbenchError
from benchmark.stopping import Terminated, ignore_further_signals, signals_stop_the_run

DESCRIPTION = """\
dapbench: a benchmark for continual domain-adaptive pre-training of language models.

A base model is further pre-trained on a sequence of domain corpora by a continual-learning method; after each
domain the held-out loss of every domain and of general text, and end-task scores, show what it learned and
what it forgot. Runs write one record per method and seed, and a leaderboard, under an output folder
(default: ./dapbench-out)."""

EXAMPLES = {
    "run": """\
examples:
  dapbench run                                   # the offline synthetic world, a few minutes on a CPU
  dapbench run --profile mini --methods ncl,das --seeds 2021,111,222
  dapbench run --profile ci --methods ncl --sequence restaurant --output-dir out
  dapbench run --profile mini --methods ncl --set replay.general=0.05 --set schedule.name=wsd
  dapbench run --profile mini --methods domix,das --set finetune.protocol=finetune --report-to tensorboard
  dapbench run --profile paper --model roberta-base --data-root DATA --sequence seq0..seq4 --launcher local:4""",
    "lr-curve": """\
examples:
  dapbench lr-curve dapbench-out/results/mini/ncl-*.json --output lr.png   # one line per record""",
    "report": """\
examples:
  dapbench report                                # regenerate ./dapbench-out/leaderboard.md from its records
  dapbench report --output-dir . [--check]       # the committed leaderboard and site; --check: exit 1 if stale""",
    "reproduce": """\
examples:
  dapbench reproduce results/ci/ncl-custom-restaurant-acl-phone-seed2021-<hash>.json
  dapbench reproduce RECORD --model DIR --data-root DIR --general-heldout FILE""",
    "bench": """\
examples:
  dapbench bench --profile mini --methods ncl,das --steps 8 --save results/bench""",
    "study": """\
examples:
  dapbench study das importance-stability --profile mini --option chunks=64,256""",
    "list": """\
examples:
  dapbench list
  dapbench list --data-root ../shared/data/continuallm-layout""",
    "migrate": """\
examples:
  dapbench migrate --output-dir .""",
    "frontier": """\
examples:
  dapbench frontier --output-dir .               # every fine-tuning setting the committed no-DAP records ran
  dapbench frontier --output-dir study           # your own: records of `none` at several finetune.* settings""",
    "versus": """\
examples:
  dapbench versus l2sp --output-dir ../try-l2sp  # your plugin against das, derpp, none and every row beside it
  dapbench versus das --output-dir .             # the committed DAS rows against every other committed row""",
    "rescore": """\
examples:
  dapbench rescore results/mini-pass/ncl-seq0-seed2021-<hash>.json --work-dir grid/.dapbench \\
      --set finetune.validation_share=0.1 --set finetune.max_train_examples=null""",
    "export": """\
examples:
  dapbench export dapbench-dataset --output-dir .
  python -c 'import pandas; print(pandas.read_parquet("dapbench-dataset/runs.parquet").head())'""",
    "pretrain-base": """\
examples:
  dapbench pretrain-base ../shared/data/general/train.txt base-model --steps 2000
  dapbench pretrain-base ../shared/data/general/train.txt decoder --causal --kv-heads 2""",
}


def console_main() -> int:
    """Entry point of the ``dapbench`` console script (and ``python -m benchmark.cli``): :func:`main`, after which
    an interrupted process keeps ignoring further signals while the interpreter winds down."""
    return main(console=True)


def main(argv: list[str] | None = None, *, console: bool = False) -> int:
    """Run one ``dapbench`` command in this process and return its exit code (0 ok, 1 a check failed, 2 bad input,
    130/143 interrupted); signal handlers are restored afterwards unless ``console``."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `dapbench`: what it can do
        parser.print_help()
        return 0
    with signals_stop_the_run(restore=not console):
        return _run_command(args)


def _run_command(args: argparse.Namespace) -> int:
    """The parsed command's exit code: its own, 2 for bad input (one line), 130/143 when a signal stopped it."""
    from benchmark.api import quiet_libraries

    try:
        quiet_libraries()
        if getattr(args, "output_dir", None) is not None and not str(args.output_dir).strip():
            raise DapbenchError(
                "--output-dir is empty (an unset shell variable?): it would name the current folder",
                "pass the folder explicitly, e.g. --output-dir dapbench-out (or --output-dir . on purpose)",
            )
        return args.func(args)
    except DapbenchError as exc:
        print(f"dapbench: error: {_printable(exc)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as exc:
        # Every finished domain and fine-tune is already on disk (atomic writes); the unfinished unit is redone.
        # A second signal while the process winds down (libraries' finalisers run then) would print a traceback.
        ignore_further_signals()
        code = 143 if isinstance(exc, Terminated) else 130
        print(
            f"dapbench: {'terminated' if code == 143 else 'interrupted'}; finished domains and fine-tunes are kept:"
            " run the same command again to resume",
            file=sys.stderr,
        )
        return code


def _printable(value: object) -> str:
    from benchmark.report.escape import printable

    return "\n".join(printable(line) for line in str(value).splitlines())


def _say(line: str) -> None:
    """Print ``line`` without control characters: plugins' names and docstrings reach the terminal as they are."""
    print(_printable(line))


# ----------------------------------------------------------------------------------------------
# Parser
# ----------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dapbench",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Start with `dapbench run`, then open dapbench-out/leaderboard.md. `dapbench COMMAND --help` for more.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, summary: str, func) -> argparse.ArgumentParser:
        child = sub.add_parser(
            name,
            help=summary,
            description=summary,
            epilog=EXAMPLES.get(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        child.set_defaults(func=func)
        return child

    run = command(
        "run", "pre-train through domain sequences, score end tasks, write records and a leaderboard", cmd_run
    )
    _add_run_arguments(run)
    run.add_argument("--config", metavar="FILE", help="run a resolved configuration file (what grid launchers write)")
    _add_launch_arguments(run)

    bench = command("bench", "DAP update cost per method: time, FLOPs, MFU, memory, against a plain step", cmd_bench)
    _add_run_arguments(bench)
    bench.add_argument("--steps", type=int, default=20, help="timed updates per method")
    bench.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="untimed updates before them (the loader's start, allocation, compilation); 0: the stage's whole time",
    )
    bench.add_argument("--finetune", action="store_true", help="time the fine-tuning update, plain and compiled")
    bench.add_argument(
        "--save",
        metavar="DIR",
        help="write the JSON report to DIR/<device>-<profile>[-causal][-bN][-mbN][-compiled][-checkpointed].json",
    )
    bench.add_argument("--trace", metavar="DIR", help="also record a torch.profiler trace of a few updates per method")

    study = command("study", "a method's named measurement, e.g. DAS's importance-stability", cmd_study)
    study.add_argument("method", help="a registered method (`dapbench list` shows its studies)")
    study.add_argument("study", help="the study's name")
    study.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="e.g. chunks=64,256")
    _add_run_arguments(study)

    tune = command(
        "tune", "choose a method's rate (a numeric option) on validation slices at a profile's budget", cmd_tune
    )
    _add_run_arguments(tune)
    tune.add_argument("--option", required=True, metavar="METHOD.KEY", help="e.g. prompt_one.prompt_lr")
    tune.add_argument("--values", required=True, help="comma-separated candidates, e.g. 0.3,0.03,0.003")

    _add_record_commands(command)
    return parser


def _add_record_commands(command) -> None:
    """The commands that read or re-derive records: reproduce, report, migrate, export, list, pretrain-base."""
    reproduce = command("reproduce", "re-run a record from scratch and compare every number it reports", cmd_reproduce)
    reproduce.add_argument("record", help="a run record JSON file")
    reproduce.add_argument("--output-dir", help=f"where the new record goes (default: {DEFAULT_OUTPUT}/reproduce/<id>)")
    for name in ("model", "data-root", "general-heldout", "general-corpus"):
        reproduce.add_argument(f"--{name}", help=f"this machine's {name} (the record names it portably)")
    for kind in ("score", "loss", "drift", "report"):
        reproduce.add_argument(f"--{kind}-tolerance", type=float, help=f"accepted |difference| of {kind} numbers")
    reproduce.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="e.g. device=cpu")
    reproduce.add_argument("--threads", type=int, help="CPU threads (default: the record's own; results depend on it)")
    reproduce.add_argument(
        "--stages-only",
        action="store_true",
        help="re-run only the DAP stages (no end task) and compare the numbers they make; where all match and the"
        " record predates update sizes, write it with the re-run's sizes added",
    )
    reproduce.add_argument(
        "--own-domain",
        action="store_true",
        help="with --stages-only: evaluate each stage on its own domain's held-out set alone (no drift), a third of"
        " the time; its training losses, held-out losses and chunk sums are compared",
    )
    reproduce.add_argument(
        "--work-dir",
        help="a work folder whose caches (prepared data, recipe-built base models) re-runs share (default: under"
        " --output-dir); one that already holds this run is refused",
    )
    reproduce.add_argument("--quiet", action="store_true", help="no progress bars")

    rescore = command(
        "rescore", "score a run's kept checkpoints again under other end-task settings (finetune.*)", cmd_rescore
    )
    rescore.add_argument("record", help="a run record JSON file whose run kept its checkpoints")
    rescore.add_argument("--work-dir", required=True, help="the work folder that holds the run (runs/<its run id>)")
    rescore.add_argument("--set", action="append", default=[], metavar="finetune.KEY=VALUE", help="the new settings")
    rescore.add_argument("--output-dir", default=DEFAULT_OUTPUT, help=f"where the new record goes ({DEFAULT_OUTPUT})")
    for name in ("model", "data-root", "general-heldout", "general-corpus"):
        rescore.add_argument(f"--{name}", help=f"this machine's {name} (the record names it portably)")
    rescore.add_argument("--quiet", action="store_true", help="no progress bars")

    report = command("report", "regenerate the leaderboard, tables, plots and site from a folder's records", cmd_report)
    report.add_argument("--output-dir", default=DEFAULT_OUTPUT, help=f"the folder (default: {DEFAULT_OUTPUT})")
    report.add_argument("--quiet", action="store_true", help="no progress bars")
    report.add_argument("--check", action="store_true", help="write nothing; exit 1 naming files a report would change")

    curve = command("lr-curve", "plot the DAP learning rate of every update of recorded runs", cmd_lr_curve)
    curve.add_argument("records", nargs="+", help="run record JSON files (each drawn as one line)")
    curve.add_argument("--output", default="lr-curve.png", help="the PNG to write (default: lr-curve.png)")

    migrate = command(
        "migrate",
        "rewrite older-schema records as the current schema, complete older ones (numbers unchanged)",
        cmd_migrate,
    )
    migrate.add_argument("--output-dir", default=DEFAULT_OUTPUT, help=f"the folder (default: {DEFAULT_OUTPUT})")

    export = command("export", "write the results as a dataset: Parquet tables and a dataset card", cmd_export)
    export.add_argument("out", help="the folder to write the dataset into (runs, stages, curves, end_tasks, README.md)")
    export.add_argument("--output-dir", default=DEFAULT_OUTPUT, help=f"the folder of results/ ({DEFAULT_OUTPUT})")

    front = command(
        "frontier",
        "fine-tuning settings of the no-DAP records: cost against the difference each resolves",
        cmd_frontier,
    )
    front.add_argument("--output-dir", default=DEFAULT_OUTPUT, help=f"the folder of results/ ({DEFAULT_OUTPUT})")

    against = command(
        "versus", "one row against every other row of its group: the leaderboard's calibrated verdicts", cmd_versus
    )
    against.add_argument("label", help="the row as the leaderboard writes it (e.g. l2sp, das[fidelity=reference])")
    against.add_argument("--output-dir", default=DEFAULT_OUTPUT, help=f"the folder of results/ ({DEFAULT_OUTPUT})")

    listing = command("list", "registered methods and their options, domains, end tasks, sequences, profiles", cmd_list)
    listing.add_argument("--data-root", help="list a custom suite instead of the built-in one")
    listing.add_argument("--json", action="store_true", help="print it as JSON")

    base = command(
        "pretrain-base", "build a small base model (masked LM, or --causal decoder) from a corpus", cmd_pretrain_base
    )
    base.add_argument("corpus", help="text file, one passage per line")
    base.add_argument("out_dir", help="model directory to write")
    for field in dataclasses.fields(_base_spec_cls()):
        flag = f"--{field.name.replace('_', '-')}"
        if isinstance(field.default, bool):
            base.add_argument(flag, action="store_true", help="a Llama-style decoder instead of a BERT masked LM")
        else:
            base.add_argument(flag, type=type(field.default), default=field.default)


def _add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--profile", default="synthetic", help=f"one of {', '.join(PROFILES)} (default: synthetic)")
    run.add_argument("--methods", help="comma-separated method names, any case, or all (default: the profile's)")
    run.add_argument("--model", help="hub id or local directory of the base model")
    run.add_argument("--data-root", help="the paper's data-release folder (or env DAPBENCH_DATA)")
    run.add_argument("--general-heldout", help="general-domain text whose held-out loss is tracked")
    run.add_argument("--sequence", help="seq0 ... seq4, or domains a,b,c; for run also seq0..seq4 or seq0+seq3")
    run.add_argument("--seeds", help="comma-separated seeds")
    run.add_argument("--matrix", choices=("full", "final"), help="lower triangle, or diagonal + last row")
    run.add_argument(
        "--output-dir", default=DEFAULT_OUTPUT, help=f"records and leaderboard (default: {DEFAULT_OUTPUT})"
    )
    run.add_argument("--work-dir", help="checkpoints and caches (default: <output-dir>/.dapbench)")
    run.add_argument("--device", choices=("auto", "cpu"), help="auto (accelerate decides) or cpu")
    run.add_argument(
        "--report-to",
        choices=("none", "tensorboard", "wandb", "mlflow"),
        help="an experiment tracker to follow the run in (default none; tensorboard writes under"
        " <output-dir>/tracking)",
    )
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any setting, e.g. dap.steps=100 or das.contrast_lambda=0.5",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_launch_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--launcher", help="fan the grid out: local:N (N runs at a time here) or slurm (submitit)")
    run.add_argument("--no-leaderboard", action="store_true", help="write records only (a launcher's runs do)")
    run.add_argument("--slurm-partition", help="Slurm partition of the grid's jobs")
    run.add_argument("--slurm-time", type=int, default=24 * 60, help="minutes per job (default 1440)")
    run.add_argument("--slurm-gpus", type=int, default=1, help="GPUs per job (default 1)")
    run.add_argument("--slurm-cpus", type=int, default=8, help="CPU cores per job (default 8)")
    run.add_argument("--slurm-mem", type=int, help="memory per job in GB (default: the partition's)")
    run.add_argument(
        "--slurm-executor",
        choices=("slurm", "local", "debug"),
        default="slurm",
        help="submitit's executor: slurm, or local/debug to try the jobs without a cluster",
    )
    run.add_argument("--wait", action="store_true", help="with slurm: wait for the jobs, then write the leaderboard")


def _base_spec_cls():
    from benchmark.data.pretrain import BaseModelSpec

    return BaseModelSpec


def _config(args: argparse.Namespace, sequence: str | None = None):
    """The run arguments as a checked ``RunConfig`` (``benchmark.api.resolve_config``), for ``sequence`` where the
    command names a grid of sequences."""
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
        report_to=args.report_to,
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()) if args.methods else None,
        seeds=_parse_seeds(args.seeds) if args.seeds else None,
    )


def _parse_seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError as exc:
        raise DapbenchError(f"--seeds {text!r} is not a list of integers", "write e.g. --seeds 2021,111,222") from exc


# ----------------------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    """``dapbench run``: every method x seed x sequence, here one after another or through a launcher."""
    from benchmark.api import report, run_benchmark, run_config_file
    from benchmark.tools.launch import expand_sequences

    if args.config:
        run_config_file(args.config)
        return 0
    configs = [_config(args, sequence) for sequence in expand_sequences(args.sequence)]
    if args.launcher:
        return _launch(args, configs)
    if len(configs) > 1:
        from benchmark.preflight import check_inputs

        check_inputs([_materialised(c, args) for c in configs])  # every sequence before the first trains
    records = []
    for config in configs:
        records += run_benchmark(config, show_progress=not args.quiet, echo=print, write_leaderboard=False)
    if records and not args.no_leaderboard and _main_process():
        report(configs[0].output_dir, show_progress=not args.quiet)
        _print_outcome(records, configs[0])
    return 0


def _materialised(config, args):
    from benchmark.api import materialise

    return materialise(config, not args.quiet, print)


def _print_outcome(records, config) -> None:
    """What the leaderboard says about these runs, where it is, and what to try next."""
    from benchmark.api import run_summary

    out = Path(config.output_dir)
    print("", *run_summary(records, out), sep="\n")
    print(f"\nleaderboard: {out / 'leaderboard.md'}\nrecords:     {out / 'results' / config.profile}")
    if config.profile == "synthetic":
        print(
            "next: dapbench run --profile mini --methods ncl,das --seeds 2021,111,222"
            "   (real data, 12-37 min per method and seed on 2 CPU cores)"
        )
    else:
        print("next: more seeds (--seeds) or methods (dapbench list); dapbench reproduce RECORD re-derives a record")


def _main_process() -> bool:
    """False on the other processes of an ``accelerate launch``/``torchrun`` run: they print and report nothing."""
    from accelerate import PartialState

    return PartialState().is_main_process


def _launch(args: argparse.Namespace, configs: list) -> int:
    """``run --launcher``: the grid's unfinished runs as separate processes or Slurm jobs."""
    from benchmark.api import launch_grid
    from benchmark.tools.launch import SlurmOptions

    slurm = SlurmOptions(
        partition=args.slurm_partition,
        time_min=args.slurm_time,
        gpus=args.slurm_gpus,
        cpus=args.slurm_cpus,
        mem_gb=args.slurm_mem,
        executor=args.slurm_executor,
    )
    failed = launch_grid(configs, args.launcher, slurm=slurm, wait=args.wait, echo=print)
    out = Path(configs[0].output_dir)
    if failed and args.launcher.startswith("local"):
        logs = Path(configs[0].work_dir) / "grid-logs"
        print(f"{len(failed)} run(s) failed; their logs are in {logs}")
    elif args.wait or args.launcher.startswith("local"):
        print(f"leaderboard: {out / 'leaderboard.md'}")
    return 1 if failed else 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``dapbench bench``: each method's DAP update against the GEMM peak and a plain transformers step."""
    from benchmark.api import bench
    from benchmark.io import atomic_write_json
    from benchmark.tools.bench import finetune_table, markdown_table, report_file_name

    config = _config(args)
    trace = Path(args.trace) if args.trace else None
    if args.finetune and trace:
        raise DapbenchError("--trace records DAP updates, not fine-tuning ones", "leave out --trace with --finetune")
    report = bench(config, args.steps, trace, show_progress=not args.quiet, warmup=args.warmup, finetune=args.finetune)
    print(finetune_table(report) if args.finetune else markdown_table(report))
    if args.save:
        path = Path(args.save) / report_file_name(report, config.profile)
        atomic_write_json(path, report)
        print(f"bench: {path}")
    else:
        print(json.dumps(report, indent=2))
    if trace:
        print(f"bench: profiler traces (Chrome format, open in Perfetto) and operator tables under {trace}")
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    """``dapbench study METHOD NAME``: a method's named measurement, printed as JSON."""
    from benchmark.api import run_study

    options = {}
    for item in args.option:
        if "=" not in item:
            raise DapbenchError(f"--option {item!r} has no '='", "write --option key=value")
        key, value = item.split("=", 1)
        options[key.strip()] = value.strip()
    print(json.dumps(run_study(_config(args), args.method, args.study, options), indent=2))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """``dapbench tune``: one method, one seed, each value of one option; prints the choice and where it is written."""
    from benchmark.api import TUNING_CRITERION, tune_option

    config = _config(args)
    if len(config.methods) != 1 or len(config.seeds) != 1:
        raise DapbenchError(
            f"tune takes one method and one seed, got {len(config.methods)} and {len(config.seeds)}",
            "pass --methods NAME --seeds SEED",
        )
    try:
        values = [float(v) for v in args.values.split(",")]
    except ValueError as exc:
        raise DapbenchError(f"--values {args.values!r} is not a list of numbers", "e.g. --values 1e-4,1e-3") from exc
    result = tune_option(config, config.methods[0], args.option, values, config.seeds[0], show_progress=not args.quiet)
    for row in result["candidates"]:
        print(f"{args.option}={row['value']:g}: mean validation loss {row['mean']:.4f}")
    print(f"chosen: {args.option}={result['chosen']:g} ({TUNING_CRITERION})")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    """``dapbench reproduce``: exit 0 if every number (``--stages-only``: every stage number) matches within
    tolerance, 1 otherwise."""
    from benchmark.api import reproduce, reproduce_stages
    from benchmark.records.reproduce import DEFAULT_TOLERANCE

    if args.own_domain and not args.stages_only:
        raise DapbenchError("--own-domain is a kind of --stages-only re-run", "add --stages-only")
    given = {kind: getattr(args, f"{kind}_tolerance") for kind in ("score", "loss", "drift", "report")}
    tolerance = dataclasses.replace(DEFAULT_TOLERANCE, **{k: v for k, v in given.items() if v is not None})
    paths = {name: getattr(args, name) for name in ("model", "data_root", "general_heldout", "general_corpus")}
    what = "its DAP stages alone" if args.stages_only else "its method, seed and configuration"
    what += ", each on its own domain's held-out set" if args.own_domain else ""
    print(
        f"reproduce: re-running {args.record} from scratch ({what}), then comparing every number it makes", flush=True
    )
    rerun = functools.partial(reproduce_stages, own_domain_only=args.own_domain) if args.stages_only else reproduce
    result = rerun(
        args.record,
        output_dir=args.output_dir,
        paths=paths,
        overrides=args.set,
        threads=args.threads,
        tolerance=tolerance,
        show_progress=not args.quiet,
        work_dir=args.work_dir,
    )
    for line in result.lines():
        print(_printable(line))
    return 0 if result.ok else 1


def cmd_rescore(args: argparse.Namespace) -> int:
    """``dapbench rescore``: a new record from a run's kept checkpoints under other end-task settings."""
    from benchmark.api import rescore
    from benchmark.report.summary import one_line

    paths = {name: getattr(args, name) for name in ("model", "data_root", "general_heldout", "general_corpus")}
    record, path = rescore(
        args.record,
        overrides=args.set,
        work_dir=args.work_dir,
        output_dir=args.output_dir,
        paths=paths,
        show_progress=not args.quiet,
    )
    print(_printable(f"rescore: {path}: {one_line(record)}"))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``dapbench report``."""
    from benchmark.api import report

    counts = report(args.output_dir, show_progress=not args.quiet, check=args.check)
    stale = "".join(f"report: stale: {path}\n" for path in counts["stale"])
    done = f"{len(counts['stale'])} file(s) stale" if args.check else f"{counts['files']} file(s) written"
    board = Path(args.output_dir) / "leaderboard.md"
    _say(f"{stale}report: {counts['records']} records in {counts['groups']} group(s), {done}; leaderboard: {board}")
    return 1 if counts["stale"] else 0


def cmd_lr_curve(args: argparse.Namespace) -> int:
    """``dapbench lr-curve``."""
    from benchmark.api import plot_learning_rates

    print(f"learning-rate curve(s) written to {plot_learning_rates(args.records, args.output)}")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """``dapbench migrate``."""
    from benchmark.api import migrate_results

    rewritten = migrate_results(Path(args.output_dir) / "results")
    print(f"migrate: {len(rewritten)} record(s) rewritten to the current schema or completed")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``dapbench export``."""
    from benchmark.api import export_results

    rows = export_results(Path(args.output_dir) / "results", args.out)
    print(f"export: {', '.join(f'{name} {count} rows' for name, count in rows.items())} -> {args.out}")
    return 0


def cmd_frontier(args: argparse.Namespace) -> int:
    """``dapbench frontier``: the fine-tuning protocol's frontier (issue #86) as a Markdown table."""
    from benchmark.api import finetune_frontier

    print("\n".join(finetune_frontier(Path(args.output_dir) / "results")))
    return 0


def cmd_versus(args: argparse.Namespace) -> int:
    """``dapbench versus``: one row's verdicts against every other row of its group (issue #89), as Markdown."""
    from benchmark.api import versus

    print("\n".join(versus(Path(args.output_dir) / "results", args.label)))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """``dapbench list``: methods (with options), domains and end tasks, sequences and profiles."""
    from benchmark.api import describe

    facts = describe(args.data_root)
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    _say("methods (options with their defaults: --set <method>.<option>=value):")
    for name, method in facts["methods"].items():
        studies = f" [studies: {', '.join(method['studies'])}]" if method["studies"] else ""
        _say(f"  {name:12s} {method['doc']}{studies}")
        if method["options"]:
            _say("  " + " " * 13 + _options_line(method["options"], method["choices"]))
    _say("recipe options of every method that pre-trains (--set <section>.<option>=value; each its own row):")
    for section, options in facts["recipes"].items():
        _say(f"  {section:12s} " + _options_line(options, facts["recipe_choices"][section]))
    _say("domains and end tasks:")
    for name, domain in facts["domains"].items():
        task = domain["end_task"]
        _say(f"  {name:12s} {domain['corpus']:32s} -> {task} ({facts['end_tasks'][task]} labels)")
    _say("end-task protocols (--set finetune.protocol=<name>):")
    for name, doc in facts["protocols"].items():
        _say(f"  {name:12s} {doc}")
    _say("sequences:")
    for name, order in facts["sequences"].items():
        _say(f"  {name:12s} {' -> '.join(order)}")
    _say(f"profiles: {', '.join(facts['profiles'])} (default: synthetic)")
    return 0


def _options_line(options: dict, choices: dict) -> str:
    """``name=default`` per option; an option of named values lists them: ``name=default (one of: a, b)``."""

    def shown(name: str, default) -> str:
        return f"{name}={default}" + (f" (one of: {', '.join(map(str, choices[name]))})" if name in choices else "")

    return ", ".join(shown(k, v) for k, v in options.items())


def cmd_pretrain_base(args: argparse.Namespace) -> int:
    """``dapbench pretrain-base``."""
    from benchmark.api import pretrain_base
    from benchmark.data.pretrain import BaseModelSpec

    spec = BaseModelSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BaseModelSpec)})
    print(f"base model written to {pretrain_base(args.corpus, args.out_dir, spec)}")
    return 0


if __name__ == "__main__":
    sys.exit(console_main())
