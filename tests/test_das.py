"""DAS / DGA algorithms on tiny models built in the test."""

import dataclasses

import pytest
import torch
from model_helpers import tiny_mlm, toy_batch

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.errors import DapbenchError, NonFiniteError
from benchmark.modeling import layer_modules, mean_pool, mlm_loss
from methods._shared.contrast import info_nce, reference_pairing
from methods._shared.importance import gate_importance, kl_proxy_loss, mlm_importance_loss, reference_kl_proxy_loss
from methods._shared.softmask import (
    accumulate_importance,
    adam_update_magnitudes,
    masked_tensors,
    normalize_importance,
    shuffle_within_layers,
    soft_mask_gradients,
    soft_mask_updates,
)
from methods._shared.units import gated, ones_gates, unit_shapes
from methods.das import ABLATIONS, DASConfig


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_gate_gradient_matches_finite_differences(arch):
    model = tiny_mlm(arch, torch.float64).eval()
    batch = toy_batch()
    gates = ones_gates(model, ("head", "intermediate", "output"))
    with gated(model, gates):
        loss = mlm_loss(model, batch)
    grads = dict(zip(gates, torch.autograd.grad(loss, list(gates.values())), strict=True))
    eps = 1e-6
    for unit, index in (("head", (1, 2)), ("intermediate", (0, 7)), ("output", (1, 3))):
        values = []
        for sign in (1, -1):
            bumped = {u: g.detach().clone() for u, g in gates.items()}
            bumped[unit][index] += sign * eps
            with torch.no_grad(), gated(model, bumped):
                values.append(float(mlm_loss(model, batch)))
        finite_difference = (values[0] - values[1]) / (2 * eps)
        assert float(grads[unit][index]) == pytest.approx(finite_difference, rel=1e-5, abs=1e-9)


def test_head_gate_equals_scaling_attention_probabilities():
    model = tiny_mlm().eval()
    batch = toy_batch()
    gates = {"head": torch.ones(2, 4)}
    gates["head"][0, 1] = 0.0
    with torch.no_grad(), gated(model, gates):
        gated_hidden = model.bert(input_ids=batch["input_ids"]).last_hidden_state
    head_mask = torch.ones(2, 4)
    head_mask[0, 1] = 0.0
    # Recompute layer 0 by hand with head 1's attention probabilities multiplied by 0.
    layer0 = model.bert.encoder.layer[0]
    attn = layer0.attention.self
    with torch.no_grad():
        x = model.bert.embeddings(input_ids=batch["input_ids"])
        q, k, v = (lin(x).view(3, 10, 4, 4).transpose(1, 2) for lin in (attn.query, attn.key, attn.value))
        probs = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) * head_mask[0][None, :, None, None]
        context = (probs @ v).transpose(1, 2).reshape(3, 10, 16)
        after_attention = layer0.attention.output(context, x)
        hidden = layer0.output(layer0.intermediate(after_attention), after_attention)
        out = model.bert.encoder.layer[1](hidden)
        final = out[0] if isinstance(out, tuple) else out
    assert torch.allclose(gated_hidden, final, atol=1e-5)


def _sgd_step_with_mask(model, importance, **kwargs):
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = mlm_loss(model, toy_batch())
    loss.backward()
    soft_mask_gradients(layer_modules(model), importance, unit_shapes(model).head_dim, **kwargs)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    return before, dict(model.named_parameters())


def test_full_head_importance_freezes_exactly_that_head():
    model = tiny_mlm().train()
    importance = {"head": torch.zeros(2, 4), "intermediate": torch.zeros(2, 24), "output": torch.zeros(2, 16)}
    importance["head"][1, 2] = 1.0
    before, after = _sgd_step_with_mask(model, importance)
    rows = slice(8, 12)  # head 2 of 4, head_dim 4
    prefix = "bert.encoder.layer.1.attention"
    for name in ("self.query", "self.key", "self.value"):
        w, b = f"{prefix}.{name}.weight", f"{prefix}.{name}.bias"
        assert torch.equal(before[w][rows], after[w][rows]) and torch.equal(before[b][rows], after[b][rows])
        assert not torch.equal(before[w][:8], after[w][:8])
    out = f"{prefix}.output.dense.weight"
    assert torch.equal(before[out][:, rows], after[out][:, rows])
    assert not torch.equal(before[out][:, :8], after[out][:, :8])
    # the same head in the other layer is not protected
    other = "bert.encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(before[other][rows], after[other][rows])


