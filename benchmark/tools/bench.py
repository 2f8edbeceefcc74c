"""``dapbench bench``: each method's DAP update against the hardware and a plain transformers step, in one process.

For every method, on the same data and batch: seconds per update and tokens/s of the second domain's stage (the
first domain runs before it, so replay, penalties, o_prev and other terms that need an earlier domain act), model
FLOPs per update counted by ``torch.utils.flop_counter`` on one counted update, and from them the utilisation of
the peak a square GEMM reaches in the same process (MFU) and of the device's datasheet peak where known
(``mfu_spec``, the figure published MFUs use), and the update's cost in units of the runner's plain MLM
pass (``passes``: NCL's update is 1). The reference row is a plain transformers training step of the same model
(transformers' collator, masking or next-token labels by the model's kind, and its loss over every position, the same
micro-batches and accumulation, AdamW), measured in the same process: ``vs_plain`` is a method's tokens/s over that
step's. ``--trace DIR`` adds a ``torch.profiler`` record of a few of each method's updates (:func:`trace_updates`):
where the step spends its time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmark.acceleration.fused import fused_adamw
from benchmark.config import RunConfig
from benchmark.data.inputs import RunData, prepare_data
from benchmark.engine.environment import cpu_model, make_accelerator
from benchmark.engine.runner import ContinualRun
from benchmark.families import MASKED_LM

BENCH_SCHEMA = 1
"""Version of the JSON ``dapbench bench --save`` writes under ``results/bench/``."""


def bench(
    config: RunConfig,
    methods: list[str],
    updates: int,
    seed: int = 0,
    trace_dir: Path | None = None,
    warmup: int = 0,
    finetune: bool = False,
) -> dict[str, Any]:
    """The bench report of ``methods`` (``updates`` timed updates each, after ``warmup`` untimed ones) on the first
    two domains of ``config``; with ``trace_dir``, a profiler record of each method's updates there
    (:func:`trace_updates`); with ``finetune``, the fine-tuning update's report instead (:func:`finetune_bench`)."""
    if finetune:
        return finetune_bench(config, updates, warmup)
    _count_cpu_attention()
    with tempfile.TemporaryDirectory() as work:
        # Each stage a bench runs still evaluates its model on held-out text, which the bench does not measure: two
        # chunks per set (drift needs two inputs) keep that from dominating its wall time at paper scale.
        dap = dataclasses.replace(config.dap, steps=updates, log_every=updates, heldout_chunks=2, feature_chunks=2)
        cfg = dataclasses.replace(config, work_dir=work, matrix="final", dap=dap)
        data = prepare_data(cfg)
        data = dataclasses.replace(data, domains=data.domains[:2])
        accelerator = make_accelerator(cfg)
        device, precision = accelerator.device, accelerator.mixed_precision
        peak = gemm_peak(device, _dtype(precision))
        plain = plain_step(cfg, data, updates, accelerator)
        share = encoder_share(cfg, data, device)  # of the base model: the same for every method's bound
        rows = {name: method_step(cfg, data, name, seed, share, trace_dir, warmup) for name in methods}
        unit = rows["ncl"]["flops_per_update"] if "ncl" in rows else mlm_update_flops(cfg, data, seed, share)
    for row in [plain, *rows.values()]:
        _derive(row, peak, unit, plain)
    report = {
        "schema": BENCH_SCHEMA,
        "device": device_name(device),
        "precision": precision,
        "torch_threads": torch.get_num_threads(),
        "model": _portable(config.model),
        "model_kind": data.family.name,
        "compiled": cfg.dap.compile,
        "activation_checkpointing": cfg.dap.activation_checkpointing,
        "flush_denormals": cfg.dap.flush_denormals,
        "micro_batch": cfg.dap.per_device_batch_size,
        "global_batch": cfg.dap.batch_size,
        "seq_len": cfg.dap.seq_len,
        "timed_updates": updates,
        "warmup_updates": warmup,
        "gemm_peak_tflops": round(peak / 1e12, 4),
        "mlm_pass_gflops": round(unit / 1e9, 3),
        "plain_transformers": plain,
        "methods": rows,
    }
    return with_spec_peak(report)


