"""A run's work directory: where each unit of finished work lives, and how checkpoints are saved and read.

One directory per run id under ``<work_dir>/runs/``::

    base-mlm-loss.json      the base model's held-out losses (measured once)
    base-features.npz       the base model's held-out features (for representation drift)
    elapsed.json            the run's wall time summed over invocations (:class:`RunClock`)
    domain-<t>.json         domain t is finished: its training and held-out statistics
    checkpoint-<t>/         model, tokenizer, method state and RNG after domain t (written atomically)
    finetune/<row>-task<k>.json   one finished cell A[t][k]
    finetune/<row>-task<k>-<protocol>.json   the same cell scored by the protocol beside (``finetune.beside``)

A file exists only when its unit of work is complete, so resuming is "skip what exists".
Checkpoints hold tensors and plain values only and are read with ``weights_only``: resuming from a
work directory someone else made cannot run their code.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmark.errors import CorruptStateError, DapbenchError
from benchmark.io import atomic_directory, atomic_write_json, read_json, verify_manifest, write_manifest


@dataclass(frozen=True)
class RunPaths:
    """The paths of one run's work directory (see the module docstring)."""

    root: Path

    def checkpoint(self, t: int) -> Path:
        """The checkpoint directory after domain ``t``."""
        return self.root / f"checkpoint-{t}"

    def domain_done(self, t: int) -> Path:
        """The statistics file whose existence marks domain ``t`` as finished."""
        return self.root / f"domain-{t}.json"

    def finetune_cell(self, row_key: str, k: int, beside: str | None = None) -> Path:
        """The result file of end task ``k`` fine-tuned from checkpoint ``row_key`` (scored by the protocol
        ``beside`` the run's own, when named: ``finetune.beside``)."""
        name = f"{row_key}-task{k}" if beside is None else f"{row_key}-task{k}-{beside}"
        return self.root / "finetune" / f"{name}.json"

    @property
    def base_losses(self) -> Path:
        """The base model's held-out losses."""
        return self.root / "base-mlm-loss.json"

    @property
    def base_features(self) -> Path:
        """The base model's held-out features."""
        return self.root / "base-features.npz"

    @property
    def clock(self) -> Path:
        """The run-time ledger of :class:`RunClock`."""
        return self.root / "elapsed.json"


@dataclass(frozen=True)
class RunLayout(RunPaths):
    """A run's work directory: its paths, and checkpoints written atomically and read only when intact."""

    def save_checkpoint(self, t: int, model, tokenizer, method_state: dict[str, Any]) -> None:
        """Model, tokenizer, method state and the RNG streams after domain ``t``, as one atomic directory."""

        def fill(tmp: Path) -> None:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            torch.save(method_state, tmp / "method_state.pt")
            torch.save(rng_state(), tmp / "rng.pt")
            write_manifest(tmp)  # last: a checkpoint is read only if every file is the one written here

        atomic_directory(self.checkpoint(t), fill)

    def discard_checkpoint(self, t: int) -> None:
        """Delete checkpoint ``t`` if it exists (its fine-tunes are done and the next stage has started)."""
        if self.checkpoint(t).exists():
            shutil.rmtree(self.checkpoint(t))

    def verified_checkpoint(self, t: int) -> Path:
        """Checkpoint ``t``'s directory after checking every file against its manifest: a missing, truncated
        or altered checkpoint is a named error, never a silently different model (hashing costs well under a
        second per roberta-base checkpoint, against minutes of work per domain)."""
        path = self.checkpoint(t)
        if not path.is_dir():
            raise CorruptStateError(f"checkpoint after domain {t} {path} is missing", _redo_advice(self, t))
        verify_manifest(path, f"checkpoint after domain {t}", _redo_advice(self, t))
        return path

    def method_state(self, t: int) -> Any:
        """The method state saved with checkpoint ``t`` (tensors and plain values only)."""
        return load_plain(self.verified_checkpoint(t) / "method_state.pt", "method state")

    def restore_rng(self, t: int, fallback_seed: int) -> None:
        """Continue the RNG streams saved with checkpoint ``t`` (so resuming changes nothing); seed
        ``fallback_seed`` when there is none (the first domain, or a method without checkpoints)."""
        from transformers import set_seed

        if t < 0 or not (self.checkpoint(t) / "rng.pt").exists():
            set_seed(fallback_seed)
            return
        path = self.verified_checkpoint(t) / "rng.pt"
        set_rng_state(load_plain(path, "RNG state"))


def _redo_advice(layout: RunLayout, t: int) -> str:
    """How to recover from a bad checkpoint ``t``: redo domain ``t`` where the checkpoint before it exists,
    else the whole run (checkpoints of finished domains are deleted as the run goes on)."""
    if t == 0 or layout.checkpoint(t - 1).is_dir():
        return (
            f"delete {layout.checkpoint(t)} and {layout.domain_done(t)}, then run the same command again:"
            f" domain {t} is retrained from the checkpoint before it (later domains only if theirs are gone too)"
        )
    return f"delete the run directory {layout.root} and run the same command again: the run starts over"