def test_full_neuron_importance_freezes_exactly_those_neurons():
    model = tiny_mlm().train()
    importance = {"intermediate": torch.zeros(2, 24), "output": torch.zeros(2, 16)}
    importance["intermediate"][0, 5] = 1.0
    importance["output"][0, 3] = 1.0
    before, after = _sgd_step_with_mask(model, importance)
    inter, out = "bert.encoder.layer.0.intermediate.dense", "bert.encoder.layer.0.output.dense"
    assert torch.equal(before[f"{inter}.weight"][5], after[f"{inter}.weight"][5])
    assert torch.equal(before[f"{inter}.bias"][5], after[f"{inter}.bias"][5])
    assert not torch.equal(before[f"{inter}.weight"][6], after[f"{inter}.weight"][6])
    assert torch.equal(before[f"{out}.weight"][3], after[f"{out}.weight"][3])
    assert torch.equal(before[f"{out}.bias"][3], after[f"{out}.bias"][3])
    assert not torch.equal(before[f"{out}.weight"][4], after[f"{out}.weight"][4])
    # embeddings and LayerNorms are never masked
    assert not torch.equal(
        before["bert.embeddings.word_embeddings.weight"], after["bert.embeddings.word_embeddings.weight"]
    )


def test_reference_qkv_axis_masks_input_columns_instead():
    model = tiny_mlm().train()
    importance = {"head": torch.zeros(2, 4)}
    importance["head"][1, 2] = 1.0
    before, after = _sgd_step_with_mask(model, importance, qkv_axis="input", mask_attn_out_bias=True)
    q = "bert.encoder.layer.1.attention.self.query.weight"
    assert torch.equal(before[q][:, 8:12], after[q][:, 8:12])
    assert not torch.equal(before[q][8:12], after[q][8:12])
    bias = "bert.encoder.layer.1.attention.output.dense.bias"
    assert torch.equal(before[bias][8:12], after[bias][8:12])


def test_kl_proxy_is_nonzero_in_train_mode_and_rounding_noise_in_the_reference_form():
    model = tiny_mlm()
    batches = [toy_batch(s) for s in range(2)]
    torch.manual_seed(1)
    units = ("head", "intermediate", "output")
    paper = gate_importance(model, batches, kl_proxy_loss, units)
    assert all(v.abs().sum() > 0 for v in paper.values())
    reference = gate_importance(model, batches, reference_kl_proxy_loss, units, absolute=False, cumulative=True)
    # Two identical passes: the gradient is zero but for rounding, far below the dropout proxy's signal...
    for unit in units:
        assert 0 < float(reference[unit].abs().max()) < 1e-8 < float(paper[unit].abs().max())
    # ...which the reference's normalisation (no epsilon) spreads over [0, 1) all the same.
    for unit in units:
        normalised = normalize_importance(reference[unit], "abs_tanh")
        assert 0.2 < float(normalised.mean()) < 0.8 and float(normalised.max()) < 1


def _reference_general_importance(model, batches, units):
    """The reference's ``compute_impt`` with ``prune_loss='before_distill'`` and ``impt_norm``, written from its
    formulas (docs/das.md 3.2, 3.3, 3.5): a student and a teacher copy in eval mode, both gated by the same
    leaf gates; DistillKL(T=1)(teacher hidden, student hidden) on the masked input; ``backward`` with the gates'
    ``.grad`` never zeroed, the running ``.grad`` added after every batch; divided by the tokens seen; per layer
    (x - mean) / std (unbiased, no epsilon), then |tanh|."""
    import copy

    import torch.nn.functional as F

    from benchmark.modeling import encoder_of

    student, teacher = model.eval(), copy.deepcopy(model).eval()
    gates = ones_gates(student, units)
    totals = {u: torch.zeros_like(g) for u, g in gates.items()}
    tokens = 0
    for batch in batches:
        with gated(student, gates), gated(teacher, gates):
            s = encoder_of(student)(input_ids=batch["input_ids"]).last_hidden_state
            t = encoder_of(teacher)(input_ids=batch["input_ids"]).last_hidden_state
            loss = F.kl_div(F.log_softmax(t, dim=1), F.softmax(s, dim=1), reduction="sum") / s.shape[0]
        loss.backward()
        for u in units:
            totals[u] += gates[u].grad.detach()
        tokens += batch["input_ids"].numel()
    out = {}
    for u in units:
        raw = totals[u] / tokens
        z = torch.stack([(row - row.mean()) / row.std() for row in raw])
        out[u] = torch.tanh(z).abs()
    return out


