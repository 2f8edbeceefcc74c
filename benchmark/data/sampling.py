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
import math
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from benchmark.data.masking import MlmCollator
from benchmark.families import ModelFamily

SHUFFLE, MASKS, DROPOUT, REPLAY = 0, 1, 2, 3
"""What a derived seed is for (part of its derivation, so no two share a stream)."""

DOMAIN = 0
"""The source of a micro-batch's own-domain chunks; replay pool ``p`` is source ``p + 1``."""


def derived_seed(*parts: int) -> int:
    """A 64-bit seed for the stream named by ``parts`` (numpy's SeedSequence: well-mixed, independent
    streams for different tuples, e.g. ``(run seed, stage, MASKS, micro-batch index)``)."""
    entropy = [int(part) % (1 << 64) for part in parts]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


def replayed_by(share: float, chunks: int, updates: int) -> int:
    """Chunks a pool of ``share`` has replayed after ``updates`` updates of ``chunks`` chunks: the product rounded
    half up, with the share read as the decimal it was written as (0.05 is 1/20, so 0.05 x 16 x 5 is exactly 4)."""
    exact = Fraction(share).limit_denominator(1 << 20) * chunks * updates
    return math.floor(exact + Fraction(1, 2))


@dataclass(frozen=True)
class ReplayPlan:
    """How many chunks of every update come from each replay pool, and which ones.

    An update is the ``micro_per_update`` consecutive micro-batches of the global stream (every process's share of
    one optimizer step), ``B`` chunks in all. Pool ``p`` supplies ``share x B x u`` chunks over the first ``u``
    updates of a stage, rounded half up at every ``u`` (exact rational arithmetic): each update takes the floor or
    the ceiling of ``share x B`` and the stage's total is the nearest whole number to ``share x B x steps``. A share
    that is a multiple of ``1 / B`` is the same number in every update; any other is met on average, never
    rounded away (1% of 16 chunks is 4 chunks over 24 updates, not 0 in each). A later pool takes at most what the
    earlier ones leave. The update's replay slots are spread over its micro-batches as evenly as whole numbers
    allow (:meth:`counts`) and take the last positions of each; the pools fill them in order. Which chunk fills a
    slot is drawn uniformly, with replacement, from the micro-batch's own seed, so neither the counts nor the draws
    depend on the process layout."""

    shares: tuple[float, ...]
    sizes: tuple[int, ...]
    """Chunks in each pool (a share of an empty pool replays nothing)."""
    micro: int
    micro_per_update: int

    def totals(self, update: int) -> list[int]:
        """Replayed chunks of update ``update`` (0-based, within the stage), per pool."""
        chunks, out = self.micro * self.micro_per_update, []
        for share, size in zip(self.shares, self.sizes, strict=True):
            due = 0 if size == 0 else replayed_by(share, chunks, update + 1) - replayed_by(share, chunks, update)
            out.append(min(due, chunks - sum(out)))
        return out

    def counts(self, index: int) -> list[int]:
        """Replayed chunks of global micro-batch ``index``, per pool."""
        k, j = self.micro_per_update, index % self.micro_per_update
        totals = self.totals(index // k)
        everything = sum(totals)
        before, here = everything * j // k, everything * (j + 1) // k - everything * j // k
        out, start = [], 0
        for total in totals:  # replay slot q of the update belongs to the pool whose running total first exceeds q
            out.append(max(0, min(before + here, start + total) - max(before, start)))
            start += total
        return out

    def draw(self, seed: int, stage: int, index: int) -> list[tuple[int, int]]:
        """The ``(source, chunk index)`` of micro-batch ``index``'s replayed chunks, pool by pool."""
        generator = torch.Generator().manual_seed(derived_seed(seed, stage, REPLAY, index))
        out = []
        for pool, (count, size) in enumerate(zip(self.counts(index), self.sizes, strict=True)):
            out += [(pool + 1, int(i)) for i in torch.randint(size, (count,), generator=generator)] if count else []
        return out


class StageMicroBatches(Sampler[list[tuple[int, int, int]]]):
    """The stage's micro-batches of this process, without end: each is a list of ``(global index, source, example
    index)``. Epoch ``e`` of the domain's chunks is a permutation drawn from ``(seed, stage, SHUFFLE, e)``, cut into
    micro-batches (a short remainder is dropped, unless the dataset is smaller than one micro-batch); with a
    :class:`ReplayPlan`, the last positions of a micro-batch hold its replayed chunks instead."""

    def __init__(
        self,
        size: int,
        micro: int,
        seed: int,
        stage: int,
        rank: int = 0,
        world: int = 1,
        replay: ReplayPlan | None = None,
    ):
        self.size, self.micro, self.seed, self.stage, self.rank, self.world = size, micro, seed, stage, rank, world
        self.replay = replay

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        index = 0
        per_epoch = max(1, self.size // self.micro)
        for epoch in itertools.count():
            generator = torch.Generator().manual_seed(derived_seed(self.seed, self.stage, SHUFFLE, epoch))
            order = torch.randperm(self.size, generator=generator).tolist()
            for b in range(per_epoch):
                if index % self.world == self.rank:
                    own = [(index, DOMAIN, i) for i in order[b * self.micro : (b + 1) * self.micro]]
                    yield own if self.replay is None else self._with_replay(own, index)
                index += 1

    def _with_replay(self, own: list[tuple[int, int, int]], index: int) -> list[tuple[int, int, int]]:
        replayed = [(index, source, i) for source, i in self.replay.draw(self.seed, self.stage, index)]
        return own[: max(0, len(own) - len(replayed))] + replayed


class _Tagged(Dataset):
    """The domain's chunks (source 0) and the replay pools (sources 1, 2, ...) read with ``(global index, source,
    example index)`` keys; returns ``(global index, example)``."""

    def __init__(self, dataset: Dataset, pools: tuple[Dataset, ...] = ()):
        self.sources = (dataset, *pools)

    def __getitem__(self, key: tuple[int, int, int]):
        index, source, i = key
        return index, self.sources[source][i]

    def __len__(self) -> int:
        return len(self.sources[0])


class SeededMasking:
    """Collate a micro-batch into ``(global index, masked batch)``, its masks drawn from
    ``(seed, stage, MASKS, global index)``."""

    def __init__(self, tokenizer, mlm_probability: float, seed: int, stage: int, family: ModelFamily):
        self.collator = MlmCollator(tokenizer, mlm_probability, family=family)
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
    *,
    family: ModelFamily,
    replay: tuple[ReplayPlan, tuple[Dataset, ...]] | None = None,
) -> DataLoader:
    """This process's share of the stage's training stream: ``(global index, masked micro-batch)`` on the host,
    masked by ``workers`` worker processes ahead of use (the same batches as without: each is seeded by its index).
    ``replay``: the plan and its pools' datasets, when replaying."""
    plan, pools = replay if replay is not None else (None, ())
    return DataLoader(
        _Tagged(dataset, pools),
        batch_sampler=StageMicroBatches(len(dataset), micro, seed, stage, rank, world, plan),
        collate_fn=SeededMasking(tokenizer, mlm_probability, seed, stage, family),
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
