"""The held-out numbers a run compares against (the base model's losses, per-chunk sums and features, measured once
per run directory, and once per work folder for every run that would measure them alike) and the fixed probe of the
general corpus that methods may read (``DomainContext.general_probe``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmark.data.corpora import load_heldout_text
from benchmark.data.masking import fixed_mlm_batches
from benchmark.engine.evaluation import DeviceBatches, HeldoutLosses, heldout_evaluation, heldout_features
from benchmark.engine.workfiles import finished, read_work_file, write_work_file
from benchmark.errors import CorruptStateError
from benchmark.io import atomic_write_bytes
from benchmark.modeling import load_lm


class BaseEvaluation:
    """The base model's held-out losses (per set, and per chunk) and features, measured once per run directory.

    Every run of a group evaluates the same base model on the same held-out batches, whatever its method and seed, so
    a single-process run first looks for them in the work folder's :class:`BaseEvaluationCache` and copies them from
    there (the same numbers, bit for bit, without the minute a ``mini`` run spends measuring them); a run that
    measures them adds them to it.
    """

    def __init__(self, parts):
        self.parts = parts

    def losses(self) -> dict[str, float]:
        """Per held-out set, the base model's MLM loss."""
        return self._measured()["losses"]

    def seconds(self) -> float | None:
        """Seconds the base model's evaluation took (loading it included); None in a run folder made before they
        were recorded."""
        return self._measured().get("seconds")

    def evaluation(self, sets: Iterable[str]) -> HeldoutLosses:
        """The base model's losses and chunk sums on the held-out ``sets``, as a stage's evaluation gives them."""
        names, measured = list(sets), self._measured()  # one read of the file for both
        losses, chunk_sums = measured["losses"], measured["chunk_sums"]
        return HeldoutLosses({n: losses[n] for n in names}, {n: chunk_sums[n] for n in names})

    def chunk_sums(self) -> dict[str, list[float]]:
        """Per held-out set and chunk, the base model's summed loss of the chunk's masked tokens."""
        return self._measured()["chunk_sums"]

    def features(self) -> dict[str, np.ndarray]:
        """Per held-out set, the base model's mean-pooled features (inputs x hidden)."""
        self._measured()
        path = self.parts.layout.base_features
        try:
            with np.load(path, allow_pickle=False) as saved:  # a zip archive: each array's CRC is checked
                return {name: saved[name] for name in saved.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise CorruptStateError(
                f"base feature file {path} is corrupt ({exc})", "delete it and run again: it is measured anew"
            ) from exc

    def _measured(self) -> dict[str, Any]:
        layout, processes = self.parts.layout, self.parts.accelerator
        done = finished(layout.base_losses, "base MLM-loss file", processes.is_main_process)
        if not (done and layout.base_features.exists()):
            start = time.perf_counter()
            # One process only: with several, each would have to reach the same hit or miss, and another run may fill
            # the entry between their looks.
            cache = BaseEvaluationCache.of(self.parts) if processes.num_processes == 1 else None
            if not (cache and cache.copy_to(layout.base_features, layout.base_losses, start)):
                self._measure(start)
                if cache:
                    cache.add(layout.base_features, layout.base_losses)
            processes.wait_for_everyone()
        return read_work_file(layout.base_losses, "base MLM-loss file")

    def _measure(self, start: float) -> None:
        """Evaluate the base model and write its numbers into the run directory (main process)."""
        layout, data, device = self.parts.layout, self.parts.data, self.parts.accelerator.device
        model, _ = load_lm(self.parts.config.model)
        model, processes = model.to(device), self.parts.accelerator
        features = heldout_features(model, data.feature_batches(), device, processes=processes)
        losses = heldout_evaluation(model, data.heldout_batches, device, processes=processes)
        if processes.is_main_process:
            atomic_write_bytes(layout.base_features, lambda tmp: np.savez(tmp, **features))
            seconds = round(time.perf_counter() - start, 3)
            write_work_file(layout.base_losses, {**vars(losses), "seconds": seconds})


BASE_EVALUATION_SOURCES = (
    "benchmark.engine.evaluation",
    "benchmark.engine.heldout",
    "benchmark.modeling",
    "benchmark.families.base",
    "benchmark.families.masked",
    "benchmark.families.causal",
)
"""The modules whose code computes the base evaluation: their source is part of a cache entry's key, so an edit to
them (a fix of the loss, another feature pooling) is measured anew, never served from an older entry."""


class BaseEvaluationCache:
    """A work folder's store of base-model evaluations, one entry per key (``<work_dir>/cache/base-evaluation/<key>``).

    The key is a hash of everything the base evaluation's numbers depend on: the base model's files, every tensor of
    the held-out batches (inputs, masks, targets, chunk indices: the profile's data, masking and batching all end
    there), which chunks the features read, the code that evaluates, the package versions, the device and its float
    kernels, the thread count and the float32 matmul precision. Runs that differ in any of them get other entries;
    runs that differ only in method or seed share one. An entry is written whole by a run that measured it, each file
    atomically and the losses last, so an entry is complete exactly when its losses file is intact.
    """

    def __init__(self, folder: Path):
        self.folder = folder

    @classmethod
    def of(cls, parts) -> BaseEvaluationCache:
        """The entry of this run's base evaluation."""
        return cls(Path(parts.config.work_dir) / "cache" / "base-evaluation" / base_evaluation_key(parts))

    @property
    def losses(self) -> Path:
        """The entry's losses file (a work file: checksummed)."""
        return self.folder / "base-mlm-loss.json"

    @property
    def features(self) -> Path:
        """The entry's features file (an npz archive: CRC-checked)."""
        return self.folder / "base-features.npz"

    def copy_to(self, features: Path, losses: Path, start: float) -> bool:
        """Copy the entry's numbers into a run directory (features first, losses last, as a measurement writes them);
        False, and nothing written, when there is no intact entry. ``seconds`` is this run's time: the copy's."""
        if not self.losses.exists():
            return False
        try:
            content = read_work_file(self.losses, "cached base MLM-loss file")
            with np.load(self.features, allow_pickle=False) as saved:  # reads every array: their CRCs are checked
                [saved[name] for name in saved.files]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, CorruptStateError) as exc:
            print(
                f"dapbench: base-evaluation cache entry {self.folder.name} is unreadable ({exc}): measured anew",
                file=sys.stderr,
            )
            return False
        atomic_write_bytes(features, lambda tmp: shutil.copyfile(self.features, tmp))
        seconds = round(time.perf_counter() - start, 3)
        write_work_file(losses, {**content, "seconds": seconds, "measured_seconds": content["seconds"]})
        return True

    def add(self, features: Path, losses: Path) -> None:
        """Make the run directory's fresh measurement the entry (the same numbers; concurrent writers write the same
        bytes, each file atomically)."""
        content = read_work_file(losses, "base MLM-loss file")
        atomic_write_bytes(self.features, lambda tmp: shutil.copyfile(features, tmp))
        write_work_file(self.losses, {k: v for k, v in content.items() if k in ("losses", "chunk_sums", "seconds")})