def method_step(
    cfg: RunConfig,
    data: RunData,
    name: str,
    seed: int,
    share: float,
    trace_dir: Path | None = None,
    warmup: int = 0,
) -> dict[str, Any]:
    """A method's second-domain stage: its timing and peak memory, FLOPs of one counted update, its declared bound
    given the encoder's ``share`` of an MLM update, and (with ``trace_dir``) a profiler record of a few updates.

    With ``warmup`` 0 the time is the stage's (its first update's one-off work included: loader start, allocation,
    compilation); otherwise the stage runs ``warmup`` more updates first and only the later ones are timed, from
    the end of one update to the end of the last (:class:`UpdateClock`), as the plain step is timed."""
    clock = UpdateClock()
    make = (lambda run: clock.around(run)) if warmup else (lambda _: contextlib.nullcontext())
    timed, stats, _ = _second_stage(cfg, data, name, seed, cfg.dap.steps + warmup, make)
    if timed is None:
        return {"trains": False}
    if warmup:
        seconds = clock.seconds_per_update(after=warmup)
        tokens = cfg.dap.batch_size * cfg.dap.seq_len
        stats = {**stats, "step_seconds": round(seconds, 4), "tokens_per_second": round(tokens / seconds, 1)}
    # FLOPs are counted with eager blocks: compiling changes no arithmetic, and under a dispatch mode a compiled,
    # checkpointed block's recompute can pick another compiled variant than its forward (torch's CheckpointError).
    eager = dataclasses.replace(cfg, dap=dataclasses.replace(cfg.dap, compile=False))
    counted, _, counter = _second_stage(eager, data, name, seed, 1, lambda _: FlopCounterMode(display=False))
    row = {
        "trains": True,
        "step_seconds": stats["step_seconds"],
        "tokens_per_second": stats["tokens_per_second"],
        "flops_per_update": counter.get_total_flops(),
        "bound_passes": counted.method.flop_bound(share),
        "peak_memory_mb": stats["peak_memory_mb"],
    }
    if trace_dir is not None:
        row["trace"] = trace_updates(cfg, data, name, seed, trace_dir)
    return row


def _on_cuda(run: ContinualRun) -> bool:
    return run.parts.accelerator.device.type == "cuda"


class UpdateClock:
    """The end of every update of a stage, marked after its optimizer step (a CUDA event on a GPU, recorded without a
    host sync; the host clock elsewhere), so that the time of the updates after the first few can be read."""

    def __init__(self):
        self.marks: list = []
        self.cuda = False

    @contextlib.contextmanager
    def around(self, run: ContinualRun):
        """Mark the end of every update of ``run``'s stage while inside."""
        self.cuda = _on_cuda(run)
        method = run.method
        original = method.after_optimizer_step

        def marked(ctx) -> None:
            original(ctx)
            self.mark()

        method.after_optimizer_step = marked  # an instance attribute shadows the method for this stage only
        try:
            yield self
        finally:
            del method.after_optimizer_step

    def mark(self) -> None:
        """Mark the end of an update now (a fine-tune's ``after_update``)."""
        self.marks.append(self._now())

    def seconds_per_update(self, after: int) -> float:
        """Mean seconds of the updates after the first ``after`` (from the end of update ``after`` to the last's)."""
        if len(self.marks) <= after:
            raise ValueError(f"{len(self.marks)} updates marked: none after the first {after}")
        first, last = self.marks[after - 1], self.marks[-1]
        if self.cuda:
            last.synchronize()
            return first.elapsed_time(last) / 1000 / (len(self.marks) - after)
        return (last - first) / (len(self.marks) - after)

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event


