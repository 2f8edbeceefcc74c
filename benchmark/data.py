"""Task suite loading, corpus packing and MLM batches (end-task data: ``benchmark.endtasks``)."""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import yaml

from benchmark.errors import CorruptStateError, DapbenchError
from benchmark.io import verify_manifest, write_manifest

SUITE_FILE = "dapbench_suite.yaml"
"""A data root that holds this file defines its own suite (e.g. the synthetic profile's data)."""


# ----------------------------------------------------------------------------------------------
# Task specifications
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EndTaskSpec:
    """One end task: files relative to the data root, label inventory and the paper's re-split rule."""

    name: str
    format: str
    """``asc_json`` (dict of id -> {term, sentence, polarity}) or ``jsonl`` ({text, label} per line)."""
    train: tuple[str, ...]
    test: tuple[str, ...]
    labels: tuple[str, ...]
    train_ratio: float | None = None
    """If set, the first k train examples of every label move to test (reference ``dataloader/data.py``)."""
    expected_sizes: dict[str, int] | None = None
    description: str = ""


@dataclass(frozen=True)
class DomainSpec:
    """One DAP domain: its unlabeled corpus and its end task."""

    name: str
    corpus: str
    end_task: str


@dataclass(frozen=True)
class TaskSuite:
    """Domains, end tasks and named sequences."""

    domains: dict[str, DomainSpec]
    end_tasks: dict[str, EndTaskSpec]
    sequences: dict[str, tuple[str, ...]]
    source: str = "builtin"

    def sequence(self, name_or_list: str) -> tuple[str, ...]:
        """A named sequence, or a comma-separated custom order of known domains."""
        if name_or_list in self.sequences:
            return self.sequences[name_or_list]
        order = tuple(d.strip() for d in name_or_list.split(",") if d.strip())
        unknown = [d for d in order if d not in self.domains]
        if unknown or not order:
            raise DapbenchError(
                f"unknown sequence or domain(s) {unknown or name_or_list!r}",
                f"use a named sequence ({', '.join(self.sequences)}) or a comma-separated list of "
                f"domains ({', '.join(self.domains)})",
            )
        if len(set(order)) != len(order):
            raise DapbenchError(f"sequence {name_or_list!r} repeats a domain", "list each domain once")
        return order


def load_suite(data_root: str | Path | None = None) -> TaskSuite:
    """The built-in paper suite, or the suite defined by ``<data_root>/dapbench_suite.yaml``."""
    custom = Path(data_root) / SUITE_FILE if data_root else None
    if custom is not None and custom.is_file():
        return _parse_suite(_read_yaml(custom), custom.parent, str(custom))
    base = resources.files("tasks")
    return _parse_suite(yaml.safe_load(base.joinpath("suite.yaml").read_text()), base, "builtin")


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise DapbenchError(f"task file {path} is not valid YAML: {exc}", "fix the YAML syntax") from exc


def _parse_suite(raw: dict, base: Any, source: str) -> TaskSuite:
    domains = {name: DomainSpec(name=name, **spec) for name, spec in raw["domains"].items()}
    tasks_dir = base.joinpath(raw.get("end_tasks", "endtasks"))
    end_tasks = {}
    for domain in domains.values():
        entry = tasks_dir.joinpath(f"{domain.end_task}.yaml")
        spec = yaml.safe_load(entry.read_text())
        for key in ("train", "test", "labels"):
            spec[key] = tuple(spec[key])
        end_tasks[domain.end_task] = EndTaskSpec(**spec)
    sequences = {name: tuple(order) for name, order in raw["sequences"].items()}
    return TaskSuite(domains=domains, end_tasks=end_tasks, sequences=sequences, source=source)


def require_data_root(data_root: str | Path | None) -> Path:
    """The data root as a path, or an error saying how to provide it."""
    if not data_root:
        raise DapbenchError(
            "no data root given",
            "pass --data-root DIR or set DAPBENCH_DATA to the paper's data-release folder",
        )
    root = Path(data_root)
    if not root.is_dir():
        raise DapbenchError(
            f"data root not found: {root}",
            "pass --data-root with the folder that holds yelp_restaurant.txt, SemEval14-res/, absa/, ...",
        )
    return root


# ----------------------------------------------------------------------------------------------
# Corpora
# ----------------------------------------------------------------------------------------------
@dataclass
class Corpus:
    """A domain corpus tokenised and packed into fixed-length chunks."""

    name: str
    train: Any
    """``datasets.Dataset`` with ``input_ids`` and ``special_tokens_mask`` (torch format)."""
    heldout: Any
    checksum: str


def resolve_corpus_path(corpus: str, data_root: str | Path | None) -> str:
    """Local file under the data root, or a ``hub:<dataset>[:<config>]`` reference kept as is."""
    if corpus.startswith("hub:"):
        return corpus
    path = Path(corpus) if Path(corpus).is_absolute() else require_data_root(data_root) / corpus
    if not path.is_file():
        raise DapbenchError(f"corpus file not found: {path}", "check --data-root (the paper's data-release layout)")
    return str(path)


def read_corpus_lines(source: str) -> list[str]:
    """Non-empty lines of a local text file, or the ``text`` column of a hub dataset."""
    if source.startswith("hub:"):
        from datasets import load_dataset

        _, name, *config = source.split(":")
        lines = load_dataset(name, *config, split="train")["text"]
    else:
        try:
            lines = Path(source).read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as exc:
            raise DapbenchError(f"corpus {source} is not UTF-8 text: {exc}", "convert it to UTF-8") from exc
        except OSError as exc:
            raise DapbenchError(
                f"cannot read the text file {source!r}: {exc.strerror}",
                "pass an existing text file, one passage per line",
            ) from exc
    lines = [line for line in (raw.strip() for raw in lines) if line]
    if not lines:
        raise DapbenchError(f"corpus {source} is empty", "point the domain at a text file with one passage per line")
    return lines


def load_corpus(
    name: str,
    source: str,
    tokenizer,
    seq_len: int,
    heldout_fraction: float,
    max_lines: int | None,
    cache_dir: Path,
) -> Corpus:
    """Split lines (first ``heldout_fraction`` held out), tokenise and pack; cached on disk by content."""
    lines = read_corpus_lines(source)
    if len(lines) < 2:
        raise DapbenchError(
            f"corpus {name} ({source}) has {len(lines)} non-empty line: one is held out, none is left to train on",
            "use a corpus with many passages, one per line",
        )
    n_heldout = max(1, int(len(lines) * heldout_fraction))
    heldout_lines, train_lines = lines[:n_heldout], lines[n_heldout:]
    if max_lines is not None:
        train_lines = train_lines[:max_lines]
    checksum = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    key = hashlib.sha256(
        f"{checksum}|{_tokenizer_id(tokenizer)}|{seq_len}|{heldout_fraction}|{max_lines}".encode()
    ).hexdigest()[:20]
    train = _packed_dataset(train_lines, tokenizer, seq_len, cache_dir / f"{name}-train-{key}")
    heldout = _packed_dataset(heldout_lines, tokenizer, seq_len, cache_dir / f"{name}-heldout-{key}")
    if len(train) == 0:
        raise DapbenchError(
            f"corpus {name} yields no {seq_len}-token chunk for training",
            "use a larger corpus or a shorter seq_len",
        )
    return Corpus(name=name, train=train, heldout=heldout, checksum=checksum)


def load_heldout_text(name: str, source: str, tokenizer, seq_len: int, cache_dir: Path, max_lines: int | None = None):
    """A whole text file as packed chunks (the general corpus), and its checksum."""
    lines = read_corpus_lines(source)[:max_lines]
    checksum = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    key = hashlib.sha256(f"{checksum}|{_tokenizer_id(tokenizer)}|{seq_len}".encode()).hexdigest()[:20]
    return _packed_dataset(lines, tokenizer, seq_len, cache_dir / f"{name}-eval-{key}"), checksum


def _tokenizer_id(tokenizer) -> str:
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(f"{type(tokenizer).__name__}|{vocab}".encode()).hexdigest()[:16]


def _packed_dataset(lines: list[str], tokenizer, seq_len: int, cache_path: Path):
    """Tokenise every line with special tokens, concatenate, cut into ``seq_len`` chunks (datasets, cached)."""
    from datasets import load_from_disk
    from filelock import FileLock

    cache_path.parent.mkdir(parents=True, exist_ok=True)
    # One writer per cache entry: concurrent runs sharing a work dir wait for it instead of racing on its files.
    with FileLock(str(cache_path) + ".lock"):
        if cache_path.is_dir() and not _intact(cache_path):
            shutil.rmtree(cache_path)
        if not cache_path.is_dir():
            _build_packed(lines, tokenizer, seq_len, cache_path)
        return load_from_disk(str(cache_path)).with_format("torch")


def _intact(cache_path: Path) -> bool:
    """Whether a cache entry is exactly what was written (its manifest); a corrupt one is rebuilt, with a warning."""
    try:
        verify_manifest(cache_path, "cache entry", "it is rebuilt")
    except CorruptStateError as exc:
        warnings.warn(f"{exc.problem}: rebuilding it", stacklevel=3)
        return False
    return True


def _build_packed(lines: list[str], tokenizer, seq_len: int, cache_path: Path) -> None:
    """Write the packed chunks of ``lines`` to ``cache_path`` through a temporary folder (the caller holds the lock)."""
    from datasets import Dataset

    def tokenize_and_pack(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        encoded = tokenizer(batch["text"], return_special_tokens_mask=True, verbose=False)
        return {key: _pack(encoded[key], seq_len) for key in ("input_ids", "special_tokens_mask")}

    if lines:
        packed = Dataset.from_dict({"text": lines}).map(
            tokenize_and_pack, batched=True, batch_size=1000, remove_columns=["text"], desc=f"packing {cache_path.name}"
        )
    else:  # datasets cannot map an empty table; an empty split has no chunk
        packed = Dataset.from_dict({"input_ids": [], "special_tokens_mask": []})
    tmp = cache_path.with_name(cache_path.name + ".tmp")
    if tmp.exists():  # left by a process killed while writing; under the lock nobody else is writing it
        shutil.rmtree(tmp)
    packed.save_to_disk(str(tmp))
    write_manifest(tmp)
    tmp.replace(cache_path)


def _pack(sequences: list[list[int]], seq_len: int) -> list[list[int]]:
    """Concatenate and cut into full chunks; the remainder of the batch is dropped (as the reference)."""
    flat = [tok for seq in sequences for tok in seq]
    usable = len(flat) // seq_len * seq_len
    return [flat[i : i + seq_len] for i in range(0, usable, seq_len)]


# ----------------------------------------------------------------------------------------------
# MLM batches
# ----------------------------------------------------------------------------------------------
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

    def __init__(self, tokenizer, mlm_probability: float = 0.15, generator: torch.Generator | None = None):
        if tokenizer.mask_token_id is None:
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
        """Mask a list of packed chunks into one batch, drawing from ``generator`` (None: the global RNG)."""
        original = torch.stack([torch.as_tensor(e["input_ids"]) for e in examples]).long()
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


def fixed_mlm_batches(dataset, tokenizer, n_chunks: int, batch_size: int, mlm_probability: float, seed: int = 0):
    """The first ``n_chunks`` chunks masked once by a CPU generator seeded with ``seed`` alone: the same
    evaluation for every run, method and device, whatever the global RNG has been used for."""
    collator = MlmCollator(tokenizer, mlm_probability, generator=torch.Generator().manual_seed(seed))
    n = min(n_chunks, len(dataset))
    return [collator([dataset[i] for i in range(s, min(s + batch_size, n))]) for s in range(0, n, batch_size)]


def heldout_mlm_batches(
    dataset, tokenizer, n_chunks: int, batch_size: int, mlm_probability: float, draws: int = 1
) -> list[dict[str, torch.Tensor]]:
    """The fixed held-out evaluation of a corpus: its first ``n_chunks`` chunks masked ``draws`` times, draw d by a
    generator seeded with d alone (draw 0 is the evaluation of earlier versions, bit for bit), one draw after the
    other; every batch names the chunks its rows are (``chunk_index``), so losses can be summed per chunk."""
    out = []
    for draw in range(draws):
        batches = fixed_mlm_batches(dataset, tokenizer, n_chunks, batch_size, mlm_probability, seed=draw)
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


@cache
def package_versions() -> dict[str, str]:
    """Versions of the libraries that change results."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "datasets", "accelerate", "peft", "scikit-learn", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out