class RunClock:
    """Wall time of one run summed over the invocations that produced it.

    Saved after every finished unit of work (base losses, a domain, a fine-tune), so a run stopped
    and resumed still reports the time of the work its record is made of; the unfinished unit an
    interruption threw away is not counted (it is redone, and counted, by the resuming invocation).
    """

    def __init__(self, path: Path, on_cpu: bool = True):
        """``on_cpu``: the run computes on the CPU, so its thread count is part of its numbers (kept on resume)."""
        self.path = path
        earlier = read_json(path, "run time ledger") if path.exists() else {"seconds": 0.0, "invocations": 0}
        self.earlier_seconds = float(earlier["seconds"])
        self.invocations = int(earlier["invocations"]) + 1
        self.threads = torch.get_num_threads()
        started_at = earlier.get("torch_threads", self.threads)  # ledgers written before threads were kept: unknown
        if on_cpu and started_at != self.threads:
            # a CPU's float sums follow the thread count: the finished stages were computed at the other one, and the
            # record would name this invocation's count beside their numbers
            raise DapbenchError(
                f"this run started at {started_at} CPU thread(s) and is resumed at {self.threads}: its stages would mix"
                " numbers of two thread counts under one",
                f"resume it at OMP_NUM_THREADS={started_at} (or delete {path.parent} to start it again)",
            )
        self.started = time.time()

    def this_invocation(self) -> float:
        """Seconds since this invocation started."""
        return time.time() - self.started

    def total(self) -> float:
        """Seconds of kept work over all invocations, this one up to now included."""
        return self.earlier_seconds + self.this_invocation()

    def save(self) -> None:
        """Persist the total so far (called after each finished unit of work)."""
        ledger = {"seconds": round(self.total(), 3), "invocations": self.invocations, "torch_threads": self.threads}
        atomic_write_json(self.path, ledger)


def rng_state() -> dict:
    """Python, numpy, torch and CUDA RNG states as tensors and plain values (no pickled objects)."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_plain(path: Path, what: str) -> Any:
    """``torch.load`` restricted to tensors and plain Python values (``weights_only``): a checkpoint from
    someone else cannot run code when a run resumes from it."""
    import pickle

    try:
        return torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError) as exc:
        raise DapbenchError(
            f"{what} file {path} is corrupt or holds objects other than tensors and plain values: refused ({exc})",
            f"delete the run directory {path.parent.parent} and run again (finished domains are recomputed)",
        ) from exc


@contextlib.contextmanager
def run_lock(run_root: Path) -> Iterator[bool]:
    """Yield True while this process holds the run directory's lock, False (at once) if another one does:
    two commands over overlapping grids in one folder never train the same run twice at the same time."""
    from filelock import FileLock, Timeout

    run_root.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(run_root) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


STAGE_FILE = re.compile(r"domain-(\d+)\.json")
"""The name of a finished stage's statistics file (:meth:`RunPaths.domain_done`)."""


def link_finished_stages(source: RunPaths, target: RunPaths) -> None:
    """Give the run folder ``target`` the finished DAP stages of the run folder ``source``: its base-model evaluation,
    every stage's statistics file and checkpoint, as hard links (copies where the file system has none), never its
    end-task cells or time ledger. Every stage must have kept its checkpoint; a ``target`` that exists already (an
    interrupted re-scoring) is resumed as it is. Nothing in ``source`` is changed: the runner replaces files
    atomically, never writing into a linked one."""
    if target.root.exists():
        return
    found = source.root.glob("domain-*.json") if source.root.is_dir() else []
    stages = sorted(int(m.group(1)) for p in found if (m := STAGE_FILE.fullmatch(p.name)))
    missing = [t for t in stages if not source.checkpoint(t).is_dir()]
    if not stages or missing:
        where = f"stages {missing} kept no checkpoint" if missing else "it holds no finished stage"
        raise DapbenchError(
            f"the run folder {source.root} cannot be re-scored: {where}",
            "re-run it with --set keep_checkpoints=true (every stage's checkpoint is kept) in this --work-dir",
        )
    staging = RunPaths(target.root.with_name(f".{target.root.name}.linking"))
    shutil.rmtree(staging.root, ignore_errors=True)  # our own half-made folder of an interrupted attempt
    files = [source.base_losses, source.base_features, *(source.domain_done(t) for t in stages)]
    for t in stages:
        files += [p for p in source.checkpoint(t).rglob("*") if p.is_file()]
    for path in files:
        if path.is_file():
            _link(path, staging.root / path.relative_to(source.root))
    staging.root.rename(target.root)  # the run folder appears whole or not at all


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another file system, or links refused: a copy holds the same bytes
        shutil.copy2(source, target)
