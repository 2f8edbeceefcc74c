"""The ``dapbench`` command line: run, report, list, pretrain-base."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
from pathlib import Path

from benchmark.config import RunConfig, apply_overrides, profile_config
from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_json, path_inside, safe_name


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dapbench`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    _quiet_libraries()
    previous = signal.signal(signal.SIGTERM, _terminated) if _main_thread() else None
    try:
        return args.func(args)
    except DapbenchError as exc:
        print(f"dapbench: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, _Terminated) as exc:
        # Every finished domain and fine-tune is already on disk (atomic writes); the unfinished unit is redone.
        code = 143 if isinstance(exc, _Terminated) else 130
        print(
            f"dapbench: {'terminated' if code == 143 else 'interrupted'}; finished domains and fine-tunes are kept:"
            " run the same command again to resume",
            file=sys.stderr,
        )
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class _Terminated(Exception):
    """SIGTERM, turned into an exception so that the run stops like on Ctrl-C (cluster schedulers send it)."""


def _terminated(signum, frame) -> None:
    raise _Terminated


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dapbench", description=__doc__)
    sub = parser.add_subparsers(required=True, dest="command")

    run = sub.add_parser("run", help="pre-train through a domain sequence, fine-tune, write records")
    _add_run_arguments(run)
    run.set_defaults(func=cmd_run)

    bench = sub.add_parser("bench", help="DAP step time per method (ratios to the first method)")
    _add_run_arguments(bench)
    bench.add_argument("--steps", type=int, default=20, help="timed updates per method")
    bench.set_defaults(func=cmd_bench)

    similarity = sub.add_parser("importance-similarity", help="cosine of DAS's general importance across domains")
    _add_run_arguments(similarity)
    similarity.set_defaults(func=cmd_importance_similarity)

    stability = sub.add_parser(
        "importance-stability", help="split-half rank stability of DAS's importance per probe size"
    )
    _add_run_arguments(stability)
    stability.add_argument("--chunks", default="64,256", help="probe sizes (chunks) to compare, comma-separated")
    stability.set_defaults(func=cmd_importance_stability)

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
    run.add_argument("--sequence", help="seq0..seq4 or a comma-separated list of domains")
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


def _base_spec_cls():
    from benchmark.pretrain import BaseModelSpec

    return BaseModelSpec


def _quiet_libraries() -> None:
    """Hide load reports and per-file progress bars of transformers/datasets (not our progress)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def resolve_run_config(args: argparse.Namespace) -> RunConfig:
    """Profile defaults <- command-line flags <- ``--set`` overrides, validated."""
    config = profile_config(args.profile)
    flags = {
        "model": args.model,
        "data_root": args.data_root,
        "general_heldout": args.general_heldout,
        "sequence": args.sequence,
        "matrix": args.matrix,
        "output_dir": args.output_dir,
        "device": args.device,
        "work_dir": args.work_dir or str(Path(args.output_dir) / ".dapbench"),
        "methods": tuple(m.strip() for m in args.methods.split(",") if m.strip()) if args.methods else None,
        "seeds": _parse_seeds(args.seeds) if args.seeds else None,
    }
    config = dataclasses.replace(config, **{k: v for k, v in flags.items() if v is not None})
    config = apply_overrides(config, args.set)
    _validate(config)
    return config


def _parse_seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError as exc:
        raise DapbenchError(f"--seeds {text!r} is not a list of integers", "write e.g. --seeds 2021,111,222") from exc


def _validate(config: RunConfig) -> None:
    """Every check that needs no data: methods, their options, the matrix mode, the DAP budget, seeds."""
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
    registry.get(name).config_cls.from_options(options)


def cmd_run(args: argparse.Namespace) -> int:
    """``dapbench run``."""
    from benchmark.report import write_report
    from benchmark.runner import ContinualRun, prepare_data

    config = _prepared(args)
    _preflight(config)
    data = prepare_data(config)
    records = []
    for method in config.methods:
        for seed in config.seeds:
            run = ContinualRun(config, data, method, seed, show_progress=not args.quiet)
            path = path_inside(config.output_dir, "results", config.profile, f"{run.run_id}.json")
            with _run_lock(run.root) as locked:
                if not locked:
                    print(f"{method} seed {seed}: in progress in another process, skipped (its record lands in {path})")
                    continue
                record = _finished_record(path)
                if record is not None:  # a finished run is not redone, rewritten or counted again
                    print(f"{method} seed {seed}: complete, kept {path} (delete it to run again)")
                else:
                    record = run.execute()
                    atomic_write_json(path, record)
                    print(f"{method} seed {seed}: {_one_line(record)} -> {path}")
            records.append(record)
    if not records:  # every run was in progress elsewhere: that process writes records and leaderboard
        return 0
    write_report(config.output_dir)
    print(_synthetic_reading(records) if config.profile == "synthetic" else "")
    print(f"leaderboard: {Path(config.output_dir) / 'leaderboard.md'}")
    return 0


