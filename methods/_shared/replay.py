"""Reservoir sampling (Vitter's algorithm R) and replay-batch assembly for DER++ (pure functions)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch


def reservoir_slot(seen: int, capacity: int, rng: random.Random) -> int | None:
    """Where the ``seen``-th item (0-based) of a stream goes in a reservoir of ``capacity``, or None.

    After n items every item is in the reservoir with probability capacity / n (a uniform sample).
    """
    if seen < capacity:
        return seen
    slot = rng.randint(0, seen)
    return slot if slot < capacity else None


@dataclass
class ReplayItem:
    """One stored chunk: masked input, MLM targets and the model's outputs when it was stored."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    """Masked positions within the chunk."""
    targets: torch.Tensor
    outputs: torch.Tensor
    """Final hidden states at the masked positions at storage time (float16)."""


@dataclass
class Reservoir:
    """A uniform sample of one domain's training stream within a token budget."""

    capacity: int
    seen: int = 0
    items: list[ReplayItem] = field(default_factory=list)

    def to_plain(self) -> dict:
        """Tensors and plain values only (a checkpoint is loaded with ``weights_only``)."""
        return {"capacity": self.capacity, "seen": self.seen, "items": [vars(item).copy() for item in self.items]}

    @classmethod
    def from_plain(cls, state: dict) -> Reservoir:
        """The reservoir :meth:`to_plain` describes."""
        return cls(state["capacity"], state["seen"], [ReplayItem(**item) for item in state["items"]])

    def decide(self, rng: random.Random) -> int | None:
        """Count the next stream item and return its slot, or None if it is not kept (the item itself is not
        needed: the decision depends on the count and ``rng`` alone)."""
        slot = reservoir_slot(self.seen, self.capacity, rng)
        self.seen += 1
        return slot

    def place(self, slot: int, item: ReplayItem) -> None:
        """Put a kept item in the slot :meth:`decide` gave it."""
        if slot == len(self.items):
            self.items.append(item)
        else:
            self.items[slot] = item


def collate_replay(items: list[ReplayItem], device) -> dict[str, torch.Tensor]:
    """Stack stored chunks into a batch with flat MLM positions, like the MLM collator's output."""
    length = items[0].input_ids.shape[0]
    # Assembled on the host outside autocast: a CPU run's bf16 autocast refuses to concatenate the stored float16
    # outputs (it promotes only between float32 and its own bf16); the bytes are the same either way.
    with torch.autocast("cpu", enabled=False):
        flat = torch.cat([item.positions + row * length for row, item in enumerate(items)])
        batch = {
            "input_ids": torch.stack([item.input_ids for item in items]),
            "mlm_positions": flat,
            "mlm_targets": torch.cat([item.targets for item in items]),
            "stored_outputs": torch.cat([item.outputs for item in items]),
        }
    return {key: value.to(device) for key, value in batch.items()}
