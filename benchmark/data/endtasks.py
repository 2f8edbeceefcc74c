"""End-task data: the paper's labelled splits read from the data release, re-split as the reference does,
subsampled deterministically, and formatted as model input (encoding and scoring are in ``finetune.py``)."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmark.config import FinetuneConfig
from benchmark.data.suite import EndTaskSpec, require_data_root
from benchmark.errors import DapbenchError


@dataclass(frozen=True)
class Example:
    """One labelled end-task input; ``aspect`` is set for aspect sentiment (ASC) tasks."""

    text: str
    label: int
    aspect: str | None = None


@dataclass
class EndTaskData:
    """The train and test examples of one end task after the paper's re-split."""

    name: str
    labels: tuple[str, ...]
    train: list[Example]
    test: list[Example]
    checksum: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def load_end_task(spec: EndTaskSpec, data_root: str | Path, check_sizes: bool = True) -> EndTaskData:
    """Load an end task with the paper's splits (dev folded into test, then the per-label re-split)."""
    root = require_data_root(data_root)
    label_ids = {name: i for i, name in enumerate(spec.labels)}
    digest = hashlib.sha256()
    train = [ex for path in spec.train for ex in _read_examples(root / path, spec, label_ids, digest)]
    test = [ex for path in spec.test for ex in _read_examples(root / path, spec, label_ids, digest)]
    if spec.train_ratio is not None:
        train, test = repartition(train, test, len(spec.labels), spec.train_ratio)
    for split, examples in (("train", train), ("test", test)):
        if not examples:
            raise DapbenchError(f"end task {spec.name} has an empty {split} split", f"check its {split} files")
    if check_sizes and spec.expected_sizes:
        got = {"train": len(train), "test": len(test)}
        if got != dict(spec.expected_sizes):
            raise DapbenchError(
                f"end task {spec.name}: split sizes {got} differ from the paper's {dict(spec.expected_sizes)}",
                f"the files under {root} are not the paper's release; restore them or verify the data checksums",
            )
    return EndTaskData(spec.name, spec.labels, train, test, checksum=digest.hexdigest()[:16])


def _read_examples(path: Path, spec: EndTaskSpec, label_ids: dict[str, int], digest) -> list[Example]:
    if not path.is_file():
        raise DapbenchError(
            f"end task {spec.name}: file not found: {path}",
            "check --data-root (the paper's data-release layout)",
        )
    raw = path.read_bytes()
    digest.update(raw)
    try:
        if spec.format == "asc_json":
            table = json.loads(raw, object_pairs_hook=_unique_keys)
            rows = [(r["sentence"], r["polarity"], r["term"]) for r in _mapping(table).values()]
        elif spec.format == "jsonl":
            rows = [(r["text"], r["label"], None) for r in map(json.loads, raw.decode().splitlines()) if r]
        else:
            raise DapbenchError(f"end task {spec.name}: unknown format {spec.format!r}", "use asc_json or jsonl")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError, TypeError, ValueError) as exc:
        raise DapbenchError(
            f"end task {spec.name}: corrupt file {path} ({type(exc).__name__}: {exc})",
            "restore the file from the data release",
        ) from exc
    return [_example(spec, path, label_ids, *row) for row in rows]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object whose keys (example ids) are unique: a repeated id would silently replace an example."""
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(f"example id(s) {repeated[:3]} occur more than once")
    return dict(pairs)


def _mapping(value: Any) -> dict:
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise TypeError("an asc_json file maps example ids to {term, sentence, polarity} objects")
    return value


def _example(spec: EndTaskSpec, path: Path, label_ids: dict[str, int], text, label, aspect) -> Example:
    """One checked example: a non-empty text (and aspect term), a label of the task's declared set."""
    if not isinstance(label, str) or label not in label_ids:
        raise DapbenchError(
            f"end task {spec.name}: unknown label {label!r} in {path}",
            f"expected one of {list(label_ids)}; fix the file or the task's labels in its YAML",
        )
    for what, value in (("text", text), ("aspect term", aspect if spec.format == "asc_json" else "-")):
        if not isinstance(value, str) or not value.strip():
            raise DapbenchError(
                f"end task {spec.name}: an example in {path} has no {what} ({value!r})", "fix or remove the example"
            )
    return Example(text=text, label=label_ids[label], aspect=aspect)


