"""Held-out evaluation of a DAP model: MLM loss per held-out set and representation drift from the base model.

Both run in eval mode (no dropout) on the fixed held-out batches of :class:`benchmark.data.inputs.RunData`,
whose masks come from a generator the project owns, so every method and device sees the same batches.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from benchmark.errors import NonFiniteError
from benchmark.metrics import anisotropy, linear_cka, mean_cosine
from benchmark.modeling import encoder_of, mean_pool, mlm_forward, model_mode
from benchmark.records.schema import CHUNK_SUM_DECIMALS

Batches = Mapping[str, list[dict[str, torch.Tensor]]]
View = Callable[[str], contextlib.AbstractContextManager]
"""Maps a held-out set's name to the context the model is evaluated in on it (a method's ``heldout_view``)."""


def _as_is(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


class DeviceBatches:
    """A re-iterable view of host batches that moves each batch to ``device`` as it is read (the probe
    loaders methods iterate several times, and the held-out sets)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]], device):
        self.batches, self.device = batches, device

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for batch in self.batches:
            yield {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def __len__(self) -> int:
        return len(self.batches)


@dataclass
class HeldoutLosses:
    """Held-out MLM losses of one model: per set the mean loss per masked token (5 decimals), and per set and
    held-out chunk the summed loss of the chunk's masked tokens over every mask draw (4 decimals), from which the
    report bootstraps over chunks (the evaluation sample's own error)."""

    losses: dict[str, float]
    chunk_sums: dict[str, list[float]]


@torch.no_grad()
def heldout_evaluation(model, heldout: Batches, device, view: View = _as_is, processes=None) -> HeldoutLosses:
    """Mean MLM loss per masked token of ``model`` on every held-out set, and its per-chunk sums.

    With several ``processes`` (accelerate's state) each evaluates every N-th batch and the sums are reduced,
    so every process returns the numbers of the whole set."""
    with model_mode(model, training=False):
        losses, chunks = {}, {}
        for name, batches in heldout.items():
            total, count, sums = 0.0, 0, {}
            with view(name):
                for batch in DeviceBatches(_share(batches, processes), device):
                    loss, token_losses = _batch_losses(model, batch)
                    n = int(batch["mlm_targets"].numel())
                    total += float(loss) * n  # as before per-chunk sums existed: the set's loss keeps its digits
                    count += n
                    _add_chunk_sums(sums, batch, token_losses)
            if _several(processes):
                total, count = _summed(processes, total, count, device)
                sums = _merged(processes, sums)
            if not math.isfinite(total):
                raise NonFiniteError(
                    f"the held-out MLM loss on {name!r} is not finite",
                    "the model holds NaN or infinite weights: lower dap.lr or check the method",
                )
            losses[name] = round(total / count, 5)
            chunks[name] = [round(sums[c], CHUNK_SUM_DECIMALS) for c in sorted(sums)]
    return HeldoutLosses(losses, chunks)


def heldout_losses(model, heldout: Batches, device, view: View = _as_is, processes=None) -> dict[str, float]:
    """Mean MLM loss per masked token of ``model`` on every held-out set (5 decimals)."""
    return heldout_evaluation(model, heldout, device, view, processes).losses


def _batch_losses(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's mean MLM loss (the training loss's computation) and the loss of every masked token."""
    loss, _, logits = mlm_forward(model, batch)
    token_losses = F.cross_entropy(logits.float(), batch["mlm_targets"], reduction="none")
    return loss, token_losses


def _add_chunk_sums(sums: dict[int, float], batch, token_losses: torch.Tensor) -> None:
    """Add each masked token's loss to its held-out chunk's sum. ``batch["chunk_index"]`` names the rows' chunks
    (:func:`benchmark.data.masking.heldout_mlm_batches`); batches without it count as new chunks, one per row."""
    size = batch["input_ids"].shape[0]
    rows = batch["mlm_positions"] // batch["input_ids"].shape[1]
    per_row = torch.zeros(size, dtype=torch.float64, device=token_losses.device)
    per_row.index_add_(0, rows, token_losses.double())
    chunks = batch["chunk_index"].tolist() if "chunk_index" in batch else range(len(sums), len(sums) + size)
    for chunk, value in zip(chunks, per_row.tolist(), strict=True):
        sums[chunk] = sums.get(chunk, 0.0) + value


def _merged(processes, sums: dict[int, float]) -> dict[int, float]:
    """Every process's per-chunk sums, added (a chunk's draws may sit in batches of different processes)."""
    from accelerate.utils import gather_object

    merged: dict[int, float] = {}
    for part in gather_object([sums]):
        for chunk, value in part.items():
            merged[chunk] = merged.get(chunk, 0.0) + value
    return merged


@torch.no_grad()
def heldout_features(model, heldout: Batches, device, view: View = _as_is, processes=None) -> dict[str, np.ndarray]:
    """Per held-out set: the mean over tokens of the last hidden state of every unmasked input (inputs x hidden).
    With several ``processes`` each computes every N-th batch and all of them receive every row, in order."""
    encoder = encoder_of(model)
    with model_mode(model, training=False):
        out = {}
        for name, batches in heldout.items():
            rows = []
            with view(name):
                for batch in DeviceBatches(_share(batches, processes), device):
                    mask = batch.get("attention_mask")
                    hidden = encoder(input_ids=batch["original_ids"], attention_mask=mask).last_hidden_state.float()
                    rows.append(mean_pool(hidden, mask).cpu().numpy())
            out[name] = np.concatenate(_in_batch_order(rows, processes))
            if not np.isfinite(out[name]).all():
                raise NonFiniteError(
                    f"the held-out features of {name!r} are not finite", "the model holds NaN or infinite weights"
                )
    return out


def representation_drift(base: Mapping[str, np.ndarray], current: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """How far the current model's held-out features moved from the base model's: per held-out set and
    over all sets together, the mean cosine between an input's two features, their linear CKA, and the
    current features' anisotropy (5 decimals)."""
    names = list(current)
    views = {name: (base[name], current[name]) for name in names}
    views["all"] = (np.concatenate([base[n] for n in names]), np.concatenate([current[n] for n in names]))
    return {
        name: {
            "cosine_to_base": round(mean_cosine(before, after), 5),
            "cka_to_base": round(linear_cka(before, after), 5),
            "anisotropy": round(anisotropy(after), 5),
        }
        for name, (before, after) in views.items()
    }


def _several(processes) -> bool:
    return processes is not None and processes.num_processes > 1


def _share(batches: list, processes) -> list:
    """This process's batches: every N-th one from its rank (all of them in one process)."""
    return batches[processes.process_index :: processes.num_processes] if _several(processes) else batches


def _summed(processes, total: float, count: int, device) -> tuple[float, int]:
    """``total`` and ``count`` summed over the processes (float64, on the device the backend needs)."""
    from accelerate.utils import reduce

    both = reduce(torch.tensor([total, float(count)], dtype=torch.float64, device=device), "sum")
    return float(both[0]), int(both[1])


def _in_batch_order(rows: list[np.ndarray], processes) -> list[np.ndarray]:
    """Every process's per-batch rows, back in the order of the batches (batch i came from process i % N)."""
    if not _several(processes):
        return rows
    from accelerate.utils import gather_object

    parts, n = gather_object([rows]), processes.num_processes
    return [parts[i % n][i // n] for i in range(sum(len(part) for part in parts))]
