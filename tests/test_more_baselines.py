"""Pool, HAT, DEMIX, adapters and prompts: hand-computed algorithm cases and end-to-end properties."""

import dataclasses
import math

import pytest
import torch
from model_helpers import tiny_mlm, toy_batch

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.errors import DapbenchError
from benchmark.method import Capabilities, FinetuneContext
from benchmark.modeling import encoder_of, layer_modules, load_lm, mlm_loss
from methods._shared.adapters import activate_adapter, adapter_parameters, inject_ffn_adapters
from methods._shared.hat import anneal_s, attention_regularizer, compensate_embedding_gradient, mask_hat_gradients
from methods._shared.prompts import attach_prompt, prompt_parameters
from methods.demix import copy_adapter, expert_perplexities, nearest_expert


# -- HAT -----------------------------------------------------------------------------------------
def test_hat_annealing_runs_linearly_from_one_over_smax_to_smax():
    assert anneal_s(0, 11, 400.0) == pytest.approx(1 / 400)
    assert anneal_s(10, 11, 400.0) == pytest.approx(400.0)
    assert anneal_s(5, 11, 400.0) == pytest.approx(1 / 400 + (400 - 1 / 400) / 2)


def test_hat_attention_regularizer_by_hand():
    gates = {"head": torch.tensor([[0.5, 1.0]]), "output": torch.tensor([[0.2]])}
    previous = {"head": torch.tensor([[0.0, 1.0]]), "output": torch.tensor([[0.0]])}
    # used = 0.5*1 + 1*0 + 0.2*1 = 0.7, free = 1 + 0 + 1 = 2
    assert float(attention_regularizer(gates, previous)) == pytest.approx(0.35)
    assert float(attention_regularizer(gates, None)) == pytest.approx((0.5 + 1.0 + 0.2) / 3)


def test_hat_embedding_gradient_compensation_by_hand():
    grad, e = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0])
    out = compensate_embedding_gradient(grad, e, s=2.0, smax=400.0)
    expected_second = 2.0 * 200 * (math.cosh(2.0) + 1) / (math.cosh(1.0) + 1)
    assert out.tolist() == pytest.approx([200.0, expected_second])
    # the cosh clamp keeps large s * e finite
    assert torch.isfinite(compensate_embedding_gradient(grad, torch.tensor([6.0, -6.0]), 400.0, 400.0)).all()


def test_hat_gradient_mask_with_a_known_cumulative_mask():
    model = tiny_mlm()  # 4 heads of 4 dims, 24 intermediate, 16 hidden
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    head = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    inter = torch.zeros(2, 24)
    inter[0, 3] = 1.0
    out = torch.zeros(2, 16)
    out[0, 5] = 1.0
    layers = layer_modules(model)
    mask_hat_gradients(layers, {"head": head, "intermediate": inter, "output": out}, head_dim=4)
    first = layers[0]
    assert first.query.weight.grad[:4].abs().sum() == 0 and (first.query.weight.grad[4:] == 1).all()
    assert first.value.bias.grad[:4].abs().sum() == 0 and (first.value.bias.grad[4:] == 1).all()
    assert first.attn_out.weight.grad[:, :4].abs().sum() == 0 and (first.attn_out.weight.grad[:, 4:] == 1).all()
    assert (first.attn_out.bias.grad == 1).all()  # its output (the residual stream) has no gate
    assert first.intermediate.weight.grad[3].abs().sum() == 0 and first.intermediate.bias.grad[3] == 0
    expected = 1 - torch.minimum(out[0][:, None], inter[0][None, :])
    assert torch.equal(first.output.weight.grad, expected)
    assert first.output.weight.grad[5, 3] == 0 and first.output.weight.grad[5, 0] == 1
    assert first.output.bias.grad[5] == 0
    assert all((p.grad == 1).all() for p in layers[1].query.parameters())  # layer 1 has no used head