def test_reference_mode_general_importance_is_the_reference_formula():
    from benchmark.method import DomainContext, RunEnv
    from methods.das import DAS

    units = ("head", "intermediate", "output")
    batches = [toy_batch(s) for s in range(3)]
    expected = _reference_general_importance(tiny_mlm(), batches, units)
    das = DAS(DASConfig.from_options({"fidelity": "reference"}), env=RunEnv(2, ("a", "b"), 0))
    das.before_domain(DomainContext(0, "a", tiny_mlm(), batches, None, mlm_loss))
    for unit in units:
        assert torch.allclose(das.importance[unit], expected[unit].cpu(), atol=1e-6), unit
        assert 0.2 < float(das.importance[unit].mean()) < 0.8  # noise spread over [0, 1), not zero


def test_importance_pass_leaves_parameter_gradients_alone():
    model = tiny_mlm()
    gate_importance(model, [toy_batch()], mlm_importance_loss(), ("head",))
    assert all(p.grad is None for p in model.parameters())


def test_cumulative_signed_importance_matches_the_reference_weighting():
    model = tiny_mlm().eval()
    batches = [toy_batch(s) for s in range(3)]
    per_batch = [gate_importance(model, [b], mlm_loss, ("head",), absolute=False)["head"] for b in batches]
    cumulative = gate_importance(model, batches, mlm_loss, ("head",), absolute=False, cumulative=True)["head"]
    expected = (3 * per_batch[0] + 2 * per_batch[1] + per_batch[2]) / 3
    assert torch.allclose(cumulative, expected, atol=1e-6)


@pytest.mark.parametrize("kind", ["positive_tanh", "abs_tanh"])
def test_normalisation_and_max_accumulation(kind):
    raw = torch.tensor([[1.0, 2.0, 3.0, 10.0], [5.0, 5.0, 5.0, 5.0]])
    if kind == "abs_tanh":  # the reference's normalisation has no epsilon: a constant layer is a named error
        with pytest.raises(NonFiniteError, match="zero standard deviation"):
            normalize_importance(raw, kind)
        raw = raw[:1]
    norm = normalize_importance(raw, kind)
    assert torch.all(norm >= 0) and torch.all(norm < 1)
    if kind == "positive_tanh":
        assert torch.equal(norm[1], torch.zeros(4))  # a constant layer gives 0, not NaN
    z = (raw[0] - raw[0].mean()) / raw[0].std()
    expected = torch.tanh(z).abs() if kind == "abs_tanh" else torch.tanh(z.clamp_min(0))
    assert torch.allclose(norm[0], expected, atol=1e-6)
    a = {"head": torch.tensor([[0.1, 0.9], [0.5, 0.2]])}
    b = {"head": torch.tensor([[0.3, 0.4], [0.1, 0.8]])}
    assert torch.equal(accumulate_importance(a, b)["head"], torch.tensor([[0.3, 0.9], [0.5, 0.8]]))
    assert accumulate_importance(None, a)["head"] is not a["head"]


def test_contrastive_positive_is_the_same_input():
    # four distinct inputs; the two dropout views of an input are identical here
    views = torch.eye(4, 8)
    prev = torch.eye(4, 8).roll(4, dims=1)  # orthogonal to every view
    paper = info_nce(views, views, prev, temperature=0.05)
    anchor, positive = reference_pairing(views, views)
    # tiled rows [x0 x1 x2 x3 x0 x1 x2 x3]: anchors = odd rows (x1 x3 x1 x3), positives = even rows (x0 x2 x0 x2)
    assert torch.equal(anchor, views[[1, 3, 1, 3]]) and torch.equal(positive, views[[0, 2, 0, 2]])
    mispaired = info_nce(anchor, positive, prev, temperature=0.05)
    assert float(paper) < 1e-6 < float(mispaired) - 1.0


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0], [3.0], [100.0]]])
    assert float(mean_pool(hidden, torch.tensor([[1, 1, 0]]))) == 2.0


def test_fidelity_presets_and_overrides():
    paper, reference = DASConfig(), DASConfig(fidelity="reference")
    assert paper.switch("contrast_pairing") == "same_input" and reference.switch("contrast_pairing") == "adjacent"
    assert reference.switch("kl_proxy") == "eval_hidden" and reference.switch("qkv_mask_axis") == "input"
    mixed = DASConfig(fidelity="reference", contrast_pairing="same_input")
    assert mixed.switch("contrast_pairing") == "same_input" and mixed.switch("kl_proxy") == "eval_hidden"
    with pytest.raises(DapbenchError, match="invalid das.ablation='everything'"):
        DASConfig(ablation="everything")
    with pytest.raises(DapbenchError, match="invalid das.qkv_mask_axis"):
        DASConfig(qkv_mask_axis="diagonal")


