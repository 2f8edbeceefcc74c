"""freeze_bottom (issue #50): the embeddings and the bottom k layers leave the DAP optimizer, nothing else does; a k
that would freeze every layer is a named error."""

import pytest
import torch
from model_helpers import tiny_mlm
from transformers import GPT2Config, GPT2LMHeadModel

from benchmark.errors import DapbenchError
from benchmark.method import RunEnv
from methods.freeze_bottom import FreezeBottom, FreezeBottomConfig


def _trained_names(model, layers: int) -> set[str]:
    method = FreezeBottom(FreezeBottomConfig(layers=layers), env=RunEnv(2, ("a", "b"), 1))
    return {name for name, _ in method.trainable_parameters(model)}


def test_the_embeddings_and_the_bottom_layers_are_left_out_of_the_optimizer():
    model = tiny_mlm("bert")
    trained = _trained_names(model, 1)
    everything = {name for name, p in model.named_parameters() if p.requires_grad}
    frozen = everything - trained
    assert "bert.embeddings.word_embeddings.weight" in frozen  # the LM head's decoder is the same tensor
    assert all("layer.1." not in name for name in frozen) and any("layer.0." in name for name in frozen)
    assert any("layer.1." in name for name in trained) and "bert.embeddings.position_embeddings.weight" in trained


def test_a_decoder_freezes_its_token_embeddings_and_first_block():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=3, n_head=2, n_positions=32))
    frozen = {name for name, _ in model.named_parameters()} - _trained_names(model, 2)
    bottom = {name for name, _ in model.named_parameters() if ".h.0." in name or ".h.1." in name}
    assert frozen == {"transformer.wte.weight", *bottom}  # position embeddings and block 2 train


def test_freezing_every_layer_is_a_named_error():
    with pytest.raises(DapbenchError, match="freezes every one of the model's 2 layers") as error:
        _trained_names(tiny_mlm("bert"), 2)
    assert "freeze_bottom.layers= to at most 1" in error.value.fix
