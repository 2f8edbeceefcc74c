"""Switches that change how fast a run goes, not what it computes: compiled blocks (``dap.compile=true``, every
transformer block through ``torch.compile``, inductor on CPU; ``finetune.compile=true``, the same for fine-tuning),
activation checkpointing (``dap.activation_checkpointing=true``) and denormals flushed to zero
(``dap.flush_denormals=true``) each give the record a plain run gives, under the same run id."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import run_side_by_side, synthetic_run

from benchmark.records.reproduce import Tolerance, compare_records
from benchmark.registry import default_registry

TOLERANCE = Tolerance(score=0.0, loss=2e-5, drift=1e-5, report=1e-5)
"""Fused kernels and recomputed activations round in another order than plain ones: a stored held-out loss (5
decimals) may move by one unit of its last place, and a loss metric, the difference of two stored losses, by two
(2e-5); a chunk's stored loss sum by one unit of its last place; drift and method reports within 1e-5; end-task
scores (fine-tuned from the checkpoint without either switch) identical."""
FAST = ("ncl", "das")
"""The naive baseline and the method with the most hooks (soft masks on gradients, importance by backward passes
through gated blocks, contrastive views with dropout): the default suite's check."""


def _args(world_root: Path, model: Path, out: Path, methods: tuple[str, ...], *extra: str) -> list[str]:
    # the synthetic model has 64 positions: 100 prompt vectors + 32 tokens would not fit
    prompt = ("prompt_one.num_tokens=8",) if "prompt_one" in methods else ()
    settings = ("dap.steps=3", "finetune.default_epochs=1", *prompt, *extra)
    return ["-m", "benchmark.cli", *synthetic_run(world_root, model, out, ",".join(methods), *settings)]


EACH_SWITCH = (("dap.compile=true",), ("dap.activation_checkpointing=true",))
"""Each switch alone: the default suite's check."""
SWITCHES = (*EACH_SWITCH, ("dap.compile=true", "dap.activation_checkpointing=true"), ("dap.flush_denormals=true",))
"""And both together (checkpointed recomputation through compiled blocks), and denormals flushed (every record of the
ladder's top rung was made with it): the slow suite's, for every method."""


def _switched_equal_plain(
    world_root: Path, model: Path, tmp_path: Path, methods: tuple[str, ...], switch_sets=SWITCHES
) -> None:
    outputs = {switches: tmp_path / "+".join(switches) for switches in switch_sets}
    runs = [((), tmp_path / "plain"), *outputs.items()]
    commands = [[sys.executable, *_args(world_root, model, out, methods, *switches)] for switches, out in runs]
    for done in run_side_by_side(*commands, timeout=1800):  # one thread each: numbers as when run alone
        assert done.returncode == 0, done.stderr[-3000:]
    for switches, out in outputs.items():
        for method in methods:
            (a,) = (tmp_path / "plain" / "results" / "synthetic").glob(f"{method}-*.json")
            (b,) = (out / "results" / "synthetic").glob(f"{method}-*.json")
            assert a.name == b.name  # the switches change how, not what: one run id
            plain, switched = json.loads(a.read_text()), json.loads(b.read_text())
            for switch in switches:
                section, name = switch.split("=")[0].split(".")
                assert switched["config"][section][name] is True
            assert not compare_records(plain, switched, TOLERANCE), (switches, method)


def test_compiled_or_checkpointed_runs_give_the_plain_record(world_root, tiny_model, tmp_path):
    _switched_equal_plain(world_root, tiny_model, tmp_path, FAST, EACH_SWITCH)


def test_flushing_denormals_gives_the_plain_record(world_root, tiny_model, tmp_path):
    # HAT, whose gates at s = smax make the denormals the switch is for, and NCL, the plain update
    _switched_equal_plain(world_root, tiny_model, tmp_path, ("ncl", "hat"), (("dap.flush_denormals=true",),))


def test_compiled_fine_tuning_gives_the_plain_record(world_root, tiny_model, tmp_path):
    # every end task fine-tuned through compiled blocks, its evaluation too; DAP plain (NCL: the default classifier)
    _switched_equal_plain(world_root, tiny_model, tmp_path, ("ncl",), (("finetune.compile=true",),))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_model", "tiny_gpt2", "tiny_llama"])
def test_every_method_compiled_or_checkpointed_gives_the_plain_record(model, world_root, tmp_path, request):
    # the decoders run FAST's methods too: a Llama-style model's DAS views raise its attention dropout for the pass
    methods = tuple(n for n in default_registry().names() if model != "tiny_model" or n not in FAST)
    _switched_equal_plain(world_root, request.getfixturevalue(model), tmp_path, methods)


def test_compiling_keeps_parameter_names_and_shares_one_graph():
    import torch
    from model_helpers import tiny_mlm
    from torch._dynamo.utils import counters

    from benchmark.acceleration.compiling import compile_blocks
    from benchmark.acceleration.sharding import transformer_blocks

    model = tiny_mlm("roberta").eval()
    names = list(model.state_dict())
    compile_blocks(model)
    compile_blocks(model)  # a second stage: nothing compiled twice
    assert list(model.state_dict()) == names
    assert all(block._compiled_call_impl is not None for block in transformer_blocks(model))
    batch = torch.randint(5, 50, (2, 8))
    eager = tiny_mlm("roberta").eval()
    counters.clear()
    assert torch.allclose(model(input_ids=batch).logits, eager(input_ids=batch).logits, atol=1e-6)
    assert len(transformer_blocks(model)) == 2 and counters["stats"]["unique_graphs"] == 1  # compiled once


