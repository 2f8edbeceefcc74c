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

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.config import RECIPE_SECTIONS, RunConfig
from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_json, file_sha256
from benchmark.labels import join_label

RESULTS_VERSION = 3
"""Bumped when a change of the core changes the numbers of an unchanged configuration (masking, evaluation,
the training loop): every run id changes with it, so no record of the old code is mistaken for a new one.
A method bumps its own ``ContinualMethod.version`` for the same reason. 3: the training stream is drawn per
micro-batch (:mod:`benchmark.data.sampling`), the same for any number of processes."""

REPLAY_VERSION = 2
"""How a run with replay counts its replayed chunks; part of such a run's id (runs without replay are unaffected).
2: a share is met over the stage, each update taking the floor or ceiling of share x chunks
(:class:`benchmark.data.sampling.ReplayPlan`); 1 (records without the field) rounded it in every update, so that a
share below half a chunk per update replayed nothing."""

LOCATION_FIELDS = (
    "output_dir",
    "work_dir",
    "keep_checkpoints",
    "methods",
    "seeds",
    "device",
    "profile",
    "report_to",
)
"""Config fields that say where or what to run, not what a run computes."""

NUMERICS_NEUTRAL_FIELDS = {
    "dap": (
        "loader_workers",
        "sharding",
        "activation_checkpointing",
        "compile",
        "flush_denormals",
        "deterministic",
        "eval_every",  # adds the curve of every domain's held-out losses, changes no other number
        "eval_chunks",
    ),
    "finetune": ("compile",),
}
"""Fields of each section that change how fast a run goes, or what it adds beside its numbers, not what it computes
(tested to change no number)."""

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


MODEL_FILES = (
    "config.json",
    "*.safetensors",
    "*.bin",
    "tokenizer*",
    "vocab*",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "*.model",
)
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


def canonical_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """What of a resolved configuration (``RunConfig.to_dict()``, or a record's ``config``) determines a run's
    numbers, in one spelling: without locations, inputs (their checksums stand for them), the sequence (the domain
    order stands for it), method options (each method's canonical options stand for its own) and fields that change
    only speed; and without any field equal to its default. So a field added later at a default that keeps the
    earlier behaviour changes no run id and no leaderboard group, while any other value enters both."""
    from benchmark.config import spelled_config

    data = spelled_config(config)  # one spelling of every value, missing fields at their defaults
    dropped = (*LOCATION_FIELDS, *INPUT_PATH_FIELDS, "sequence", "method_options", *RECIPE_SECTIONS)
    out = {key: value for key, value in data.items() if key not in dropped}
    for section in ("dap", "finetune"):
        out[section] = {k: v for k, v in out[section].items() if k not in NUMERICS_NEUTRAL_FIELDS.get(section, ())}
    return _without_defaults(out, spelled_config({}))


