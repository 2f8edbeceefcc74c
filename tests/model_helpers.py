"""Tiny randomly initialised masked LMs and a hand-made MLM batch for algorithm tests."""

import torch
from transformers import BertConfig, BertForMaskedLM, RobertaConfig, RobertaForMaskedLM


def tiny_mlm(arch: str = "bert", dtype=torch.float32):
    """A 2-layer, 4-head, hidden-16 masked LM with fixed random weights (BERT or RoBERTa)."""
    torch.manual_seed(0)
    kwargs = dict(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=24,
        max_position_embeddings=40,
        attn_implementation="eager",
    )
    if arch == "roberta":
        model = RobertaForMaskedLM(RobertaConfig(**kwargs, pad_token_id=1))
    else:
        model = BertForMaskedLM(BertConfig(**kwargs))
    return model.to(dtype)


def toy_batch(seed: int = 0, batch: int = 3, length: int = 10):
    """A batch in the collator's format (full chunks, no attention mask), five fixed masked positions (mask id 4)."""
    g = torch.Generator().manual_seed(seed)
    original = torch.randint(5, 50, (batch, length), generator=g)
    masked = original.clone()
    positions = torch.tensor([1, 4, 12, 17, 25])
    masked.view(-1)[positions] = 4
    return {
        "input_ids": masked,
        "original_ids": original,
        "mlm_positions": positions,
        "mlm_targets": original.view(-1)[positions],
    }
