"""Run identity: a run id hashes what determines the run's numbers, and nothing else.

In the hash: the resolved configuration without locations (output and work folders, input paths,
device choice, the lists of methods and seeds being run), the resolved domain order, only this
method's own options, the code's declared numerics version (:data:`RESULTS_VERSION` and the method's
``version``), and content checksums of every input: corpora, end tasks, general text, base model
weights and tokenizer files. So a changed label in an end-task file or one changed byte of a corpus
gives a new id (an old result is never reused silently), while a checkout at another path, a trailing
``/`` or another ``--output-dir`` keeps the id.

Hashing a base model's files on every run would cost seconds on paper-size checkpoints; file hashes
are cached by path, size and modification time (:class:`FileHashCache`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from benchmark.config import RunConfig
from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_json, file_sha256

RESULTS_VERSION = 3
"""Bumped when a change of the core changes the numbers of an unchanged configuration (masking, evaluation,
the training loop): every run id changes with it, so no record of the old code is mistaken for a new one.
A method bumps its own ``ContinualMethod.version`` for the same reason. 3: the training stream is drawn per
micro-batch (:mod:`benchmark.sampling`), the same for any number of processes."""

LOCATION_FIELDS = ("output_dir", "work_dir", "keep_checkpoints", "methods", "seeds", "device", "profile")
"""Config fields that say where or what to run, not what a run computes."""

NUMERICS_NEUTRAL_DAP_FIELDS = ("loader_workers",)
"""``dap`` fields that change how fast a run goes, not what it computes."""

INPUT_PATH_FIELDS = ("model", "data_root", "general_heldout", "general_corpus")
"""Config fields that locate inputs: their contents enter the identity (as checksums), their paths do not."""


class FileHashCache:
    """SHA-256 of files, remembered by (resolved path, size, mtime) in a JSON file, so each file is read once."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: dict[str, str] = {}
        if path.is_file():
            try:
                self.entries = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                self.entries = {}  # a cache, not a result: rebuilt when unreadable
        self.changed = False

    def digest(self, file: Path) -> str:
        """The file's SHA-256 (hex), from the cache when the file's size and mtime are unchanged."""
        stat = file.stat()
        key = f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
        if key not in self.entries:
            self.entries[key] = file_sha256(file)
            self.changed = True
        return self.entries[key]

    def save(self) -> None:
        """Write the cache back if a new file was hashed."""
        if self.changed:
            atomic_write_json(self.path, self.entries)
            self.changed = False


MODEL_FILES = ("config.json", "*.safetensors", "*.bin", "tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json",
               "added_tokens.json", "*.model")  # fmt: skip
"""The files of a model directory that determine what a run computes: weights, architecture config, tokenizer.
Anything else (a training report with timings, a README) does not enter the checksum."""


def model_checksum(name_or_path: str, cache: FileHashCache) -> str:
    """A checksum of the base model's files (:data:`MODEL_FILES`) in a local directory or the local snapshot of
    a hub id."""
    directory = _model_directory(name_or_path)
    files = sorted({p for pattern in MODEL_FILES for p in directory.glob(pattern) if p.is_file()})
    if not files:
        raise DapbenchError(f"the model directory {directory} holds no files", "pass --model with a masked LM")
    combined = hashlib.sha256()
    for file in files:
        combined.update(f"{file.name}\0{cache.digest(file)}\n".encode())
    return combined.hexdigest()[:16]


def file_checksum(path: str | Path, cache: FileHashCache) -> str:
    """A short checksum of one input file's bytes."""
    return cache.digest(Path(path))[:16]


def _model_directory(name_or_path: str) -> Path:
    local = Path(name_or_path)
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model"]
    try:
        return Path(snapshot_download(name_or_path, allow_patterns=patterns))
    except Exception as exc:  # noqa: BLE001 - hub errors have many types; all mean "cannot resolve"
        raise DapbenchError(
            f"cannot resolve the model {name_or_path!r} to files (no such directory, and the hub said: {exc})",
            "pass --model with a local model directory, or a hub id that is cached or reachable",
        ) from exc


def identity_payload(
    config: RunConfig, method: str, domains: tuple[str, ...], inputs: Mapping[str, str], method_version: int = 1
) -> dict:
    """Everything the run id of ``method`` in ``config`` hashes (see the module docstring)."""
    resolved = config.to_dict()
    for key in (*LOCATION_FIELDS, *INPUT_PATH_FIELDS, "sequence"):
        resolved.pop(key)
    for key in NUMERICS_NEUTRAL_DAP_FIELDS:
        resolved["dap"].pop(key)
    resolved["method_options"] = dict(config.method_options.get(method, {}))
    return {
        "config": resolved,
        "domains": list(domains),
        "method": method,
        "code": {"results_version": RESULTS_VERSION, "method_version": method_version},
        "inputs": dict(sorted(inputs.items())),
    }


def run_id(
    config: RunConfig,
    method: str,
    seed: int,
    domains: tuple[str, ...],
    inputs: Mapping[str, str],
    method_version: int = 1,
) -> str:
    """``<method>-<sequence>-seed<seed>-<hash>``: the name of a run's record and of its work directory.

    The number of processes is not in it: N processes draw the training stream one process draws
    (:mod:`benchmark.sampling`), so they compute the same run up to the order of floating-point sums."""
    payload = identity_payload(config, method, domains, inputs, method_version)
    digest = hashlib.sha256(json.dumps({**payload, "seed": seed}, sort_keys=True).encode()).hexdigest()[:10]
    return f"{method}-{sequence_tag(config.sequence, domains)}-seed{seed}-{digest}"


def sequence_tag(sequence: str, domains: tuple[str, ...]) -> str:
    """The sequence's name (``seq0``), or ``custom-`` and the domains for an explicit list."""
    return sequence.strip() if "," not in sequence else "custom-" + "-".join(domains)


def shared_cache_path(work_dir: str | Path) -> Path:
    """Where the file-hash cache of a work folder lives (beside the data caches)."""
    return Path(os.fspath(work_dir)) / "cache" / "file-hashes.json"
