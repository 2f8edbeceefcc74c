"""A toy model family, all of it in this one module (issue #48's check that a new kind needs nothing else): a masked
LM whose objective hides every fourth token of each chunk, deterministically. It claims models whose configuration
names an architecture ending in ``ForEveryFourthLM`` (a BERT checkpoint so renamed loads with BERT's classes)."""

from __future__ import annotations

import torch

from benchmark.families import ModelFamily, register_family


class EveryFourthLM(ModelFamily):
    """Every fourth non-special token replaced by the mask token; the loss reads exactly those positions."""

    name = "every-fourth"
    auto_class_name = "AutoModelForMaskedLM"
    architecture_suffixes = ("ForEveryFourthLM",)
    loss_name = "fourth"
    heldout_reading = ("held-out loss at every fourth token", "nats")

    def encode_documents(self, tokenizer, lines: list[str]) -> dict[str, list[list[int]]]:
        """As a masked LM's: the tokenizer's special tokens and their marks."""
        return tokenizer(lines, return_special_tokens_mask=True, verbose=False)

    def batch(self, chunks, special, *, mask_token_id, vocab_size, probability, generator) -> dict[str, torch.Tensor]:
        """Nothing drawn: positions 0, 4, 8, ... of each chunk, where not special, are masked and predicted."""
        hidden = (torch.arange(chunks.shape[1]) % 4 == 0).expand_as(chunks) & ~special
        positions = hidden.reshape(-1).nonzero().squeeze(1)
        return {
            "input_ids": chunks.masked_fill(hidden, mask_token_id),
            "mlm_positions": positions,
            "mlm_targets": chunks.reshape(-1)[positions],
            "original_ids": chunks,
        }

    def heldout_draws(self, requested: int) -> int:
        """One: the objective draws nothing."""
        return 1


EVERY_FOURTH = EveryFourthLM()


def register() -> ModelFamily:
    """Register the toy family (the one line a plugin adds)."""
    return register_family(EVERY_FOURTH)
