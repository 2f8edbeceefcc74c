"""lora_merge (issue #50): PEFT's weighted merging of per-domain LoRA modules, checked on a toy case against a hand
computation; every domain's module trains alone on the base weights, and after each domain the merged adapter alone
computes the merge of the modules so far, the base weights unchanged; its state round-trips."""

import dataclasses

import pytest
import torch

from benchmark.method import DomainContext, RunEnv
from benchmark.modeling import load_lm
from methods.domix import module_name
from methods.lora_merge import MERGED, LoraMerge, LoraMergeConfig, merge_modules


def _method(tiny_model, **options) -> LoraMerge:
    env = RunEnv(2, ("a", "b"), 1, base_model=str(tiny_model))
    return LoraMerge(LoraMergeConfig(rank=2, alpha=4.0, **options), env=env)


def _lora_layers(model) -> dict:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def _train_module(model, index: int) -> None:
    """Stands in for a domain's training: random values in the module's A and B (B starts at zero)."""
    generator = torch.Generator().manual_seed(index + 10)
    with torch.no_grad():
        for layer in _lora_layers(model).values():
            for factor in (layer.lora_A[module_name(index)].weight, layer.lora_B[module_name(index)].weight):
                factor.copy_(torch.randn(factor.shape, generator=generator) * 0.1)


def _hand_update(model, how: str) -> dict:
    """The merge of the two modules by hand, per adapted projection: cat is the exact weighted sum of the updates
    s B_k A_k (weights 1/2: a mean); linear sums the factors sqrt(w s) A_k and sqrt(w s) B_k apart, then multiplies."""
    out = {}
    for name, layer in _lora_layers(model).items():
        s, w = layer.scaling[module_name(0)], 0.5
        a = [layer.lora_A[module_name(k)].weight for k in range(2)]
        b = [layer.lora_B[module_name(k)].weight for k in range(2)]
        if how == "cat":
            out[name] = sum(w * s * b[k] @ a[k] for k in range(2))
        else:
            out[name] = sum((w * s) ** 0.5 * b[k] for k in range(2)) @ sum((w * s) ** 0.5 * a[k] for k in range(2))
    return out


@pytest.mark.parametrize("how", ["cat", "linear"])
def test_the_merged_adapter_computes_the_hand_computed_update(tiny_model, how):
    method = _method(tiny_model, how=how)
    model = method.setup(load_lm(str(tiny_model))[0])
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    for index in range(2):
        _train_module(model, index)
    expected = _hand_update(model, how)
    merge_modules(method._tuner, 2, method.config, seed=0)
    for name, layer in _lora_layers(model).items():
        assert torch.allclose(layer.get_delta_weight(MERGED), expected[name], atol=1e-6), name
        assert layer.active_adapters == [MERGED] and not layer.disable_adapters
    assert "merging" not in method._tuner.peft_config  # PEFT's own merged adapter is gone once copied
    for name, param in model.named_parameters():  # the base weights are never changed
        if ".lora_" not in name:
            assert torch.equal(param, base[name]), name


def test_each_domain_trains_its_module_alone_and_ends_as_the_merge_so_far(tiny_model):
    method = _method(tiny_model)
    model = method.setup(load_lm(str(tiny_model))[0])
    ctx = DomainContext(0, "a", model, [], None, None)
    ids = torch.randint(5, 100, (1, 8))
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits  # the merged adapter starts as a zero update
        assert torch.allclose(base_logits, load_lm(str(tiny_model))[0](input_ids=ids).logits, atol=1e-6)
    for index in range(2):
        ctx = dataclasses.replace(ctx, index=index)
        method.before_domain(ctx)
        assert all(layer.active_adapters == [module_name(index)] for layer in _lora_layers(model).values())
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        assert trained and all(f".{module_name(index)}." in n for n in trained)
        _train_module(model, index)
        with torch.no_grad():
            trained_logits = model(input_ids=ids).logits
        method.after_domain(ctx)
        assert method.domain_report() == {"modules_merged": index + 1}
        assert not any(p.requires_grad for p in model.parameters())
        with torch.no_grad():
            merged_logits = model(input_ids=ids).logits
        if index == 0:  # one module, weight 1: the merged model is that domain's own model
            assert torch.allclose(merged_logits, trained_logits, atol=1e-5)
        else:
            assert not torch.allclose(merged_logits, trained_logits, atol=1e-4)
    restored = _method(tiny_model)
    restored.load_state_dict(method.state_dict())
    assert restored.trained == 2


def test_lora_merge_options_are_checked():
    from benchmark.errors import DapbenchError

    with pytest.raises(DapbenchError, match="lora_merge.how"):
        LoraMergeConfig.from_options({"how": "average"}, section="lora_merge")
    with pytest.raises(DapbenchError, match="lora_merge.density"):
        LoraMergeConfig.from_options({"density": 0}, section="lora_merge")


def test_dare_drops_the_same_entries_for_a_seed_and_leaves_the_run_streams_alone(tiny_model):
    def merged_update(seed: int) -> torch.Tensor:
        method = _method(tiny_model, how="dare_linear", density=0.5)
        model = method.setup(load_lm(str(tiny_model))[0])
        for index in range(2):
            _train_module(model, index)
        state = torch.get_rng_state()
        merge_modules(method._tuner, 2, method.config, seed=seed)
        assert torch.equal(state, torch.get_rng_state())
        return next(iter(_lora_layers(model).values())).get_delta_weight(MERGED)

    assert torch.equal(merged_update(7), merged_update(7))
    assert not torch.equal(merged_update(7), merged_update(8))
