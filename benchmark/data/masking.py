"""MLM batches: BERT's masking of packed chunks drawn from generators the project owns, the fixed held-out
evaluation batches (every mask draw, each batch naming its chunks), and checksums of what an evaluation reads."""

from __future__ import annotations

import hashlib

import torch

from benchmark.errors import DapbenchError


class MlmCollator:
    """BERT masking of packed chunks (15% of non-special tokens; 80/10/10) plus host-side gather indices.

    The masking is :func:`mask_tokens`, drawn from ``generator`` (the global torch RNG when None): the
    project owns it, so evaluation masks never depend on a library's collator internals. Adds
    ``mlm_positions`` (flat indices of the selected tokens) and ``mlm_targets`` (their original ids), so
    the loss can gather the selected hidden states without a device synchronisation, and
    ``original_ids`` (the unmasked input), which several methods need. No ``attention_mask``: the chunks are
    full, and without one transformers neither builds a mask nor checks an all-ones mask on the host (a device
    synchronisation per forward on a GPU); the numbers are bit-identical to an all-ones mask's.
    """

    def __init__(
        self, tokenizer, mlm_probability: float = 0.15, generator: torch.Generator | None = None, causal: bool = False
    ):
        self.causal = causal
        if not causal and tokenizer.mask_token_id is None:
            raise DapbenchError(
                f"tokenizer {type(tokenizer).__name__} has no mask token", "use a masked LM's tokenizer"
            )
        self.mask_token_id, self.vocab_size = tokenizer.mask_token_id, len(tokenizer)
        self.mlm_probability, self.generator = mlm_probability, generator

    def __call__(self, examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Mask a list of packed chunks (all of one length) into one batch."""
        return self.mask(examples, self.generator)

    def mask(
        self, examples: list[dict[str, torch.Tensor]], generator: torch.Generator | None
    ) -> dict[str, torch.Tensor]:
        """Mask a list of packed chunks into one batch, drawing from ``generator`` (None: the global RNG). For a
        causal LM nothing is drawn: every position but each chunk's last predicts the next token."""
        original = torch.stack([torch.as_tensor(e["input_ids"]) for e in examples]).long()
        if self.causal:
            return next_token_batch(original)
        special = torch.stack([torch.as_tensor(e["special_tokens_mask"]) for e in examples]).bool()
        inputs, labels = mask_tokens(
            original,
            special,
            mask_token_id=self.mask_token_id,
            vocab_size=self.vocab_size,
            probability=self.mlm_probability,
            generator=generator,
        )
        flat_labels = labels.reshape(-1)
        positions = (flat_labels != -100).nonzero().squeeze(1)
        if positions.numel() == 0:  # a batch with nothing masked would give a NaN mean loss
            positions = torch.zeros(1, dtype=torch.long)
            flat_labels = flat_labels.clone()
            flat_labels[0] = original.reshape(-1)[0]
        return {
            "input_ids": inputs,
            "mlm_positions": positions,
            "mlm_targets": flat_labels[positions],
            "original_ids": original,
        }


def next_token_batch(chunks: torch.Tensor) -> dict[str, torch.Tensor]:
    """A causal LM's batch of packed chunks in the collator's format: the loss reads every position but each
    chunk's last (``mlm_positions``, flat) and its target is the next token (``mlm_targets``)."""
    rows, length = chunks.shape
    positions = (torch.arange(rows)[:, None] * length + torch.arange(length - 1)).reshape(-1)
    return {
        "input_ids": chunks,
        "mlm_positions": positions,
        "mlm_targets": chunks[:, 1:].reshape(-1),
        "original_ids": chunks,
    }


def mask_tokens(
    input_ids: torch.Tensor,
    special_tokens_mask: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking (Devlin et al. 2019): select each non-special token with ``probability``; of the
    selected, 80% become the mask token, 10% a uniformly random token, 10% stay. Returns the masked input
    and the labels (the original id at selected positions, -100 elsewhere).

    The draws are made on the CPU in a fixed order (selection, mask, random-vs-keep, random ids), so one
    ``generator`` state gives the same masks on every device. The order is the one transformers' MLM
    collator uses, so masks drawn with the same seed equal the ones that collator drew.
    """
    shape = input_ids.shape
    chance = torch.full(shape, float(probability)).masked_fill_(special_tokens_mask.bool(), 0.0)
    selected = torch.bernoulli(chance, generator=generator).bool()
    labels = input_ids.masked_fill(~selected, -100)
    to_mask = torch.bernoulli(torch.full(shape, 0.8), generator=generator).bool() & selected
    # Half of the remaining 20% of the selected tokens become random tokens, the other half stay.
    to_random = torch.bernoulli(torch.full(shape, 0.5), generator=generator).bool() & selected & ~to_mask
    random_ids = torch.randint(vocab_size, shape, dtype=torch.long, generator=generator)
    inputs = input_ids.masked_fill(to_mask, mask_token_id)
    inputs = torch.where(to_random, random_ids, inputs)
    return inputs, labels


def fixed_mlm_batches(
    dataset, tokenizer, n_chunks: int, batch_size: int, mlm_probability: float, seed: int = 0, causal: bool = False
):
    """The first ``n_chunks`` chunks masked once by a CPU generator seeded with ``seed`` alone: the same
    evaluation for every run, method and device, whatever the global RNG has been used for."""
    collator = MlmCollator(tokenizer, mlm_probability, generator=torch.Generator().manual_seed(seed), causal=causal)
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
    dataset, tokenizer, n_chunks: int, batch_size: int, mlm_probability: float, draws: int = 1, causal: bool = False
) -> list[dict[str, torch.Tensor]]:
    """The fixed held-out evaluation of a corpus: its first ``n_chunks`` chunks masked ``draws`` times, draw d by a
    generator seeded with d alone (draw 0 is the evaluation of earlier versions, bit for bit), one draw after the
    other; every batch names the chunks its rows are (``chunk_index``), so losses can be summed per chunk. A causal
    LM's evaluation draws nothing: every chunk once, every next token."""
    out = []
    for draw in range(1 if causal else draws):
        batches = fixed_mlm_batches(dataset, tokenizer, n_chunks, batch_size, mlm_probability, seed=draw, causal=causal)
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