def repartition(
    train: list[Example], test: list[Example], num_labels: int, train_ratio: float
) -> tuple[list[Example], list[Example]]:
    """The reference's deterministic re-split: per label id in increasing order, move the first
    ``int((N * (1 - ratio)) // num_labels)`` train examples of that label (N = original train size)
    to the end of test."""
    take = int((len(train) * (1 - train_ratio)) // num_labels)
    moved: set[int] = set()
    for label in range(num_labels):
        idx = [i for i, ex in enumerate(train) if ex.label == label][:take]
        moved.update(idx)
        test = test + [train[i] for i in idx]
    return [ex for i, ex in enumerate(train) if i not in moved], test


def fixed_subset(examples: list[Example], limit: int | None, key: str) -> list[Example]:
    """At most ``limit`` examples, chosen by a seed derived from ``key`` only (the same for every run)."""
    if limit is None or len(examples) <= limit:
        return examples
    order = list(range(len(examples)))
    random.Random(key).shuffle(order)
    return [examples[i] for i in sorted(order[:limit])]


def validation_split(features: list[dict], share: float, key: str) -> tuple[list[dict], list[dict]]:
    """``features`` (encoded training examples with ``labels``) split into a part to train on and a validation part
    of about ``share`` of them, stratified by label where every label has two examples or more, and drawn by a seed
    derived from ``key`` only: the same split for every run and seed. ``share`` 0 keeps every example for training."""
    if share <= 0:
        return features, []
    from sklearn.model_selection import train_test_split

    labels = [f["labels"] for f in features]
    counts = Counter(labels)
    stratify = labels if min(counts.values()) >= 2 and len(features) * share >= len(counts) else None
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
    fit, held = train_test_split(list(range(len(features))), test_size=share, random_state=seed, stratify=stratify)
    return [features[i] for i in sorted(fit)], [features[i] for i in sorted(held)]


def format_example(example: Example, sep_token: str | None) -> str:
    """Model input text: ASC is ``aspect + ' ' + sep + sentence`` as in the reference; a tokenizer without a
    separator token (a decoder's) reads ``aspect: sentence``; other tasks are the text as is."""
    if example.aspect is None:
        return example.text
    if sep_token is None:
        return f"{example.aspect.strip()}: {example.text}"
    return f"{example.aspect.strip()} {sep_token}{example.text}"


@dataclass
class EncodedTask:
    """An end task tokenised once and reused by every fine-tune of the run."""

    name: str
    num_labels: int
    train: list[dict]
    test: list[dict]
    test_labels: list[int]
    labels: tuple[str, ...] = ()
    """The label names, by label id (what a protocol that scores label words reads)."""
    test_texts: list[str] = field(default_factory=list)
    """The test inputs as text, in the order of ``test`` (before tokenisation and truncation)."""


def encode_task(task: EndTaskData, tokenizer, cfg: FinetuneConfig) -> EncodedTask:
    """Subsample (fixed subsets) and tokenise an end task with truncation to ``cfg.max_length``."""
    train = fixed_subset(task.train, cfg.max_train_examples, f"{task.name}/train")
    test = fixed_subset(task.test, cfg.max_test_examples, f"{task.name}/test")
    return EncodedTask(
        name=task.name,
        num_labels=len(task.labels),
        train=_encode(train, tokenizer, cfg.max_length),
        test=_encode(test, tokenizer, cfg.max_length),
        test_labels=[ex.label for ex in test],
        labels=tuple(task.labels),
        test_texts=[format_example(ex, tokenizer.sep_token) for ex in test],
    )


def _encode(examples: list[Example], tokenizer, max_length: int) -> list[dict]:
    texts = [format_example(ex, tokenizer.sep_token) for ex in examples]
    encoded = tokenizer(texts, truncation=True, max_length=max_length)
    return [
        {"input_ids": ids, "attention_mask": mask, "labels": ex.label}
        for ids, mask, ex in zip(encoded["input_ids"], encoded["attention_mask"], examples, strict=True)
    ]
