"""The per-architecture unit maps (benchmark.modeling.layer_modules): which slices of which weights a unit owns, on
BERT, GPT-2 (fused q/k/v in a Conv1D) and Llama (grouped-query attention, gated MLP)."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from benchmark.families import CAUSAL_LM, MASKED_LM, family_of
from benchmark.modeling import layer_modules
from methods._shared.softmask import soft_mask_gradients
from methods._shared.units import gated, unit_shapes


def llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=12,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config)


def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=4, n_positions=32))


def _masked_by(model, importance: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each layer-0 weight's gradient after soft-masking all-ones gradients by ``importance`` (1 = frozen)."""
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    full = {unit: torch.zeros(*unit_shapes(model).shape(unit)) for unit in ("head", "intermediate", "output")}
    for unit, row in importance.items():
        full[unit][0] = row
    soft_mask_gradients(layer_modules(model), full, unit_shapes(model).head_dim)
    return {name: p.grad for name, p in model.named_parameters() if ".0." in name or "layers.0" in name}


def _zero(grad: torch.Tensor) -> torch.Tensor:
    return (grad == 0).nonzero().tolist()


def test_model_families_are_read_from_the_configuration():
    assert family_of(llama().config) is CAUSAL_LM and family_of(gpt2().config) is CAUSAL_LM
    from model_helpers import tiny_mlm

    assert family_of(tiny_mlm().config) is MASKED_LM and family_of(tiny_mlm("roberta").config) is MASKED_LM
    unnamed = tiny_mlm().config
    unnamed.architectures = None  # no architecture named: the model type decides
    assert family_of(unnamed) is MASKED_LM


def test_a_llama_head_owns_its_query_rows_its_key_value_heads_rows_and_its_output_columns():
    # head 3 is served by key/value head 1 (heads 2 and 3 share it: 4 query heads, 2 key/value heads)
    grads = _masked_by(llama(), {"head": torch.tensor([0.0, 0.0, 0.0, 1.0])})
    attn = "model.layers.0.self_attn."
    rows = lambda grad: sorted({r for r, _ in _zero(grad)})  # noqa: E731
    cols = lambda grad: sorted({c for _, c in _zero(grad)})  # noqa: E731
    assert rows(grads[attn + "q_proj.weight"]) == list(range(12, 16))  # head_dim 4: rows of head 3
    assert rows(grads[attn + "k_proj.weight"]) == list(range(4, 8)) == rows(grads[attn + "v_proj.weight"])
    assert cols(grads[attn + "o_proj.weight"]) == list(range(12, 16))
    others = {n: g for n, g in grads.items() if not n.startswith(attn)}
    assert all((g != 0).all() for g in others.values())  # nothing else moves
    # a head whose key/value head serves a protected head keeps its own rows but shares the k/v protection
    half = _masked_by(llama(), {"head": torch.tensor([0.0, 0.0, 0.5, 0.0])})
    assert torch.equal(half[attn + "k_proj.weight"][4:8], torch.full((4, 16), 0.5))


def test_a_gated_mlp_unit_owns_its_gate_and_up_rows_and_its_down_column():
    grads = _masked_by(llama(), {"intermediate": torch.eye(12)[5]})
    mlp = "model.layers.0.mlp."
    assert _zero(grads[mlp + "gate_proj.weight"]) == [[5, c] for c in range(16)]
    assert _zero(grads[mlp + "up_proj.weight"]) == [[5, c] for c in range(16)]
    assert _zero(grads[mlp + "down_proj.weight"]) == [[r, 5] for r in range(16)]
    output = _masked_by(llama(), {"output": torch.eye(16)[2]})
    assert _zero(output[mlp + "down_proj.weight"]) == [[2, c] for c in range(12)]


def test_a_gpt2_head_owns_its_slice_of_each_fused_third_and_its_projection_rows():
    grads = _masked_by(gpt2(), {"head": torch.tensor([0.0, 1.0, 0.0, 0.0])})
    attn = "transformer.h.0.attn."
    cols = sorted({c for _, c in _zero(grads[attn + "c_attn.weight"])})
    assert cols == [4, 5, 6, 7, 20, 21, 22, 23, 36, 37, 38, 39]  # head 1 of q, k and v (Conv1D: in x out)
    assert sorted(i for (i,) in _zero(grads[attn + "c_attn.bias"])) == cols
    assert sorted({r for r, _ in _zero(grads[attn + "c_proj.weight"])}) == [4, 5, 6, 7]


@pytest.mark.parametrize("build", [llama, gpt2])
def test_gating_a_head_to_zero_equals_removing_its_output_columns(build):
    def remove(layer):
        if type(layer.attn_out).__name__ == "Conv1D":
            layer.attn_out.weight[4:8] = 0
        else:
            layer.attn_out.weight[:, 4:8] = 0

    gated_logits, removed = _gated_and_removed(build().eval(), "head", 4, 1, remove)
    assert torch.allclose(gated_logits, removed, atol=1e-6)


def _gated_and_removed(model, unit: str, width: int, index: int, remove):
    """Logits with unit ``index`` of the first layer gated to 0, and with ``remove(first layer)`` applied instead."""
    ids = torch.randint(0, 40, (2, 9))
    gates = {unit: torch.ones(2, width)}
    gates[unit][0, index] = 0
    with torch.no_grad(), gated(model, gates):
        gated_logits = model(input_ids=ids).logits
    with torch.no_grad():
        remove(layer_modules(model)[0])
        return gated_logits, model(input_ids=ids).logits


def test_gating_a_gated_mlp_unit_to_zero_equals_removing_its_down_column():
    def remove(layer):
        layer.output.weight[:, 7] = 0

    gated_logits, removed = _gated_and_removed(llama().eval(), "intermediate", 12, 7, remove)
    assert torch.allclose(gated_logits, removed, atol=1e-6)
