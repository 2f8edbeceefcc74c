"""Every registered method runs through two domains and honours the interface contract."""

import dataclasses
import math

import pytest
import torch

from benchmark.method import ContinualMethod, FinetuneContext
from benchmark.modeling import load_masked_lm
from benchmark.registry import default_registry
from benchmark.runner import ContinualRun, prepare_data

METHODS = default_registry().names()


@pytest.mark.parametrize("name", METHODS)
def test_method_contract(name, tiny_config):
    config = dataclasses.replace(tiny_config, keep_checkpoints=True)
    data = prepare_data(config)
    run = ContinualRun(config, data, name, 3, show_progress=False)
    record = run.execute()
    cls = default_registry().get(name)
    assert issubclass(cls, ContinualMethod) and cls.__doc__
    # finite losses and scores
    for domain in record["domains"]:
        for entry in domain.get("loss_log", []):
            assert all(math.isfinite(v) for k, v in entry.items() if k != "step")
    assert 0 <= record["summary"]["acc"]["final"] <= 1
    if cls.capabilities.pretrains:
        _only_declared_parameters_change(run, tiny_config.model)
    # state round-trip
    state = run.method.state_dict()
    fresh = cls(run.method.config, env=run.method.env)
    fresh.load_state_dict(state)
    assert _state_equal(fresh.state_dict(), state)
    # fine-tune handoff: a classifier with logits of the task's size
    model, _ = load_masked_lm(str(run._ckpt(1)))
    clf = run.method.finetune_model(FinetuneContext(run._ckpt(1), run.method.setup(model), num_labels=3))
    batch = data.tokenizer(["the thing"], return_tensors="pt")
    assert clf(**batch).logits.shape == (1, 3)


def _only_declared_parameters_change(run, base_path):
    base, _ = load_masked_lm(base_path)
    base = run.method.setup(base)
    declared = {n for n, _ in run.method.trainable_parameters(base)}
    trained, _ = load_masked_lm(str(run._ckpt(0)))
    trained_params = dict(trained.named_parameters())
    for name, param in base.named_parameters():
        if name not in declared and name in trained_params:
            assert torch.equal(param, trained_params[name]), f"undeclared parameter {name} changed"
    assert any(not torch.equal(p, trained_params[n]) for n, p in base.named_parameters() if n in declared)


def _state_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b