def test_das_options_have_one_spelling_per_behaviour():
    from methods.das import REFERENCE

    assert DASConfig(contrast_lambda=1, fidelity="paper", importance_abs="per_example").canonical_options() == {}
    assert DASConfig(fidelity="reference").canonical_options() == {"fidelity": "reference"}
    assert DASConfig(**REFERENCE).canonical_options() == {"fidelity": "reference"}  # every switch spelled out
    mixed = DASConfig(fidelity="reference", contrast_pairing="same_input", kl_proxy="eval_hidden")
    assert mixed.canonical_options() == {"fidelity": "reference", "contrast_pairing": "same_input"}
    assert DASConfig(kl_proxy="eval_hidden").canonical_options() == {"kl_proxy": "eval_hidden"}
    assert DASConfig(units=("head", "output")).canonical_options() == {"units": ["head", "output"]}
    assert DASConfig(fidelity="reference").numerics_depend_on_processes()
    assert not DASConfig().numerics_depend_on_processes()


@pytest.mark.parametrize(
    "options",
    [{"fidelity": "reference"}, {"mask_target": "update"}] + [{"ablation": a} for a in ABLATIONS if a != "none"],
)
def test_das_presets_run_end_to_end(options, tiny_config):
    config = dataclasses.replace(tiny_config, method_options={"das": options})
    record = continual_run(config, prepare_data(config), "das", 3, show_progress=False).execute()
    assert record["method_label"] == "das[" + ",".join(f"{k}={v}" for k, v in options.items()) + "]"
    first, second = ([entry for entry in d["loss_log"]] for d in record["domains"])
    if options.get("ablation") == "no_contrast":
        assert all("contrast" not in entry for entry in first + second)
    elif options.get("ablation") in ("no_init", "domain_contrast"):
        # no importance exists during the first domain, so nothing to contrast against yet
        assert all("contrast" not in entry for entry in first) and all("contrast" in entry for entry in second)
    else:
        assert all("contrast" in entry for entry in first + second)


def test_das_state_holds_only_accumulated_importance(tiny_config):
    run = continual_run(tiny_config, prepare_data(tiny_config), "das", 3, show_progress=False)
    run.execute()
    state = run.method.state_dict()
    assert set(state["importance"]) == {"head", "intermediate", "output"}
    assert state["importance"]["head"].shape == (2, 4)
    assert float(state["importance"]["intermediate"].max()) < 1.0


def test_positive_tanh_keeps_the_order_that_abs_tanh_scrambles():
    raw = torch.tensor([[0.1, 0.2, 0.3, 0.4, 5.0, 6.0]])
    kept = normalize_importance(raw, "positive_tanh")[0]
    assert torch.all(kept[1:] >= kept[:-1])  # non-decreasing with the raw score
    scrambled = normalize_importance(raw, "abs_tanh")[0]
    assert scrambled[0] > scrambled[3]  # the least important unit outranks a more important one


def test_per_example_importance_is_the_mean_of_single_example_gradients():
    model = tiny_mlm().eval()
    batch = toy_batch(batch=3)

    def pooled_loss(m, b):  # a mean of per-example terms, so example n's share x B is its own loss
        logits = m(input_ids=b["input_ids"]).logits[:, 0]
        return torch.nn.functional.cross_entropy(logits, b["original_ids"][:, 0])

    units = ("head", "intermediate", "output")
    together = gate_importance(model, [batch], pooled_loss, units, per_example=True)
    single = [{k: v[i : i + 1] for k, v in batch.items() if k != "mlm_positions"} for i in range(3)]
    separate = gate_importance(model, single, pooled_loss, units)
    for unit in units:
        assert float(together[unit].min()) > 1e-6  # real gradients, not float noise
        assert torch.allclose(together[unit], separate[unit], rtol=1e-4, atol=1e-9)
        # |mean gradient| of the batch is smaller: opposite-signed examples cancel
        assert float(gate_importance(model, [batch], pooled_loss, units)[unit].sum()) <= float(together[unit].sum())


def test_shuffled_importance_keeps_each_layers_values():
    values = torch.rand(3, 7)
    shuffled = shuffle_within_layers(values, torch.Generator().manual_seed(0))
    assert torch.equal(shuffled.sort(dim=1).values, values.sort(dim=1).values)
    assert not torch.equal(shuffled, values)