def base_evaluation_key(parts) -> str:
    """The cache key of a run's base evaluation (see :class:`BaseEvaluationCache`)."""
    from benchmark.engine.environment import cpu_kernels, package_versions

    data, device = parts.data, parts.accelerator.device
    digest = hashlib.sha256()
    for name in sorted(data.heldout_batches):
        digest.update(f"set {name}\n".encode())
        for batch in data.heldout_batches[name]:
            for key in sorted(batch):
                tensor = batch[key].contiguous()
                digest.update(f"{key} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
                digest.update(tensor.cpu().numpy().tobytes())
    for module in BASE_EVALUATION_SOURCES:
        digest.update(Path(sys.modules[module].__file__).read_bytes())
    facts = {
        "model": data.checksums["model"],
        "family": data.family.name,
        "feature_chunks": data.feature_chunks,
        "heldout_draws": data.heldout_draws,
        "versions": package_versions(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_kernels(),
        "threads": torch.get_num_threads(),
        "matmul_precision": torch.get_float32_matmul_precision(),
    }
    digest.update(json.dumps(facts, sort_keys=True).encode())
    return digest.hexdigest()[:24]


class GeneralProbe:
    """A fixed masked subset of the general training corpus (``general_corpus``), loaded on first use; what
    ``DomainContext.general_probe`` returns (None when no general corpus is configured)."""

    def __init__(self, parts):
        self.parts = parts
        self._batches: list[dict] | None = None
        self._chunks = None

    def training_chunks(self):
        """The general training text's packed chunks (loaded once; the replay pool of ``replay.general``)."""
        p, dap = self.parts, self.parts.config.dap
        if self._chunks is None:
            cache = Path(p.config.work_dir) / "cache"
            self._chunks, _ = load_heldout_text(
                "general-train",
                p.config.general_corpus,
                p.data.tokenizer,
                dap.seq_len,
                cache,
                max_lines=dap.max_corpus_lines,
                family=p.data.family,
            )
        return self._chunks

    def __call__(self) -> DeviceBatches | None:
        """The probe batches on the run's device (None without a general corpus)."""
        p, dap = self.parts, self.parts.config.dap
        if not p.config.general_corpus:
            return None
        if self._batches is None:
            self._batches = fixed_mlm_batches(
                self.training_chunks(),
                p.data.tokenizer,
                dap.probe_chunks,
                dap.probe_batch_size,
                dap.mlm_probability,
                seed=999,
                family=p.data.family,
            )
        return DeviceBatches(self._batches, p.accelerator.device)
