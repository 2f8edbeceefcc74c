"""Batches of packed chunks in the model family's objective (a masked LM's BERT masking, drawn from generators the
project owns), the fixed held-out evaluation batches (every mask draw, each batch naming its chunks), and checksums
of what an evaluation reads."""

from __future__ import annotations

import hashlib

import torch

from benchmark.families import ModelFamily


class MlmCollator:
    """The model family's batches of packed chunks (a masked LM's: BERT masking of 15% of non-special tokens,
    80/10/10) with host-side gather indices.

    The draws come from ``generator`` (the global torch RNG when None): the project owns them, so evaluation masks
    never depend on a library's collator internals. Every batch has ``mlm_positions`` (flat indices of the tokens
    the loss reads) and ``mlm_targets`` (their targets), so the loss can gather the selected hidden states without a
    device synchronisation, and ``original_ids`` (the unmasked input), which several methods need. No
    ``attention_mask``: the chunks are full, and without one transformers neither builds a mask nor checks an
    all-ones mask on the host (a device synchronisation per forward on a GPU); the numbers are bit-identical to an
    all-ones mask's.
    """

    def __init__(
        self,
        tokenizer,
        mlm_probability: float = 0.15,
        generator: torch.Generator | None = None,
        *,
        family: ModelFamily,
    ):
        family.check_tokenizer(tokenizer)
        self.family = family
        self.mask_token_id, self.vocab_size = tokenizer.mask_token_id, len(tokenizer)
        self.mlm_probability, self.generator = mlm_probability, generator

    def __call__(self, examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Collate a list of packed chunks (all of one length) into one batch."""
        return self.mask(examples, self.generator)

    def mask(
        self, examples: list[dict[str, torch.Tensor]], generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        """Collate a list of packed chunks into one batch, drawing from ``generator`` (None: the global RNG) what the
        family draws (a causal LM draws nothing)."""
        original = torch.stack([torch.as_tensor(e["input_ids"]) for e in examples]).long()
        special = torch.stack([torch.as_tensor(e["special_tokens_mask"]) for e in examples]).bool()
        return self.family.batch(
            original,
            special,
            mask_token_id=self.mask_token_id,
            vocab_size=self.vocab_size,
            probability=self.mlm_probability,
            generator=generator,
        )


def fixed_mlm_batches(
    dataset,
    tokenizer,
    n_chunks: int,
    batch_size: int,
    mlm_probability: float,
    seed: int = 0,
    *,
    family: ModelFamily,
):
    """The first ``n_chunks`` chunks masked once by a CPU generator seeded with ``seed`` alone: the same
    evaluation for every run, method and device, whatever the global RNG has been used for."""
    collator = MlmCollator(tokenizer, mlm_probability, generator=torch.Generator().manual_seed(seed), family=family)
    n = min(n_chunks, len(dataset))
    return [collator(table_rows(dataset, s, min(s + batch_size, n))) for s in range(0, n, batch_size)]


def table_rows(dataset, start: int, stop: int) -> list[dict]:
    """Rows ``start``..``stop - 1`` of ``dataset`` as row dicts; a ``datasets`` table is read as one slice, because
    reading it row by row costs about a millisecond a row (half a minute of a bench at the paper's shape)."""
    if hasattr(dataset, "column_names"):
        columns = dataset[start:stop]
        return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    return [dataset[i] for i in range(start, stop)]


def heldout_mlm_batches(
    dataset,
    tokenizer,
    n_chunks: int,
    batch_size: int,
    mlm_probability: float,
    draws: int = 1,
    *,
    family: ModelFamily,
) -> list[dict[str, torch.Tensor]]:
    """The fixed held-out evaluation of a corpus: its first ``n_chunks`` chunks masked ``draws`` times, draw d by a
    generator seeded with d alone (draw 0 is the evaluation of earlier versions, bit for bit), one draw after the
    other; every batch names the chunks its rows are (``chunk_index``), so losses can be summed per chunk. A family
    that draws nothing (a causal LM) is evaluated once: every chunk, every next token."""
    out = []
    for draw in range(family.heldout_draws(draws)):
        batches = fixed_mlm_batches(dataset, tokenizer, n_chunks, batch_size, mlm_probability, seed=draw, family=family)
        start = 0
        for batch in batches:
            rows = batch["input_ids"].shape[0]
            out.append({**batch, "chunk_index": torch.arange(start, start + rows)})
            start += rows
    return out


def chunk_token_counts(batches: list[dict[str, torch.Tensor]]) -> list[int]:
    """Masked tokens per chunk over all of ``batches`` (``heldout_mlm_batches``), in chunk order."""
    counts: dict[int, int] = {}
    for batch in batches:
        rows = batch["mlm_positions"] // batch["input_ids"].shape[1]
        per_row = torch.bincount(rows, minlength=batch["input_ids"].shape[0]).tolist()
        for chunk, n in zip(batch["chunk_index"].tolist(), per_row, strict=True):
            counts[chunk] = counts.get(chunk, 0) + n
    return [counts[c] for c in sorted(counts)]


def batches_checksum(batches: list[dict[str, torch.Tensor]]) -> str:
    """A hash of what an evaluation reads from its batches (inputs, selected positions, targets), so two
    records can show that they were measured on bit-identical held-out batches."""
    digest = hashlib.sha256()
    for batch in batches:
        for key in ("input_ids", "mlm_positions", "mlm_targets"):
            digest.update(batch[key].contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