@pytest.mark.parametrize("target", ["gradient", "update"])
def test_adam_update_magnitudes_match_real_adamw_steps(target):
    torch.manual_seed(0)
    keep = torch.tensor([1.0, 0.5, 0.05, 1e-4], dtype=torch.float64)
    start = torch.randn(4, dtype=torch.float64)  # float64: the smallest steps are below float32's resolution
    masked, free = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    opt_masked = torch.optim.AdamW([masked], lr=1e-2, eps=1e-6, weight_decay=0.0)
    opt_free = torch.optim.AdamW([free], lr=1e-2, eps=1e-6, weight_decay=0.0)
    for _ in range(4):
        grad = torch.randn(4, dtype=torch.float64) * 1e-5
        before_masked, before_free = masked.detach().clone(), free.detach().clone()
        masked.grad, free.grad = (keep * grad if target == "gradient" else grad.clone()), grad.clone()
        opt_masked.step()
        opt_free.step()
        if target == "update":
            with torch.no_grad():
                masked.copy_(torch.lerp(before_masked, masked, keep))
    state = (opt_masked if target == "gradient" else opt_free).state[masked if target == "gradient" else free]
    taken, unmasked = adam_update_magnitudes(
        state["exp_avg"], state["exp_avg_sq"], int(state["step"]), 0.999, 1e-6, keep, target
    )
    scale = 1e-2 / (1 - 0.9 ** int(state["step"]))
    assert torch.allclose(scale * taken, (masked - before_masked).abs(), rtol=1e-6)
    assert torch.allclose(scale * unmasked, (free - before_free).abs(), rtol=1e-6)


def test_update_masking_scales_the_step_by_one_minus_importance():
    model = tiny_mlm().train()
    importance = {"intermediate": torch.zeros(2, 24)}
    importance["intermediate"][0, 3] = 0.75
    tensors = masked_tensors(layer_modules(model), ("intermediate",), unit_shapes(model).head_dim)
    before = [t.param.detach().clone() for t in tensors]
    mlm_loss(model, toy_batch()).backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    stepped = [t.param.detach().clone() for t in tensors]
    soft_mask_updates(tensors, importance, before)
    weight = 0  # layer 0's intermediate weight comes first
    row = tensors[weight].param[3] - before[weight][3]
    assert torch.allclose(row, 0.25 * (stepped[weight][3] - before[weight][3]), atol=1e-7)
    assert torch.equal(tensors[weight].param[4], stepped[weight][4])


def test_das_records_its_mask_damping_and_update_masking_damps_by_one_minus_importance(tiny_config):
    reports = {}
    for target in ("gradient", "update"):
        config = dataclasses.replace(tiny_config, method_options={"das": {"mask_target": target}})
        record = continual_run(config, prepare_data(config), "das", 3, show_progress=False).execute()
        reports[target] = [d["method_report"]["mask"] for d in record["domains"]]
    for target, per_domain in reports.items():
        for mask in per_domain:
            assert mask["target"] == target
            assert sum(mask["importance_histogram"]["head"]) == 2 * 4  # layers x heads
            bins = mask["damping_per_bin"]
            assert len(bins) == 10 and any(v is not None for v in bins)
            if target == "update":  # the step is exactly (1 - I) times Adam's: 1 - I within each bin
                for i, value in enumerate(bins):
                    assert value is None or 1 - (i + 1) / 10 - 1e-6 <= value <= 1 - i / 10 + 1e-6


def test_no_softmask_ablation_uses_no_importance_and_contrasts_views_only(tiny_config):
    config = dataclasses.replace(tiny_config, method_options={"das": {"ablation": "no_softmask"}})
    run = continual_run(config, prepare_data(config), "das", 3, show_progress=False)
    record = run.execute()
    assert run.method.importance is None
    assert all("contrast" in e for d in record["domains"] for e in d["loss_log"])
    assert all(d["method_report"] == {} for d in record["domains"])


def test_other_params_freeze_keeps_embeddings_and_head(tiny_config):
    config = dataclasses.replace(tiny_config, method_options={"das": {"other_params": "freeze"}})
    run = continual_run(config, prepare_data(config), "das", 3, show_progress=False)
    model = run.models.for_stage(0)
    names = {n for n, _ in run.method.trainable_parameters(model)}
    assert not any("embeddings" in n or "LayerNorm" in n or n.startswith("cls.") for n in names)
    assert any("intermediate.dense.weight" in n for n in names)