def test_hat_leaves_units_of_earlier_domains_unchanged(tiny_config):
    config = dataclasses.replace(tiny_config, keep_checkpoints=True)
    run = continual_run(config, prepare_data(config), "hat", 3, show_progress=False)
    run.execute()
    first, second = (load_lm(str(run.layout.checkpoint(t)), require_complete=False)[0] for t in (0, 1))
    run.method.load_state_dict(torch.load(run.layout.checkpoint(0) / "method_state.pt", weights_only=False))
    used = run.method.previous["head"] == 1.0  # exactly 1 in float32 at s = smax for most units
    assert used.any() and not used.all()
    head_dim = first.config.hidden_size // first.config.num_attention_heads
    for index, (a, b) in enumerate(zip(layer_modules(first), layer_modules(second), strict=True)):
        rows = used[index].repeat_interleave(head_dim)
        assert torch.equal(a.query.weight[rows], b.query.weight[rows])
        assert torch.equal(a.attn_out.weight[:, rows], b.attn_out.weight[:, rows])
        if (~rows).any():
            assert not torch.equal(a.query.weight[~rows], b.query.weight[~rows])


def test_hat_measures_each_trained_domain_with_its_own_mask_and_the_rest_with_the_full_network(tiny_config):
    from benchmark.engine.evaluation import heldout_losses

    data = prepare_data(tiny_config)
    run = continual_run(tiny_config, data, "hat", 3, show_progress=False)
    record = run.execute()
    model, method = run.models.load(1), run.method
    alpha = {"alpha": data.heldout_batches["alpha"]}
    views, gates = {}, {}
    for index in (0, 1, None):
        with method.heldout_view(model, index):
            views[index] = heldout_losses(model, alpha, "cpu")["alpha"]
            gates[index] = method._gate("head", 0)
            assert (gates[index] is None) == (index is None)  # the full network has no gate
            gates[index] = None if gates[index] is None else gates[index].detach().clone()
    assert record["lm_loss"]["after_domain"][1]["alpha"] == views[0]  # alpha through alpha's own mask
    # A 4-update run can saturate both domains' gates (nearly) alike, and then their losses agree to the record's
    # rounding (seen in 2 of 12 freshly built worlds); where the masks differ materially, so must the losses.
    if (gates[0] - gates[1]).abs().max() > 1e-2:
        assert views[0] != views[1]  # not through the newest domain's mask
    assert method.domain == 1 and method.gating  # the view is restored after the block
    general = {"general": data.heldout_batches["general"]}
    with method.heldout_view(model, None):
        assert record["lm_loss"]["after_domain"][1]["general"] == heldout_losses(model, general, "cpu")["general"]


def test_an_undeclared_domain_id_fails_at_fine_tuning(tiny_config):
    run = continual_run(tiny_config, prepare_data(tiny_config), "hat", 3, show_progress=False)
    run.method.capabilities = Capabilities()  # as if the method had not declared needs_domain_id_at_finetune
    with pytest.raises(DapbenchError, match="domain id"):
        run.execute()


# -- DEMIX and adapters --------------------------------------------------------------------------
def test_demix_picks_the_lowest_perplexity_expert():
    model = inject_ffn_adapters(tiny_mlm(), ["expert0", "expert1", "expert2"], reduction_factor=4)
    batches = [toy_batch(seed) for seed in range(3)]
    # expert1 is fitted to these batches; expert0 stays the identity (LoRA's B starts at zero)
    activate_adapter(model, "expert1")
    optimizer = torch.optim.Adam([p for _, p in adapter_parameters(model, "expert1")], lr=1e-2)
    for _ in range(30):
        for batch in batches:
            optimizer.zero_grad()
            mlm_loss(model, batch).backward()
            optimizer.step()
    perplexities = expert_perplexities(model, ["expert0", "expert1"], batches, mlm_loss)
    assert perplexities["expert1"] < perplexities["expert0"]
    assert nearest_expert(perplexities) == "expert1"
    assert nearest_expert({"a": 2.0, "b": 2.0, "c": 3.0}) == "a"
    copy_adapter(model, "expert0", "expert2")
    for (_, a), (_, b) in zip(adapter_parameters(model, "expert0"), adapter_parameters(model, "expert2"), strict=True):
        assert torch.equal(a, b)