def _preflight(config: RunConfig) -> None:
    """What would otherwise fail after training: an unwritable output folder, a corrupt record already under
    ``results/`` (the leaderboard is rebuilt from all of them), a model directory that is missing or truncated."""
    import tempfile

    from benchmark.data import require_data_root
    from benchmark.modeling import check_model_files
    from benchmark.report import load_records

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
    check_model_files(config.model)


@contextlib.contextmanager
def _run_lock(run_root: Path):
    """Yield True while this process holds the run directory's lock, False (at once) if another one does:
    two commands over overlapping grids in one folder never train the same run twice at the same time."""
    from filelock import FileLock, Timeout

    run_root.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(run_root) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def _finished_record(path: Path) -> dict | None:
    """The complete record already at ``path`` (same run id, so the same configuration), else None."""
    from benchmark.io import read_json

    if not path.is_file():
        return None
    record = read_json(path, "run record")
    return record if isinstance(record, dict) and record.get("status") == "complete" else None


def _one_line(record: dict) -> str:
    s = record["summary"]
    parts = [f"final acc {100 * s['acc']['final']:.1f}", f"final MF1 {100 * s['macro_f1']['final']:.1f}"]
    if s["acc"]["forgetting"] is not None:
        parts.append(f"forgetting(acc) {100 * s['acc']['forgetting']:.1f}")
    return ", ".join(parts)


def _synthetic_reading(records: list[dict]) -> str:
    """The two questions the synthetic profile is built to answer, from this run's records."""
    by_method: dict[str, list[dict]] = {}
    for record in records:
        by_method.setdefault(record["method"], []).append(record)

    def mean(method: str, metric: str, key: str) -> float | None:
        values = [r["summary"][metric][key] for r in by_method.get(method, [])]
        return None if not values or None in values else 100 * sum(values) / len(values)

    lines = []
    one, none = mean("one", "acc", "final"), mean("none", "acc", "final")
    if one is not None and none is not None:
        verdict = "DAP helps" if one > none else "DAP does not help"
        lines.append(f"synthetic: one {one:.1f} vs none {none:.1f} final acc -> {verdict} ({one - none:+.1f})")
    for record in by_method.get("ncl", [])[:1]:
        losses = record["mlm_loss"]
        if "general" in losses["columns"]:
            base, after = losses["base"]["general"], losses["after_domain"][-1]["general"]
            lines.append(
                f"synthetic: general held-out MLM loss {base:.2f} (base) -> {after:.2f} after NCL's last domain"
            )
    forgetting = mean("ncl", "acc", "forgetting")
    if forgetting is not None:
        verdict = "NCL forgets" if forgetting > 0 else "NCL does not forget"
        lines.append(f"synthetic: NCL forgetting rate (acc) {forgetting:.1f} points -> {verdict}")
    return "\n".join(lines)


def _materialise_synthetic(config: RunConfig, show_progress: bool) -> RunConfig:
    """Generate the synthetic data and pre-train its tiny base model once (cached in the work dir)."""
    from benchmark.synthetic import VERSION, build_world, pretrain_synthetic_base, write_world

    root = Path(config.work_dir) / f"synthetic-v{VERSION}"
    data_root, model_dir = root / "data", root / "base-model"
    if not data_root.exists():
        write_world(build_world(seed=0), data_root)
    if not model_dir.exists():
        print("synthetic: pre-training the tiny base model on the general corpus (once)")
        pretrain_synthetic_base(data_root, model_dir, show_progress=show_progress)
    return dataclasses.replace(
        config,
        model=str(model_dir),
        data_root=str(data_root),
        general_heldout=str(data_root / "general_heldout.txt"),
        general_corpus=str(data_root / "general.txt"),
    )