def test_compiling_a_sharded_run_is_refused_by_name(world_root, tiny_model, tmp_path, capsys):
    from benchmark.cli import main

    args = _args(world_root, tiny_model, tmp_path, ("ncl",), "dap.compile=true", "dap.sharding=fsdp")[2:]
    assert main(args) == 2
    assert "dap.compile=true with dap.sharding=fsdp is not verified" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def _compiled_graphs_of_a_gated_step(layers: int) -> int:
    import torch
    from torch._dynamo.utils import counters
    from transformers import BertConfig, BertForMaskedLM

    from benchmark.acceleration.compiling import compile_blocks
    from methods._shared.units import gated, ones_gates

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=24
    )
    model = BertForMaskedLM(config)
    compile_blocks(model)
    counters.clear()
    batch = torch.randint(5, 50, (2, 8))
    model(input_ids=batch).logits.sum().backward()  # ungated, as NCL's step
    with gated(model, ones_gates(model, ("head", "intermediate", "output"))):
        model(input_ids=batch).logits.sum().backward()  # gated, as DAS's o_prev view and importance pass
    return counters["stats"]["unique_graphs"]


def test_gated_compiled_blocks_compile_once_per_variant_not_once_per_layer():
    # The gate hooks read their layer's gate by the layer's index: a static index would make every layer a variant
    # of its own (12 compiles per mode at roberta-base's depth, minutes of compiling on a GPU for DAS's stage).
    assert _compiled_graphs_of_a_gated_step(2) == _compiled_graphs_of_a_gated_step(4)


def _importance_and_saved_bytes(checkpointed: bool):
    import torch
    from model_helpers import tiny_mlm

    from benchmark.engine.recompute import activation_checkpointing
    from methods._shared.importance import gate_importance, kl_proxy_loss, mlm_importance_loss

    model = tiny_mlm("bert").eval()  # the KL proxy switches to train mode for its passes and back before backward
    ids = torch.randint(5, 50, (3, 10), generator=torch.Generator().manual_seed(0))
    positions, targets = torch.tensor([1, 4, 12, 17, 25]), ids.view(-1)[[1, 4, 12, 17, 25]]
    batch = {"original_ids": ids, "input_ids": ids, "mlm_positions": positions, "mlm_targets": targets}
    saved = []

    def pack(tensor):
        saved.append(tensor.untyped_storage().nbytes())
        return tensor

    units = ("head", "intermediate", "output")
    with activation_checkpointing(model, checkpointed), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.manual_seed(1)
        general = gate_importance(model, [batch], kl_proxy_loss, units, per_example=True)
        model.train()
        domain = gate_importance(model, [batch], mlm_importance_loss(), units, per_example=True)
    return {**general, **{f"mlm {u}": v for u, v in domain.items()}}, sum(saved)


def test_importance_passes_recompute_their_blocks_under_activation_checkpointing():
    # DAS's importance passes (before and after a domain) run on probe batches in fp32: with the switch on they keep
    # only the blocks' inputs, as the updates do, and compute the same importance
    import torch

    plain, plain_bytes = _importance_and_saved_bytes(False)
    recomputed, recomputed_bytes = _importance_and_saved_bytes(True)
    assert recomputed_bytes < plain_bytes
    for name, values in plain.items():
        assert torch.equal(values, recomputed[name]), name


@pytest.mark.parametrize("vocab", [50265, 30522])
def test_the_vocabulary_aligned_head_gives_the_same_logits_and_gradients(vocab):
    """On CUDA the output projection runs over rows padded to a multiple of 64 (cuBLAS's Hopper kernels need an
    aligned leading dimension): the logits and every gradient are the plain projection's, the parameters and state
    dict unchanged, and a copy of the model computes with its own weights."""
    import copy

    from transformers import BertConfig, BertForMaskedLM

    from benchmark.acceleration.compiling import VocabularyAlignedLinear, align_vocabulary

    config = BertConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    plain = BertForMaskedLM(config).eval()  # no dropout: the two forwards draw no random numbers
    aligned = copy.deepcopy(plain)
    align_vocabulary(aligned)
    assert type(aligned.get_output_embeddings()) is VocabularyAlignedLinear
    assert list(aligned.state_dict()) == list(plain.state_dict())
    ids = torch.randint(0, vocab, (2, 12))
    logits = [m(input_ids=ids).logits for m in (plain, aligned)]
    assert logits[1].shape == logits[0].shape and torch.allclose(logits[1], logits[0], atol=1e-6)
    for out in logits:
        out.logsumexp(-1).sum().backward()
    for (name, a), b in zip(plain.named_parameters(), aligned.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name
    twin = copy.deepcopy(aligned)
    with torch.no_grad():
        twin.get_output_embeddings().bias.add_(1.0)
    assert torch.allclose(twin(input_ids=ids).logits, aligned(input_ids=ids).logits + 1.0, atol=1e-5)
    aligned_again = copy.deepcopy(aligned)
    align_vocabulary(aligned_again)  # idempotent
    assert type(aligned_again.get_output_embeddings()) is VocabularyAlignedLinear