def finetune_bench(config: RunConfig, updates: int, warmup: int) -> dict[str, Any]:
    """The end-task fine-tuning update of ``config``'s settings (protocol batch and length, precision, kernels), plain
    and through compiled blocks (``finetune.compile``), in one process: seconds per update after ``warmup`` untimed
    ones (allocation, compilation), on the first domain's end task from the base model, its examples in their order.
    On a GPU at ``gpu-small``'s budget a run's 6 to 21 fine-tunes are most of its time, and host-bound."""
    from benchmark.modeling import classifier_from_checkpoint
    from benchmark.protocols.finetune import FineTune, finetune_and_evaluate

    with tempfile.TemporaryDirectory() as work:
        cfg = dataclasses.replace(config, work_dir=work)
        data = prepare_data(cfg)
        accelerator = make_accelerator(cfg)
        task = data.tasks[data.domains[0]]
        size = (warmup + updates) * cfg.finetune.batch_size
        train = (task.train * math.ceil(size / len(task.train)))[:size]  # exactly warmup + updates full batches
        test = task.test[: cfg.finetune.eval_batch_size]
        timed = dataclasses.replace(task, train=train, test=test, test_labels=task.test_labels[: len(test)])
        rows = {}
        for compiled in (False, True):
            ft = FineTune().settings_of(
                dataclasses.replace(cfg.finetune, epochs={}, default_epochs=1.0, epoch_scale=1.0, compile=compiled)
            )
            clock = UpdateClock()
            clock.cuda = accelerator.device.type == "cuda"
            torch.manual_seed(0)
            model = classifier_from_checkpoint(cfg.model, task.num_labels)
            clock.mark()  # the start: without a warm-up the first update's one-off work (compiling) is timed too
            finetune_and_evaluate(model, timed, data.tokenizer, ft, 0, accelerator, after_update=clock.mark)
            seconds = clock.seconds_per_update(after=warmup + 1)
            rows["compiled" if compiled else "eager"] = {
                "step_seconds": round(seconds, 5),
                "examples_per_second": round(cfg.finetune.batch_size / seconds, 1),
            }
    return {
        "schema": BENCH_SCHEMA,
        "kind": "finetune",
        "device": device_name(accelerator.device),
        "precision": accelerator.mixed_precision,
        "deterministic": cfg.dap.deterministic and accelerator.device.type == "cuda",
        "torch_threads": torch.get_num_threads(),
        "model": _portable(config.model),
        "task": task.name,
        "batch_size": cfg.finetune.batch_size,
        "max_length": cfg.finetune.max_length,
        "timed_updates": updates,
        "warmup_updates": warmup,
        "rows": rows,
        "compiled_speedup": round(rows["eager"]["step_seconds"] / rows["compiled"]["step_seconds"], 3),
    }


def finetune_table(report: dict[str, Any]) -> str:
    """A fine-tuning bench report (:func:`finetune_bench`) as a markdown table."""
    lines = [
        f"fine-tuning {report['task']}, batch {report['batch_size']} x <= {report['max_length']} tokens, "
        f"{report['precision']}, {report['device']}",
        "",
        "| blocks | s / update | examples/s |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {r['step_seconds']:.4f} | {r['examples_per_second']:.1f} |" for k, r in report["rows"].items()]
    return "\n".join([*lines, "", f"compiled blocks: {report['compiled_speedup']:.2f}x the eager update"])


TRACE_UPDATES = 3
"""Updates of the second stage a ``--trace`` records (the first carries the stage's one-off work: read it apart)."""