def test_demix_keeps_earlier_experts_and_fine_tunes_with_the_task_expert(tiny_config):
    config = dataclasses.replace(tiny_config, keep_checkpoints=True)
    run = continual_run(config, prepare_data(config), "demix", 3, show_progress=False)
    run.execute()
    first, second = run.models.load(0), run.models.load(1)
    state = run.method.state_dict()
    assert state["initialised_from"][1]["expert"] == "expert0"
    for (_, a), (_, b) in zip(adapter_parameters(first, "expert0"), adapter_parameters(second, "expert0"), strict=True):
        assert torch.equal(a, b)  # frozen after its domain
    trained = dict(adapter_parameters(second, "expert1"))
    assert any(
        not torch.equal(p, trained[n.replace("expert0", "expert1")]) for n, p in adapter_parameters(second, "expert0")
    )
    clf = run.method.finetune_model(
        FinetuneContext(run.layout.checkpoint(1), second, num_labels=2, task_domain_index=0)
    )
    layer = encoder_of(clf).encoder.layer[0].output.dense
    assert layer.active_adapters == ["expert0"]
    assert torch.equal(
        layer.lora_B["expert0"].weight, second.bert.encoder.layer[0].output.dense.lora_B["expert0"].weight
    )


def test_adapter_methods_train_only_adapter_and_head_and_hand_them_to_the_classifier(tiny_config):
    run = continual_run(tiny_config, prepare_data(tiny_config), "adapter_ncl", 3, show_progress=False)
    run.execute()
    model = run.models.load(1)
    names = [n for n, _ in run.method.trainable_parameters(model)]
    assert names and all(".lora_" in n or n.startswith("cls.") for n in names)
    hidden, inter = model.config.hidden_size, model.config.intermediate_size
    rank = hidden // 16
    adapter_size = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    assert adapter_size == model.config.num_hidden_layers * rank * (inter + hidden)
    clf = run.method.finetune_model(FinetuneContext(run.layout.checkpoint(1), model, num_labels=2))
    for (name, p), (_, q) in zip(adapter_parameters(model, "adapter"), adapter_parameters(clf, "adapter"), strict=True):
        assert torch.equal(p, q), name
    assert all(p.requires_grad for p in clf.parameters())


# -- prompts -------------------------------------------------------------------------------------
def test_prompt_keeps_the_output_length_and_changes_the_outputs():
    model = tiny_mlm().eval()
    batch = toy_batch()
    plain = mlm_loss(model, batch)
    prompted = attach_prompt(tiny_mlm().eval(), num_tokens=5)
    hidden = encoder_of(prompted)(input_ids=batch["input_ids"])
    assert hidden.last_hidden_state.shape[:2] == batch["input_ids"].shape
    ones = torch.ones_like(batch["input_ids"])  # an all-ones mask (as padded inputs have) computes the same
    assert torch.equal(
        encoder_of(prompted)(input_ids=batch["input_ids"], attention_mask=ones).last_hidden_state,
        hidden.last_hidden_state,
    )
    assert not torch.isclose(mlm_loss(prompted, batch), plain)
    ((name, vector),) = prompt_parameters(prompted)
    assert vector.shape == (5, 16)
    mlm_loss(prompted, batch).backward()
    assert vector.grad is not None and vector.grad.abs().sum() > 0


def test_prompt_that_does_not_fit_the_positions_is_a_clear_error():
    model = attach_prompt(tiny_mlm(), num_tokens=35)  # 35 + 10 tokens > 40 positions
    with pytest.raises(DapbenchError, match="exceed the model's 40 positions"):
        mlm_loss(model, toy_batch())


# -- pool ----------------------------------------------------------------------------------------
def test_pool_trains_once_on_the_union_with_the_whole_budget(tiny_config):
    record = continual_run(tiny_config, prepare_data(tiny_config), "pool", 3, show_progress=False).execute()
    assert len(record["domains"]) == 1 and record["domains"][0]["steps"] == 2 * tiny_config.dap.steps
    acc = record["matrices"]["acc"]
    assert acc[0] == [None, None] and None not in acc[1]
    assert record["summary"]["acc"]["final"] == pytest.approx(sum(acc[1]) / 2)
    assert record["summary"]["acc"]["forgetting"] is None
    assert record["lm_loss"]["after_domain"][0] is None and record["lm_loss"]["after_domain"][1]
