"""The task suite: domains, their corpora and end tasks, and the named domain orders; the built-in paper suite or
one defined by ``<data root>/dapbench_suite.yaml``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from benchmark.errors import DapbenchError

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
    paper_epochs: float | None = None
    """The paper's fine-tuning epochs for it (the built-in tasks'; ``finetune.epochs``'s default reads them)."""


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
    return _parse_suite(_read_yaml(base.joinpath("suite.yaml")), base, "builtin")


def _read_yaml(path: Any) -> Any:
    """A YAML file of the suite (safe loader: no tags that build objects), or a named error."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DapbenchError(
            f"task file {path} is not valid YAML: {exc}", "fix the YAML (plain maps and lists)"
        ) from exc
    except OSError as exc:
        raise DapbenchError(f"task file {path} cannot be read: {exc.strerror}", "check the suite's files") from exc


def _parse_suite(raw: Any, base: Any, source: str) -> TaskSuite:
    """The suite a ``dapbench_suite.yaml`` (or the built-in one) describes, every name that becomes part of a path
    or run id checked to be a plain name, every entry of the expected shape."""
    from benchmark.io import safe_name

    raw = _mapping(raw, source, ("domains", "sequences"))
    domains = {}
    for name, spec in _mapping(raw["domains"], f"{source}: domains").items():
        spec = _mapping(spec, f"{source}: domain {name!r}", ("corpus", "end_task"))
        safe_name(name, "domain name")
        safe_name(spec["end_task"], "end-task name")
        domains[name] = DomainSpec(name=name, corpus=str(spec["corpus"]), end_task=spec["end_task"])
    tasks_dir = base.joinpath(str(raw.get("end_tasks", "endtasks")))
    end_tasks = {d.end_task: _end_task(tasks_dir.joinpath(f"{d.end_task}.yaml"), d.end_task) for d in domains.values()}
    sequences = {}
    for name, order in _mapping(raw["sequences"], f"{source}: sequences").items():
        if not isinstance(order, list) or any(d not in domains for d in order):
            raise DapbenchError(f"{source}: sequence {name!r} is not a list of its domains", "list domain names")
        sequences[safe_name(name, "sequence name")] = tuple(order)
    return TaskSuite(domains=domains, end_tasks=end_tasks, sequences=sequences, source=source)


def _end_task(path: Any, name: str) -> EndTaskSpec:
    spec = _mapping(_read_yaml(path), str(path), ("name", "format", "train", "test", "labels"))
    for key in ("train", "test", "labels"):
        if not isinstance(spec[key], list) or not spec[key] or not all(isinstance(v, str) for v in spec[key]):
            raise DapbenchError(f"{path}: {key} must be a non-empty list of names", f"fix {key} in {path}")
        spec[key] = tuple(spec[key])
    if spec["name"] != name or len(set(spec["labels"])) != len(spec["labels"]) or len(spec["labels"]) < 2:
        raise DapbenchError(
            f"{path}: an end task needs its file's name ({name}) and at least two distinct labels",
            "fix the task's name and labels",
        )
    known = {f.name for f in dataclasses.fields(EndTaskSpec)}
    if set(spec) - known:
        raise DapbenchError(
            f"{path}: unknown keys {sorted(set(spec) - known)}", f"valid keys: {', '.join(sorted(known))}"
        )
    return EndTaskSpec(**spec)


def _mapping(value: Any, where: str, required: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise DapbenchError(f"{where} is not a map", "write it as YAML key: value pairs")
    missing = [key for key in required if key not in value]
    if missing:
        raise DapbenchError(f"{where} lacks {', '.join(missing)}", f"add {', '.join(missing)}")
    return value


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