def trace_updates(cfg: RunConfig, data: RunData, name: str, seed: int, out: Path) -> dict[str, Any]:
    """A ``torch.profiler`` record of :data:`TRACE_UPDATES` updates of ``name``'s second stage (CPU activity, and
    CUDA kernels on a GPU): ``out/<name>.trace.json`` (Chrome trace; open in Perfetto) and ``out/<name>-ops.txt``
    (operators by self time). Returns the file names and the five operators with the largest share of self time."""
    from torch.profiler import ProfilerActivity, profile

    def profiler(run: ContinualRun):
        return profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if _on_cuda(run) else [])])

    run, _, profiler = _second_stage(cfg, data, name, seed, TRACE_UPDATES, profiler)
    gpu = _on_cuda(run)
    out.mkdir(parents=True, exist_ok=True)
    profiler.export_chrome_trace(str(out / f"{name}.trace.json"))
    key = "self_device_time_total" if gpu else "self_cpu_time_total"
    ops = profiler.key_averages()
    (out / f"{name}-ops.txt").write_text(ops.table(sort_by=key, row_limit=40), encoding="utf-8")
    total = sum(getattr(op, key) for op in ops) or 1
    top = sorted(ops, key=lambda op: getattr(op, key), reverse=True)[:5]
    return {
        "updates": TRACE_UPDATES,
        "files": [f"{name}.trace.json", f"{name}-ops.txt"],
        "self_time": "device" if gpu else "cpu",
        "top_ops": {op.key: round(getattr(op, key) / total, 3) for op in top},
    }


def _second_stage(cfg: RunConfig, data: RunData, name: str, seed: int, updates: int, make: Callable) -> tuple:
    """A fresh run of ``name`` with ``updates`` updates per stage whose second stage's updates run inside the context
    ``make(run)`` returns: the run, the stage's statistics and that context, after the stage (three Nones for a
    method that does not train)."""
    short = dataclasses.replace(cfg, dap=dataclasses.replace(cfg.dap, steps=updates, log_every=updates))
    from benchmark.registry import default_registry

    run = ContinualRun(short, data, default_registry().get(name), seed, show_progress=False)
    if not run.schedule.trains():
        return None, None, None
    run.stages.run(0)
    instrument = make(run)
    run.stages.instrument = lambda: instrument
    return run, run.stages.run(1), instrument


def encoder_share(cfg: RunConfig, data: RunData, device: torch.device | None = None) -> float:
    """The encoder's (a decoder's: the transformer body's) share of the FLOPs of the plain LM update (forward and
    backward) of the base model on one training micro-batch; the rest is the LM head on the predicted tokens. Counted
    on ``device`` (the CPU by default): the count is the same on any device, a GPU's is a second instead of 19 at the
    paper's shape."""
    from benchmark.data.masking import table_rows
    from benchmark.data.sampling import SeededMasking
    from benchmark.modeling import encoder_of, load_lm, mlm_loss

    device = device or torch.device("cpu")
    model, _ = load_lm(cfg.model)
    model.to(device)
    train = data.corpora[data.domains[0]].train
    micro = min(cfg.dap.per_device_batch_size, len(train))
    masking = SeededMasking(data.tokenizer, cfg.dap.mlm_probability, 0, 0, family=data.family)
    _, batch = masking([(0, row) for row in table_rows(train, 0, micro)])
    batch = {k: v.to(device) for k, v in batch.items()}
    encoder = encoder_of(model)

    def counted(loss) -> int:
        with FlopCounterMode(display=False) as counter:
            loss().backward()
        return counter.get_total_flops()

    whole = counted(lambda: mlm_loss(model, batch))
    alone = counted(
        lambda: encoder(input_ids=batch["input_ids"]).last_hidden_state.sum()  # full chunks: no attention mask
    )
    return alone / whole


