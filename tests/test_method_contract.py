"""Every registered method runs through two domains and honours the interface contract."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from transformers import DataCollatorWithPadding

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.method import ContinualMethod, FinetuneContext
from benchmark.modeling import load_lm
from benchmark.protocols.linear_probe import encoder_features
from benchmark.registry import default_registry

METHODS = default_registry().names()
# The synthetic test model has 64 positions: 100 prompt vectors + 32 tokens would not fit.
OPTIONS = {"prompt_one": {"num_tokens": 8}}


@pytest.mark.parametrize("name", METHODS)
def test_method_contract(name, tiny_config):
    check_method_contract(name, tiny_config)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("name", METHODS)
def test_method_contract_on_decoders(name, kind, tiny_config, request):
    """Every method on a tiny GPT-2-style and a tiny Llama-style (grouped-query attention) decoder."""
    model = request.getfixturevalue(f"tiny_{kind}")
    check_method_contract(name, dataclasses.replace(tiny_config, model=str(model)))


def check_method_contract(name: str, tiny_config) -> None:
    """Run method ``name`` through two domains and check the interface contract (also used for plugins)."""
    config = dataclasses.replace(tiny_config, keep_checkpoints=True, method_options={name: OPTIONS.get(name, {})})
    data = prepare_data(config)
    run = continual_run(config, data, name, 3, show_progress=False)
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
    domain_id = 0 if cls.capabilities.needs_domain_id_at_finetune else None
    ctx = FinetuneContext(run.layout.checkpoint(1), run.models.load(1), num_labels=3, task_domain_index=domain_id)
    clf = run.method.finetune_model(ctx)
    batch = data.tokenizer(["the thing"], return_tensors="pt")
    assert clf(**batch).logits.shape == (1, 3)
    # linear-probe handoff: the same model yields one finite pooled feature vector per example
    examples = data.tasks[data.domains[0]].train[:5]
    features = encoder_features(clf, examples, DataCollatorWithPadding(data.tokenizer), 2, "cpu")
    assert features.shape == (5, clf.config.hidden_size) and np.isfinite(features).all()


def _only_declared_parameters_change(run, base_path):
    """Base-model parameters outside ``trainable_parameters`` keep their values through domain 0.

    Parameters a method adds in ``setup`` (adapters, prompts, task embeddings) are randomly
    initialised, so only the base model's own parameters are compared (peft's injection renames a
    wrapped layer's weight to ``base_layer.weight``).
    """
    trained = run.models.load(run.schedule.stages()[0])  # also restores the method state of domain 0
    declared = {n.replace(".base_layer", "") for n, _ in run.method.trainable_parameters(trained)}
    trained_params = {n.replace(".base_layer", ""): p for n, p in trained.named_parameters()}
    base, _ = load_lm(base_path)
    base_params = dict(base.named_parameters())
    for name, param in base_params.items():
        if name not in declared:
            assert torch.equal(param, trained_params[name]), f"undeclared parameter {name} changed"
    changed = [n for n in declared if n in base_params and not torch.equal(base_params[n], trained_params[n])]
    added = [n for n in declared if n not in base_params]
    assert changed or added, "no declared parameter exists"
    assert changed or any(not torch.equal(p, torch.zeros_like(p)) for n, p in trained_params.items() if n in added)


def _state_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b