def cmd_bench(args: argparse.Namespace) -> int:
    """``dapbench bench``: seconds per DAP update of each method on the same data."""
    import json

    from benchmark.bench import step_times

    config = _prepared(args)
    print(json.dumps(step_times(config, list(config.methods), args.steps), indent=2))
    return 0


def cmd_importance_similarity(args: argparse.Namespace) -> int:
    """``dapbench importance-similarity``."""
    import json

    from benchmark.bench import importance_similarity

    print(json.dumps(importance_similarity(_prepared(args)), indent=2))
    return 0


def cmd_importance_stability(args: argparse.Namespace) -> int:
    """``dapbench importance-stability``."""
    import json

    from benchmark.bench import importance_stability

    try:
        sizes = tuple(int(n) for n in args.chunks.split(","))
    except ValueError as exc:
        raise DapbenchError(
            f"--chunks {args.chunks!r} is not a list of integers", "write e.g. --chunks 64,256"
        ) from exc
    print(json.dumps(importance_stability(_prepared(args), sizes), indent=2))
    return 0


def _prepared(args: argparse.Namespace) -> RunConfig:
    config = resolve_run_config(args)
    if config.profile == "synthetic" and config.model == "synthetic":
        config = _materialise_synthetic(config, show_progress=not args.quiet)
    return config


def cmd_reproduce(args: argparse.Namespace) -> int:
    """``dapbench reproduce``: exit 0 if every number matches within tolerance, 1 otherwise."""
    from benchmark.io import read_json
    from benchmark.reproduce import (
        DEFAULT_TOLERANCE,
        Tolerance,
        check_data,
        compare_records,
        cpu_threads,
        key_numbers,
        largest_differences,
        recorded_cpu_threads,
        reproduction_config,
    )
    from benchmark.runner import ContinualRun, prepare_data

    record = read_json(args.record, "run record")
    if not isinstance(record, dict) or record.get("status") != "complete" or "config" not in record:
        raise DapbenchError(f"{args.record} is not a complete run record", "pass a JSON file from results/")
    threads = args.threads if args.threads is not None else recorded_cpu_threads(record)
    if threads is not None and threads < 1:
        raise DapbenchError(f"--threads must be >= 1, got {threads}", "pass a positive thread count")
    out = args.output_dir or str(Path("reproduce") / safe_name(record["run_id"], "record run id"))
    paths = {name: getattr(args, name) for name in ("model", "data_root", "general_heldout", "general_corpus")}
    config = apply_overrides(reproduction_config(record, out, paths), args.set)
    if config.profile == "synthetic" and not Path(config.model).exists():
        config = _materialise_synthetic(config, show_progress=not args.quiet)
    # The record's thread count by default: float summation order, hence the numbers, depend on it.
    with cpu_threads(threads) if threads else contextlib.nullcontext():
        data = prepare_data(config)
        check_data(record, data.checksums)
        run = ContinualRun(config, data, record["method"], record["seed"], show_progress=not args.quiet)
        new = run.execute()
    path = Path(out) / "results" / config.profile / f"{run.run_id}.json"
    atomic_write_json(path, new)
    tolerance = Tolerance(
        score=DEFAULT_TOLERANCE.score if args.score_tolerance is None else args.score_tolerance,
        loss=DEFAULT_TOLERANCE.loss if args.loss_tolerance is None else args.loss_tolerance,
    )
    mismatches = compare_records(record, new, tolerance)
    compared = len(set(key_numbers(record)) | set(key_numbers(new)))
    print(f"reproduced {record.get('method_label', record['method'])} seed {record['seed']} -> {path}")
    if threads:
        print(f"CPU threads: {threads} (the record's: {recorded_cpu_threads(record)})")
    print(f"{compared} numbers compared, {len(mismatches)} outside tolerance {tolerance}")
    for kind, (name, diff) in largest_differences(record, new).items():
        print(f"  largest {kind} difference: {diff:.5f} ({name})")
    for mismatch in mismatches:
        print(f"  {mismatch}")
    return 1 if mismatches else 0


def cmd_report(args: argparse.Namespace) -> int:
    """``dapbench report``."""
    from benchmark.report import write_report

    counts = write_report(args.output_dir)
    print(
        f"report: {counts['records']} records -> {counts['files']} files; "
        f"leaderboard: {Path(args.output_dir) / 'leaderboard.md'}"
    )
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
        print(f"  {name:12s} {doc}")
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
    sys.exit(main())