def plain_step(cfg: RunConfig, data: RunData, updates: int, accelerator) -> dict[str, Any]:
    """A plain transformers training step of the base model: ``DataCollatorForLanguageModeling`` (masking for a
    masked LM, next-token labels for a causal one), the model's own loss (logits at every position), AdamW (fused on
    CUDA, like the DAP step), the run's micro-batches, accumulation and mixed precision; the first update is a
    warm-up and not timed."""
    from transformers import DataCollatorForLanguageModeling

    from benchmark.engine.environment import peak_memory_mb, reset_peak_memory
    from benchmark.modeling import load_lm

    dap, tokenizer = cfg.dap, data.tokenizer
    model, _ = load_lm(cfg.model)
    fused = fused_adamw(accelerator.device, accelerator.mixed_precision) or None
    optimizer = torch.optim.AdamW(model.parameters(), lr=dap.lr, fused=fused)
    model, optimizer = accelerator.prepare(model, optimizer)
    # transformers' collator knows the two built-in families: masking for the masked one, next tokens otherwise
    collate = DataCollatorForLanguageModeling(
        tokenizer, mlm=data.family is MASKED_LM, mlm_probability=dap.mlm_probability
    )
    train = data.corpora[data.domains[0]].train
    micro, accum = dap.per_device_batch_size, max(1, dap.batch_size // dap.per_device_batch_size)
    chunks = [{"input_ids": train[i % len(train)]["input_ids"]} for i in range(micro * accum)]
    batches = [collate(chunks[j * micro : (j + 1) * micro]) for j in range(accum)]
    batches = [{k: v.to(accelerator.device) for k, v in b.items()} for b in batches]

    def update() -> None:
        for batch in batches:
            with accelerator.autocast():
                loss = model(**batch).loss
            accelerator.backward(loss / accum)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model.train()
    update()  # warm-up: allocation, kernel selection
    reset_peak_memory()
    with FlopCounterMode(display=False) as counter:
        update()
    _synchronise(accelerator.device)
    start = time.perf_counter()
    for _ in range(updates):
        update()
    _synchronise(accelerator.device)
    seconds = (time.perf_counter() - start) / updates
    tokens = micro * accum * dap.seq_len
    return {
        "step_seconds": round(seconds, 4),
        "tokens_per_second": round(tokens / seconds, 1),
        "flops_per_update": counter.get_total_flops(),
        "peak_memory_mb": peak_memory_mb(),
    }


def mlm_update_flops(cfg: RunConfig, data: RunData, seed: int, share: float) -> int:
    """FLOPs of one update of the runner's plain MLM (NCL's update): the unit of ``passes``."""
    return method_step(cfg, data, "ncl", seed, share)["flops_per_update"]


def gemm_peak(device: torch.device, dtype: torch.dtype, size: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of the fastest of ``repeats`` square matrix products (8192 on a GPU, 2048 on a CPU) in ``dtype``."""
    size = size or (8192 if device.type == "cuda" else 2048)
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    a @ b  # warm-up
    best = math.inf
    for _ in range(repeats):
        _synchronise(device)
        start = time.perf_counter()
        a @ b
        _synchronise(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def device_name(device: torch.device) -> str:
    """The accelerator's marketing name, or the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def device_slug(name: str) -> str:
    """A file-name form of a device name (``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def report_file_name(report: dict[str, Any], profile: str) -> str:
    """Where ``dapbench bench --save`` puts ``report``: ``<device>-<profile>.json``, with ``-causal`` for a decoder,
    ``-b<N>`` / ``-mb<N>`` for a global / per-device batch other than the profile's, ``-compiled`` for compiled
    blocks and ``-checkpointed`` for activation checkpointing, so the reports of one device and profile never
    overwrite each other."""
    from benchmark.config import profile_config

    dap = profile_config(profile).dap
    parts = [device_slug(report["device"]), profile]
    if report.get("kind") == "finetune":
        return "-".join([*parts, "finetune"]) + ".json"
    parts += ["causal"] if report.get("model_kind") == "causal" else []
    parts += [f"b{report['global_batch']}"] if report.get("global_batch", dap.batch_size) != dap.batch_size else []
    micro = report.get("micro_batch", dap.per_device_batch_size)
    parts += [f"mb{micro}"] if micro != dap.per_device_batch_size else []
    parts += ["compiled"] if report.get("compiled") else []
    parts += ["checkpointed"] if report.get("activation_checkpointing") else []
    parts += ["flushed"] if report.get("flush_denormals") else []
    return "-".join(parts) + ".json"


def markdown_table(report: dict[str, Any]) -> str:
    """The bench report as a markdown table, one row per method and the plain step last; MFU against the GEMM rate
    measured in the same process and against the device's datasheet peak ("MFU (spec)", where known)."""
    lines = [
        "| method | s / update | tokens/s | GFLOP / update | passes | bound | passes / bound | MFU | MFU (spec)"
        " | peak MB | vs plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in [*report["methods"].items(), ("plain transformers step", report["plain_transformers"])]:
        if not row.get("trains", True):
            lines.append(f"| {name} | (no DAP) | | | | | | | | | |")
            continue
        bound = row.get("bound_passes")
        lines.append(
            f"| {name} | {row['step_seconds']:.4f} | {row['tokens_per_second']:.0f} | "
            f"{row['flops_per_update'] / 1e9:.2f} | {row['passes']:.2f} | {_or_dash(bound, '.2f')} | "
            f"{_or_dash(row.get('vs_bound'), '.2f')} | {row['mfu']:.1%} | {_or_dash(row.get('mfu_spec'), '.1%')} | "
            f"{row['peak_memory_mb']:.0f} | "
            f"{row['vs_plain']:.2f} |"
        )
    return "\n".join(lines)


SPEC_PEAK_TFLOPS = {
    "NVIDIA H100 80GB HBM3": 989.4,
    "NVIDIA H200": 989.4,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
}
"""Dense 16-bit (bf16/fp16) tensor-core peaks from the vendors' datasheets (SXM parts), by the name torch reports:
the figure published MFUs are read against (the GEMM rate a bench measures is below it: 741-772 TFLOP/s on an
H200)."""


def with_spec_peak(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with ``spec_peak_tflops`` and every row's ``mfu_spec`` (its FLOP rate over the datasheet peak of
    the device at the report's precision; None where :data:`SPEC_PEAK_TFLOPS` does not know the device or the
    precision is not 16-bit). Also fills a report saved before these fields existed."""
    known = report["precision"] in ("bf16", "fp16") and report["device"] in SPEC_PEAK_TFLOPS
    spec = SPEC_PEAK_TFLOPS[report["device"]] if known else None
    report["spec_peak_tflops"] = spec
    for row in [report["plain_transformers"], *report["methods"].values()]:
        if row.get("trains", True):
            rate = row["flops_per_update"] / row["step_seconds"]
            row["mfu_spec"] = round(rate / (spec * 1e12), 4) if spec else None
    return report


def _derive(row: dict[str, Any], peak: float, unit: int, plain: dict[str, Any]) -> None:
    if not row.get("trains", True):
        return
    row["passes"] = round(row["flops_per_update"] / unit, 3)
    bound = row.get("bound_passes")
    row["vs_bound"] = round(row["passes"] / bound, 3) if bound else None
    row["mfu"] = round(row["flops_per_update"] / row["step_seconds"] / peak, 4)
    row["vs_plain"] = round(row["tokens_per_second"] / plain["tokens_per_second"], 3)


def _or_dash(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _dtype(precision: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _portable(model: str) -> str:
    """A hub id as given; a local model directory by its name only (no machine paths in committed files)."""
    return Path(model).name if Path(model).exists() else model


def _count_cpu_attention() -> None:
    """Give torch's FLOP counter a formula for the CPU flash-attention kernel (sdpa on a CPU), which it lacks:
    the FLOPs are those of the same attention on a GPU kernel (two batched products forward, four backward)."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    forward = aten._scaled_dot_product_flash_attention_for_cpu
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward
    if forward in flop_counter.flop_registry:
        return

    def attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    def attention_backward(grad_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_backward_flop_count(grad_shape, query_shape, key_shape, value_shape)

    flop_counter.register_flop_formula(forward)(attention)
    flop_counter.register_flop_formula(backward)(attention_backward)
