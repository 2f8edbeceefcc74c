"""pytest-benchmark timings of the hot pieces of a run, on the tiny test model.

By default (``--benchmark-disable`` in the project's pytest options) each body runs once, as a smoke test that
also checks its result. Timed: ``python -m pytest tests/test_hot_paths.py --benchmark-enable``; save a baseline
with ``--benchmark-save=NAME`` and compare a change against it with ``--benchmark-compare`` on the same machine.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_helpers import tiny_mlm, toy_batch

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.data.sampling import SeededMasking
from benchmark.engine.training import DapStep
from benchmark.families import MASKED_LM
from benchmark.method import StepContext
from benchmark.modeling import layer_modules


def _stage_one(config, method: str):
    """A run of ``method`` after its first domain: the second domain's model and a training micro-batch."""
    config = dataclasses.replace(config, dap=dataclasses.replace(config.dap, steps=2))
    data = prepare_data(config)
    run = continual_run(config, data, method, 3, show_progress=False)
    run.stages.run(0)
    model = run.models.for_stage(1)
    train = data.corpora[data.domains[1]].train
    _, batch = SeededMasking(data.tokenizer, 0.15, seed=3, stage=1, family=data.family)(
        [(0, train[i]) for i in range(8)]
    )
    ctx = StepContext(model, 1, 0, 2, 2, run.parts.accelerator)
    return run, model, batch, ctx


@pytest.mark.parametrize("method", ["ncl", "das"])
def test_dap_micro_batch_step(benchmark, tiny_config, method):
    """Forward, loss terms and backward of one micro-batch, and the method's gradient hook."""
    run, model, batch, ctx = _stage_one(tiny_config, method)
    step = DapStep(model, run.method)

    def update() -> dict:
        terms = step(batch, ctx)
        sum(terms.values()).backward()
        run.method.after_backward(ctx)
        model.zero_grad(set_to_none=True)
        return terms

    terms = benchmark(update)
    assert set(terms) == ({"mlm"} if method == "ncl" else {"mlm", "contrast"})


def test_soft_mask_hook(benchmark):
    from methods._shared.softmask import soft_mask_gradients
    from methods._shared.units import unit_shapes

    model = tiny_mlm()
    model(input_ids=toy_batch()["input_ids"]).logits.sum().backward()
    importance = {"head": torch.rand(2, 4), "intermediate": torch.rand(2, 24), "output": torch.rand(2, 16)}
    layers, head_dim = layer_modules(model), unit_shapes(model).head_dim
    benchmark(soft_mask_gradients, layers, importance, head_dim)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_importance_pass(benchmark):
    from methods._shared.importance import gate_importance, mlm_importance_loss

    model = tiny_mlm().eval()
    batches = [toy_batch(seed) for seed in range(4)]
    units = ("head", "intermediate", "output")
    scores = benchmark(gate_importance, model, batches, mlm_importance_loss(), units, per_example=True)
    shapes = {k: tuple(v.shape) for k, v in scores.items()}
    assert shapes == {"head": (2, 4), "intermediate": (2, 24), "output": (2, 16)}


def test_collator(benchmark):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i + 3 for i in range(500)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[PAD]": 0, "[MASK]": 1, "[UNK]": 2, **words}, unk_token="[UNK]")),
        mask_token="[MASK]",
        pad_token="[PAD]",
        unk_token="[UNK]",
    )
    chunk = {"input_ids": torch.randint(3, 503, (128,)), "special_tokens_mask": torch.zeros(128, dtype=torch.long)}
    collate = SeededMasking(tokenizer, 0.15, seed=1, stage=0, family=MASKED_LM)
    index, batch = benchmark(collate, [(7, chunk)] * 32)
    assert index == 7 and batch["input_ids"].shape == (32, 128)
    assert batch["mlm_positions"].numel() == batch["mlm_targets"].numel() > 0


def test_probe_features(benchmark):
    from benchmark.engine.evaluation import heldout_features

    model = tiny_mlm()
    heldout = {"alpha": [toy_batch(seed) for seed in range(4)]}
    features = benchmark(heldout_features, model, heldout, "cpu")
    assert features["alpha"].shape == (12, 16)
