"""``dapbench bench``: FLOPs counted against a hand count, and the report on a tiny model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from benchmark.errors import DapbenchError


def test_counted_flops_of_an_mlm_update_equal_the_hand_count(tiny_model):
    """Forward matmul FLOPs per layer and token: 8 d^2 (Q, K, V, O) + 4 d f (feed-forward) + 4 L d (scores and
    weighted sum); the head on the M masked tokens: 2 d^2 + 2 d V. The backward of a product is twice its forward
    (gradients of input and weight); attention's backward is 2.5 times, as torch counts a fused kernel's (five
    products: the scores are recomputed). CPU attention is counted through the formula ``benchmark.tools.bench``
    registers."""
    from benchmark.modeling import load_lm, mlm_loss
    from benchmark.tools.bench import _count_cpu_attention

    _count_cpu_attention()
    model, tokenizer = load_lm(str(tiny_model))
    c = model.config
    d, f, layers, vocab = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    batch_size, length = 3, 16
    ids = torch.randint(5, vocab, (batch_size, length))
    positions = torch.tensor([1, 5, 17, 30, 44])
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "mlm_positions": positions,
        "mlm_targets": ids.reshape(-1)[positions],
    }
    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        mlm_loss(model, batch).backward()
    tokens, masked = batch_size * length, positions.numel()
    products = tokens * layers * (8 * d * d + 4 * d * f) + masked * (2 * d * d + 2 * d * vocab)
    attention = tokens * layers * 4 * length * d
    assert counter.get_total_flops() == 3 * products + attention + 2.5 * attention


def test_the_bench_report_measures_every_method_against_the_plain_step(tiny_config, tmp_path):
    from benchmark.tools.bench import bench, device_slug, markdown_table

    config = dataclasses.replace(tiny_config, dap=dataclasses.replace(tiny_config.dap, steps=2))
    report = bench(config, ["ncl", "das", "none"], updates=2)
    ncl, das = report["methods"]["ncl"], report["methods"]["das"]
    assert ncl["passes"] == 1.0  # NCL's update is the unit
    # DAS adds the two dropout views and the o_prev view of its contrastive term: more than one pass, each
    # encoder-only view cheaper than the MLM pass with its head.
    assert 2.0 < das["passes"] < 4.0
    # Counted against the declared bounds: NCL is its own bound; DAS does the passes its bound names (MLM, two
    # views, o_prev) and nothing more, up to element-wise work the counter does not see.
    assert ncl["bound_passes"] == 1.0 and ncl["vs_bound"] == 1.0
    assert das["bound_passes"] > 2.0 and das["vs_bound"] == pytest.approx(1.0, abs=0.02)
    assert report["methods"]["none"] == {"trains": False}
    plain = report["plain_transformers"]
    assert plain["flops_per_update"] > ncl["flops_per_update"]  # logits at every position, not only masked ones
    for row in (ncl, das, plain):
        assert row["step_seconds"] > 0 and 0 < row["mfu"] < 1.5 and row["peak_memory_mb"] > 0
    assert report["gemm_peak_tflops"] > 0 and "/" not in report["model"]
    assert report["spec_peak_tflops"] is None and ncl["mfu_spec"] is None  # a CPU has no datasheet tensor peak
    table = markdown_table(report)
    assert "| das |" in table and "| none | (no DAP)" in table and "plain transformers step" in table
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    json.dumps(report)  # what --save writes


@pytest.mark.parametrize("decoder", ["tiny_gpt2", "tiny_llama"])
def test_the_bench_measures_decoders_against_a_plain_next_token_step(tiny_config, decoder, request):
    from benchmark.tools.bench import bench

    config = dataclasses.replace(
        tiny_config, model=str(request.getfixturevalue(decoder)), dap=dataclasses.replace(tiny_config.dap, steps=2)
    )
    report = bench(config, ["ncl", "das"], updates=2)
    ncl, das, plain = report["methods"]["ncl"], report["methods"]["das"], report["plain_transformers"]
    assert ncl["passes"] == 1.0 and ncl["vs_bound"] == 1.0
    # DAS within 3% of its declared bound (measured: GPT-2 1.00, the tiny Llama 0.98)
    assert 2.0 < das["passes"] < 4.0 and das["vs_bound"] == pytest.approx(1.0, abs=0.03)
    # next-token labels at every position but the last, as the DAP step: the plain step's head runs on them all too
    assert plain["flops_per_update"] == pytest.approx(ncl["flops_per_update"], rel=0.05)
    assert plain["step_seconds"] > 0 and plain["peak_memory_mb"] > 0


def test_a_trace_records_exactly_the_updates_of_the_second_stage(tiny_config, tmp_path):
    from benchmark.data.inputs import prepare_data
    from benchmark.tools.bench import TRACE_UPDATES, trace_updates

    config = dataclasses.replace(tiny_config, work_dir=str(tmp_path / "work"))
    data = prepare_data(config)
    data = dataclasses.replace(data, domains=data.domains[:2])
    info = trace_updates(config, data, "ncl", 0, tmp_path / "trace")
    events = json.loads((tmp_path / "trace" / "ncl.trace.json").read_text())["traceEvents"]
    names = [event.get("name", "") for event in events]
    # Only the stage's updates are inside the profiler: one AdamW step each, none of stage 0 or of the evaluation.
    assert sum(name.startswith("Optimizer.step#AdamW") for name in names) == TRACE_UPDATES
    assert any(name in ("aten::addmm", "aten::mm") for name in names)
    assert "Self CPU" in (tmp_path / "trace" / "ncl-ops.txt").read_text()
    assert info["files"] == ["ncl.trace.json", "ncl-ops.txt"] and info["self_time"] == "cpu"
    assert len(info["top_ops"]) == 5 and 0 < sum(info["top_ops"].values()) <= 1


def test_a_warmed_up_bench_times_only_the_updates_after_the_warmup(tiny_config, tmp_path, monkeypatch):
    from benchmark.data.inputs import prepare_data
    from benchmark.tools import bench as bench_module

    config = dataclasses.replace(tiny_config, work_dir=str(tmp_path / "work"))
    data = prepare_data(config)
    data = dataclasses.replace(data, domains=data.domains[:2])
    made = []

    class Spy(bench_module.UpdateClock):
        def __init__(self):
            super().__init__()
            made.append(self)

        def around(self, run):
            self.method = run.method
            return super().around(run)

    monkeypatch.setattr(bench_module, "UpdateClock", Spy)
    steps = dataclasses.replace(config, dap=dataclasses.replace(config.dap, steps=3))
    row = bench_module.method_step(steps, data, "ncl", 0, share=0.9, warmup=2)
    (clock,) = made
    assert len(clock.marks) == 3 + 2  # every update of the stage marked, the warm-up ones too
    expected = (clock.marks[-1] - clock.marks[1]) / 3
    assert row["step_seconds"] == round(expected, 4) > 0
    assert row["tokens_per_second"] == round(config.dap.batch_size * config.dap.seq_len / expected, 1)
    assert "after_optimizer_step" not in vars(clock.method)  # the method's own hook again after the stage
    with pytest.raises(ValueError, match="none after the first 5"):
        clock.seconds_per_update(after=5)


def test_a_bench_without_timed_updates_or_with_a_negative_warmup_is_refused(tiny_config):
    from benchmark.api import bench

    for steps, warmup in ((0, 0), (2, -1)):
        with pytest.raises(DapbenchError, match="steps >= 1 and warmup >= 0"):
            bench(tiny_config, steps, warmup=warmup)


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_gemm_peak_is_a_positive_rate(precision):
    from benchmark.tools.bench import _dtype, gemm_peak

    assert gemm_peak(torch.device("cpu"), _dtype(precision), size=128, repeats=2) > 0


def test_the_bench_command_prints_the_table_and_saves_the_report_by_device(tiny_config, tmp_path, capsys):
    from benchmark.cli import main

    inputs = ["--model", tiny_config.model, "--data-root", tiny_config.data_root, "--sequence", "alpha,beta"]
    inputs += ["--general-heldout", tiny_config.general_heldout]
    settings = ["--set", "dap.per_device_batch_size=16", "--set", "dap.steps=1"]
    args = ["bench", "--profile", "synthetic", *inputs, *settings, "--methods", "ncl", "--steps", "1", "--quiet"]
    assert main([*args, "--save", str(tmp_path / "results" / "bench")]) == 0
    (saved,) = (tmp_path / "results" / "bench").glob("*-synthetic*.json")
    report = json.loads(saved.read_text())
    assert report["methods"]["ncl"]["passes"] == 1.0 and report["timed_updates"] == 1
    assert "| ncl |" in capsys.readouterr().out
    from benchmark.records.store import load_records

    assert load_records(tmp_path / "results") == []  # results/bench/ holds bench reports, not run records


@pytest.mark.parametrize(
    ("kind", "compiled", "checkpointed", "micro", "name"),
    [
        ("masked", False, False, 62, "nvidia-h100-80gb-hbm3-paper.json"),
        ("causal", False, False, 62, "nvidia-h100-80gb-hbm3-paper-causal.json"),
        ("masked", True, False, 62, "nvidia-h100-80gb-hbm3-paper-compiled.json"),
        ("masked", False, True, 124, "nvidia-h100-80gb-hbm3-paper-mb124-checkpointed.json"),
        ("causal", True, True, 248, "nvidia-h100-80gb-hbm3-paper-causal-mb248-compiled-checkpointed.json"),
    ],
)
def test_saved_reports_of_one_device_and_profile_do_not_overwrite_each_other(kind, compiled, checkpointed, micro, name):
    """Every switch and a micro-batch other than the profile's (the paper's 4 x 62) name the file."""
    from benchmark.tools.bench import report_file_name

    report = {"device": "NVIDIA H100 80GB HBM3", "model_kind": kind, "compiled": compiled}
    report.update(activation_checkpointing=checkpointed, micro_batch=micro, global_batch=248)
    assert report_file_name(report, "paper") == name
    other_global = report_file_name({**report, "global_batch": 496}, "paper")
    assert "-b496" in other_global and other_global.replace("-b496", "") == name


@pytest.mark.slow
def test_compiled_checkpointed_das_is_counted_as_its_eager_arithmetic(tiny_config):
    """Compiled blocks under activation checkpointing: the counted update runs eager (under the counter's dispatch
    mode a compiled block's recompute could pick another compiled variant than its forward: torch's CheckpointError
    on a CPU rehearsal of the GPU bench), and compiling changes no FLOPs."""
    from benchmark.tools.bench import bench

    def report(compiled: bool) -> dict:
        dap = dataclasses.replace(tiny_config.dap, steps=1, compile=compiled, activation_checkpointing=True)
        return bench(dataclasses.replace(tiny_config, dap=dap), ["das"], updates=1)

    compiled, eager = report(True), report(False)
    assert compiled["compiled"] and compiled["activation_checkpointing"]
    assert compiled["methods"]["das"]["flops_per_update"] == eager["methods"]["das"]["flops_per_update"] > 0


def test_mfu_against_the_datasheet_peak_is_the_flop_rate_over_the_devices_16_bit_peak():
    """A saved report gains ``spec_peak_tflops`` and each row's ``mfu_spec``: for an H200 in bf16, 23.0 TFLOP in
    0.0684 s is 340 TFLOP/s, 34.0% of the datasheet's 989.4; fp32 (no tensor-core peak known) and unknown devices get
    None."""
    from benchmark.tools.bench import markdown_table, with_spec_peak

    row = {"step_seconds": 0.0684, "flops_per_update": 23019.9e9, "tokens_per_second": 594669.4, "passes": 1.0}
    row |= {"mfu": 0.4473, "peak_memory_mb": 21026.2, "vs_plain": 2.666, "vs_bound": 1.0, "bound_passes": 1.0}

    def report(device: str, precision: str) -> dict:
        rows = {"plain_transformers": dict(row), "methods": {"ncl": dict(row)}}
        return {"device": device, "precision": precision, **rows}

    h200 = with_spec_peak(report("NVIDIA H200", "bf16"))
    assert h200["spec_peak_tflops"] == 989.4 and h200["methods"]["ncl"]["mfu_spec"] == pytest.approx(0.3402, abs=1e-4)
    assert "| 44.7% | 34.0% |" in markdown_table(h200)
    for device, precision in (("NVIDIA H200", "no"), ("Some CPU", "bf16")):
        other = with_spec_peak(report(device, precision))
        assert other["spec_peak_tflops"] is None and other["methods"]["ncl"]["mfu_spec"] is None
        assert "| 44.7% | — |" in markdown_table(other)


def test_the_finetune_bench_times_the_updates_after_the_warmup_plain_and_compiled(tiny_config, monkeypatch, capsys):
    """``dapbench bench --finetune``: the end-task fine-tuning update (the first domain's task from the base model),
    eager and through compiled blocks in one process, every update marked and only those after the warm-up timed;
    its report names its own file and refuses a trace."""
    from benchmark.cli import main
    from benchmark.tools import bench as bench_module

    made = []

    class Spy(bench_module.UpdateClock):
        def __init__(self):
            super().__init__()
            made.append(self)

    monkeypatch.setattr(bench_module, "UpdateClock", Spy)
    report = bench_module.bench(tiny_config, ["ncl"], updates=3, warmup=2, finetune=True)
    assert [len(clock.marks) for clock in made] == [6, 6]  # eager, then compiled: the start, warm-up, timed updates
    for clock, kind in zip(made, ("eager", "compiled"), strict=True):
        assert report["rows"][kind]["step_seconds"] == round((clock.marks[-1] - clock.marks[2]) / 3, 5) > 0
    no_warmup = bench_module.bench(tiny_config, ["ncl"], updates=1, warmup=0, finetune=True)
    assert made[-1].marks[-1] - made[-1].marks[0] == pytest.approx(
        no_warmup["rows"]["compiled"]["step_seconds"], abs=1e-5
    )
    assert report["compiled_speedup"] > 0 and report["task"] == "alpha_sup"
    assert (
        bench_module.report_file_name(report, "synthetic")
        == f"{bench_module.device_slug(report['device'])}-synthetic-finetune.json"
    )
    assert "| compiled |" in bench_module.finetune_table(report)
    args = ["bench", "--profile", "synthetic", "--model", tiny_config.model, "--data-root", tiny_config.data_root]
    assert main([*args, "--finetune", "--trace", "t", "--general-heldout", tiny_config.general_heldout]) == 2
    assert "--trace records DAP updates" in capsys.readouterr().err
