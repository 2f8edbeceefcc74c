"""The held-out numbers a run compares against (the base model's losses, per-chunk sums and features, measured once
per run directory) and the fixed probe of the general corpus that methods may read (``DomainContext.general_probe``).
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmark.data.corpora import load_heldout_text
from benchmark.data.masking import fixed_mlm_batches
from benchmark.engine.evaluation import DeviceBatches, heldout_evaluation, heldout_features
from benchmark.engine.workfiles import finished, read_work_file, write_work_file
from benchmark.errors import CorruptStateError
from benchmark.io import atomic_write_bytes
from benchmark.modeling import load_lm


class BaseEvaluation:
    """The base model's held-out losses (per set, and per chunk) and features, measured once per run directory."""

    def __init__(self, parts):
        self.parts = parts

    def losses(self) -> dict[str, float]:
        """Per held-out set, the base model's MLM loss."""
        return self._measured()["losses"]

    def seconds(self) -> float | None:
        """Seconds the base model's evaluation took (loading it included); None in a run folder made before they
        were recorded."""
        return self._measured().get("seconds")

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
        layout, data, device = self.parts.layout, self.parts.data, self.parts.accelerator.device
        main = self.parts.accelerator.is_main_process
        if not (finished(layout.base_losses, "base MLM-loss file", main) and layout.base_features.exists()):
            start = time.perf_counter()
            model, _ = load_lm(self.parts.config.model)
            model, processes = model.to(device), self.parts.accelerator
            features = heldout_features(model, data.feature_batches(), device, processes=processes)
            losses = heldout_evaluation(model, data.heldout_batches, device, processes=processes)
            if processes.is_main_process:
                atomic_write_bytes(layout.base_features, lambda tmp: np.savez(tmp, **features))
                seconds = round(time.perf_counter() - start, 3)
                write_work_file(layout.base_losses, {**vars(losses), "seconds": seconds})
            processes.wait_for_everyone()
        return read_work_file(layout.base_losses, "base MLM-loss file")


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
