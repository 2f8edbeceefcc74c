"""The DAP training stream, drawn the same way whatever the process layout.

A stage's training stream is a sequence of micro-batches with global indices 0, 1, 2, ... Its shuffle
(per epoch), its masks (per micro-batch) and the dropout of each micro-batch's passes (see
:func:`seeded`) each come from a seed derived from the run seed, the stage, what is drawn and the index,
never from a running generator. So one process taking every micro-batch in turn and N processes each
taking every N-th one (process r: indices r, r + N, ...) train on the same micro-batches with the same
masks and dropout: a global batch of B = N x accum x micro is the same B chunks in both layouts, and a
multi-process run gives the single-process record up to the order of floating-point sums.

The order matches how accelerate shards a batch sampler across processes (batch r of every N to process r)
and how the training loop accumulates (an update takes the next ``accum`` micro-batches per process).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from benchmark.data.masking import MlmCollator

SHUFFLE, MASKS, DROPOUT = 0, 1, 2
"""What a derived seed is for (part of its derivation, so the three never share a stream)."""


def derived_seed(*parts: int) -> int:
    """A 64-bit seed for the stream named by ``parts`` (numpy's SeedSequence: well-mixed, independent
    streams for different tuples, e.g. ``(run seed, stage, MASKS, micro-batch index)``)."""
    entropy = [int(part) % (1 << 64) for part in parts]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


class StageMicroBatches(Sampler[list[tuple[int, int]]]):
    """The stage's micro-batches of this process, without end: each is a list of ``(global index, example
    index)``. Epoch ``e`` is a permutation drawn from ``(seed, stage, SHUFFLE, e)``, cut into micro-batches
    (a short remainder is dropped, unless the dataset is smaller than one micro-batch)."""

    def __init__(self, size: int, micro: int, seed: int, stage: int, rank: int = 0, world: int = 1):
        self.size, self.micro, self.seed, self.stage, self.rank, self.world = size, micro, seed, stage, rank, world

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        index = 0
        per_epoch = max(1, self.size // self.micro)
        for epoch in itertools.count():
            generator = torch.Generator().manual_seed(derived_seed(self.seed, self.stage, SHUFFLE, epoch))
            order = torch.randperm(self.size, generator=generator).tolist()
            for b in range(per_epoch):
                if index % self.world == self.rank:
                    yield [(index, i) for i in order[b * self.micro : (b + 1) * self.micro]]
                index += 1


class _Tagged(Dataset):
    """``dataset`` read with ``(global index, example index)`` keys; returns ``(global index, example)``."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __getitem__(self, key: tuple[int, int]):
        index, i = key
        return index, self.dataset[i]

    def __len__(self) -> int:
        return len(self.dataset)


class SeededMasking:
    """Collate a micro-batch into ``(global index, masked batch)``, its masks drawn from
    ``(seed, stage, MASKS, global index)``."""

    def __init__(self, tokenizer, mlm_probability: float, seed: int, stage: int, causal: bool = False):
        self.collator = MlmCollator(tokenizer, mlm_probability, causal=causal)
        self.seed, self.stage = seed, stage

    def __call__(self, tagged: list[tuple[int, dict]]) -> tuple[int, dict[str, torch.Tensor]]:
        """The micro-batch's global index and its masked batch."""
        index = tagged[0][0]
        generator = torch.Generator().manual_seed(derived_seed(self.seed, self.stage, MASKS, index))
        return index, self.collator.mask([example for _, example in tagged], generator)


def stage_stream(
    dataset: Dataset,
    tokenizer,
    micro: int,
    mlm_probability: float,
    seed: int,
    stage: int,
    rank: int,
    world: int,
    workers: int = 0,
    pin_memory: bool = False,
    causal: bool = False,
) -> DataLoader:
    """This process's share of the stage's training stream: ``(global index, masked micro-batch)`` on the host,
    masked by ``workers`` worker processes ahead of use (the same batches as without: each is seeded by its index)."""
    return DataLoader(
        _Tagged(dataset),
        batch_sampler=StageMicroBatches(len(dataset), micro, seed, stage, rank, world),
        collate_fn=SeededMasking(tokenizer, mlm_probability, seed, stage, causal),
        num_workers=workers,
        pin_memory=pin_memory,
        prefetch_factor=4 if workers else None,
    )


@contextlib.contextmanager
def seeded(seed: int, device: torch.device):
    """Inside the block the global RNGs (CPU and ``device``) start from ``seed``; after it they are as before.

    Dropout and any draw a method makes while computing its loss terms on a micro-batch then depend on
    that micro-batch alone, not on what this process computed earlier."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield
