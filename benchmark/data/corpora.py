"""Corpora: text files read, split (held-out lines first), tokenised and packed into fixed-length chunks, cached on
disk by content under a manifest."""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.data.suite import require_data_root
from benchmark.errors import CorruptStateError, DapbenchError
from benchmark.families import ModelFamily
from benchmark.io import unwritable, verify_manifest, write_manifest


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
    family: ModelFamily,
    validation: bool = False,
) -> Corpus:
    """Split lines (first ``heldout_fraction`` held out), tokenise and pack (the family's documents); cached on
    disk by content. With ``validation``, the corpus's ``heldout`` part is its validation slice instead
    (:func:`validation_split`): as many lines as the held-out part, disjoint from it and from the training lines."""
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
    if validation:
        train_lines, heldout_lines = validation_split(lines[n_heldout:], max_lines, n_heldout)
    checksum = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    kind = family.cache_tag + ("|validation" if validation else "")
    key = hashlib.sha256(
        f"{checksum}|{_tokenizer_id(tokenizer)}|{seq_len}|{heldout_fraction}|{max_lines}{kind}".encode()
    ).hexdigest()[:20]
    train = _packed_dataset(train_lines, tokenizer, seq_len, cache_dir / f"{name}-train-{key}", family)
    heldout = _packed_dataset(heldout_lines, tokenizer, seq_len, cache_dir / f"{name}-heldout-{key}", family)
    if len(train) == 0:
        raise DapbenchError(
            f"corpus {name} yields no {seq_len}-token chunk for training",
            "use a larger corpus or a shorter seq_len",
        )
    return Corpus(name=name, train=train, heldout=heldout, checksum=checksum)


def validation_split(rest: list[str], max_lines: int | None, size: int) -> tuple[list[str], list[str]]:
    """The training lines and a validation slice of ``size`` lines from ``rest`` (a corpus after its held-out lines).
    Where ``max_lines`` leaves lines unread, the slice is the ``size`` lines after the training lines, which stay
    exactly those of a leaderboard run; otherwise it is the last ``size`` lines, taken out of training."""
    if max_lines is not None and len(rest) >= max_lines + size:
        return rest[:max_lines], rest[max_lines : max_lines + size]
    train = rest[:-size][:max_lines] if max_lines is not None else rest[:-size]
    return train, rest[-size:]


def load_heldout_text(
    name: str,
    source: str,
    tokenizer,
    seq_len: int,
    cache_dir: Path,
    max_lines: int | None = None,
    *,
    family: ModelFamily,
    last: int | None = None,
):
    """A whole text file (or its ``last`` lines) as packed chunks (the general corpus), and its checksum."""
    lines = read_corpus_lines(source)[:max_lines]
    lines = lines[-last:] if last else lines
    checksum = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    key = f"{checksum}|{_tokenizer_id(tokenizer)}|{seq_len}{family.cache_tag}"
    key = hashlib.sha256(key.encode()).hexdigest()[:20]
    return _packed_dataset(lines, tokenizer, seq_len, cache_dir / f"{name}-eval-{key}", family), checksum


def _tokenizer_id(tokenizer) -> str:
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(f"{type(tokenizer).__name__}|{vocab}".encode()).hexdigest()[:16]


def _packed_dataset(lines: list[str], tokenizer, seq_len: int, cache_path: Path, family: ModelFamily):
    """Tokenise every line with special tokens, concatenate, cut into ``seq_len`` chunks (datasets, cached)."""
    from datasets import load_from_disk
    from filelock import FileLock

    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        # One writer per cache entry: concurrent runs sharing a work dir wait for it instead of racing on its files.
        with FileLock(str(cache_path) + ".lock"):
            if cache_path.is_dir() and not _intact(cache_path):
                shutil.rmtree(cache_path)
            if not cache_path.is_dir():
                packed = _build_packed(lines, tokenizer, seq_len, cache_path, family)
                if packed is not None:  # no chunk: nothing worth caching, and the caller names what is missing
                    return packed.with_format("torch")
            return load_from_disk(str(cache_path)).with_format("torch")
    except OSError as exc:  # pyarrow's and the file system's refusals alike
        raise unwritable(cache_path, exc) from exc


def _intact(cache_path: Path) -> bool:
    """Whether a cache entry is exactly what was written (its manifest); a corrupt one is rebuilt, with a warning."""
    try:
        verify_manifest(cache_path, "cache entry", "it is rebuilt")
    except CorruptStateError as exc:
        warnings.warn(f"{exc.problem}: rebuilding it", stacklevel=3)
        return False
    return True


PACK_BATCH = 1000
"""Lines tokenised and packed together; the tokens left over at the end of each batch are dropped (the chunking
every cache entry and committed record was made with)."""


def _build_packed(lines: list[str], tokenizer, seq_len: int, cache_path: Path, family: ModelFamily):
    """Write the packed chunks of ``lines`` to ``cache_path`` through a temporary folder (the caller holds the lock);
    an empty result is returned instead (datasets cannot save and reload a table without rows)."""
    from datasets import Dataset

    columns: dict[str, list[list[int]]] = {"input_ids": [], "special_tokens_mask": []}
    for start in range(0, len(lines), PACK_BATCH):  # packed per batch of lines, each remainder dropped
        encoded = family.encode_documents(tokenizer, lines[start : start + PACK_BATCH])
        for key, chunks in columns.items():
            chunks += _pack(encoded[key], seq_len)
    packed = Dataset.from_dict(columns)
    if len(packed) == 0:
        return packed
    tmp = cache_path.with_name(cache_path.name + ".tmp")
    if tmp.exists():  # left by a process killed while writing; under the lock nobody else is writing it
        shutil.rmtree(tmp)
    packed.save_to_disk(str(tmp))
    write_manifest(tmp)
    tmp.replace(cache_path)
    return None


def _pack(sequences: list[list[int]], seq_len: int) -> list[list[int]]:
    """Concatenate and cut into full chunks; the remainder of the batch is dropped (as the reference)."""
    flat = [tok for seq in sequences for tok in seq]
    usable = len(flat) // seq_len * seq_len
    return [flat[i : i + seq_len] for i in range(0, usable, seq_len)]