def canonical_recipe(config: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe options of a configuration (replay, schedule) that differ from their defaults, in one spelling:
    they label a method's leaderboard row and enter its run id, but not its group (:data:`RECIPE_SECTIONS`)."""
    from benchmark.config import spelled_config

    data = spelled_config(config)
    recipe = {section: data[section] for section in RECIPE_SECTIONS}
    return _without_defaults(recipe, {section: spelled_config({})[section] for section in RECIPE_SECTIONS})


def row_label(method: str, options: Mapping[str, Any], recipe: Mapping[str, Any]) -> str:
    """The leaderboard row of a run: the method, its canonical options and its recipe options that differ from the
    defaults, e.g. ``das[mask_target=update]`` or ``ncl[replay.general=0.05]``."""
    from benchmark.method import options_label

    return join_label(method, (options_label(options), recipe_label(recipe)))


def recipe_label(recipe: Mapping[str, Any]) -> str:
    """``replay.general=0.05,schedule.name=wsd``: the recipe options as a label writes them."""
    return ",".join(
        f"{section}.{key}={value:g}" if isinstance(value, float) else f"{section}.{key}={value}"
        for section, values in sorted(recipe.items())
        for key, value in sorted(values.items())
    )


def _without_defaults(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        default = defaults.get(key, _NO_DEFAULT)
        if isinstance(value, dict) and isinstance(default, dict) and key in SECTIONS:
            nested = _without_defaults(value, default)
            if nested:
                out[key] = nested
        elif value != default:
            out[key] = value
    return out


_NO_DEFAULT = object()
SECTIONS = ("dap", "finetune", *RECIPE_SECTIONS)
"""Nested configuration sections, whose fields are compared with their defaults one by one."""


@dataclass(frozen=True)
class RunIdentity:
    """What a run id hashes (see the module docstring), and the leaderboard group it belongs to."""

    config: dict[str, Any]
    """:func:`canonical_config` of the run's configuration."""
    domains: tuple[str, ...]
    inputs: dict[str, str]
    """Content checksums of every input (``RunData.checksums``, a record's ``data_checksums``)."""
    method: str
    method_options: dict[str, Any]
    """The method's canonical options (:meth:`~benchmark.method.MethodConfig.canonical_options`)."""
    method_version: int = 1
    results_version: int = RESULTS_VERSION
    processes: int | None = None
    """The process count, only where the method's options make the numbers depend on it."""
    recipe: dict[str, Any] = dataclasses.field(default_factory=dict)
    """:func:`canonical_recipe`: in the run id (when not empty), not in the group."""
    replay_version: int | None = None
    """:data:`REPLAY_VERSION` for a run with replay (None without, and for records made before version 2)."""

    def payload(self) -> dict[str, Any]:
        """Everything the run id hashes, except the seed."""
        out = {
            **self.group_payload(),
            "method": self.method,
            "method_options": self.method_options,
            "code": {"results_version": self.results_version, "method_version": self.method_version},
        }
        out.pop("results_version")
        if self.processes is not None:
            out["processes"] = self.processes
        if self.recipe:
            out["recipe"] = self.recipe
        if self.replay_version is not None:
            out["replay_version"] = self.replay_version
        return out

    def group_payload(self) -> dict[str, Any]:
        """What the records of one leaderboard group share: everything but the method, its options and the seed."""
        return {
            "config": self.config,
            "domains": list(self.domains),
            "inputs": dict(sorted(self.inputs.items())),
            "results_version": self.results_version,
        }

    def group_id(self) -> str:
        """A short hash of :meth:`group_payload`."""
        return _digest(self.group_payload())[:10]

    def run_id(self, seed: int, sequence: str) -> str:
        """``<method>-<sequence tag>-seed<seed>-<hash>``: the name of the run's record and work directory."""
        digest = _digest({**self.payload(), "seed": seed})[:10]
        return f"{self.method}-{sequence_tag(sequence, self.domains)}-seed{seed}-{digest}"


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def run_identity(
    config: RunConfig, method_cls, domains: tuple[str, ...], inputs: Mapping[str, str], processes: int = 1
) -> RunIdentity:
    """The identity of ``method_cls`` run in ``config`` on ``domains`` with inputs of checksums ``inputs``.

    The number of processes is left out unless the method's options make the numbers depend on it: N processes
    draw the training stream one process draws (:mod:`benchmark.data.sampling`), so they compute the same run up to
    the order of floating-point sums."""
    options = method_cls.options_in(config)
    return RunIdentity(
        config=canonical_config(config.to_dict()),
        domains=tuple(domains),
        inputs=dict(inputs),
        method=method_cls.name,
        method_options=options.canonical_options(),
        method_version=method_cls.version,
        processes=processes if options.numerics_depend_on_processes() else None,
        recipe=canonical_recipe(config.to_dict()),
        replay_version=REPLAY_VERSION if config.replay.active() else None,
    )


def record_identity(record: Mapping[str, Any]) -> RunIdentity | None:
    """The identity a record of schema 3 or later was made under, rebuilt from its own fields (None for older
    records, whose ids hashed another payload)."""
    identity = record.get("identity") or {}
    if "method_options" not in identity:
        return None
    return RunIdentity(
        config=canonical_config(record["config"]),
        domains=tuple(record["sequence"]),
        inputs=dict(record["data_checksums"]),
        method=record["method"],
        method_options=identity["method_options"],
        method_version=identity["method_version"],
        results_version=identity["results_version"],
        processes=identity.get("processes"),
        recipe=canonical_recipe(record["config"]),
        replay_version=identity.get("replay_version"),
    )


def sequence_tag(sequence: str, domains: tuple[str, ...]) -> str:
    """The sequence's name (``seq0``), or ``custom-`` and the domains for an explicit list."""
    return sequence.strip() if "," not in sequence else "custom-" + "-".join(domains)


def shared_cache_path(work_dir: str | Path) -> Path:
    """Where the file-hash cache of a work folder lives (beside the data caches)."""
    return Path(os.fspath(work_dir)) / "cache" / "file-hashes.json"
