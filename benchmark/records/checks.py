"""Checks a run record passes before any reader uses it: its name is its identity, and every number it derives is
what its raw numbers give.

A record names its own run id in its file name, its method and seed inside that id, and (schema 3) everything the
id hashes in its own fields, so :func:`check_record` re-derives the id and refuses a record whose configuration,
checksums or options were changed after the run. Derived numbers (the loss metrics, the end-task summary, the set
losses that the per-chunk sums add up to) are recomputed from the raw ones, so an edited headline number is named
instead of shown on a leaderboard. Numbers a record cannot re-derive (held-out losses, scores, drift) are what
``dapbench reproduce`` re-runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmark.errors import DapbenchError
from benchmark.threads import MAX_THREADS

DERIVED_TOLERANCE = 1e-9
"""Derived numbers are recomputed with the code that wrote them: equal up to float printing."""
LABEL_LIMIT = 256
"""Characters a row label may hold (the longest committed one has 50): every table and chart that prints labels stays
of bounded size (a label of 8,000 characters drew a plot 67,421 px wide); a run whose label would be longer is
refused before its work (``preflight.check_labels``)."""
CHUNK_TOLERANCE = 1e-3
"""Nats by which the set loss may differ from its chunks' sums (each rounded to 4 decimals) over their tokens."""


def check_record(record: dict[str, Any], path: Path | None = None) -> None:
    """Refuse, with a named error, a record whose id or derived numbers are not its own (see the module docstring)."""
    source = str(path) if path is not None else record["run_id"]
    problems = [*_identity_problems(record, path), *_type_problems(record), *_non_finite(record)]
    problems += _derived_problems(record)
    if problems:
        raise DapbenchError(
            f"{source} is not what its run wrote: {first_problems(problems)}",
            "restore the record from version control, or delete it and run it again",
        )


def first_problems(problems: list[str], shown: int = 3) -> str:
    """The first ``shown`` of a record's problems, and how many more there are, as one error message says them."""
    more = len(problems) - shown
    return "; ".join(problems[:shown]) + (f" (and {more} more)" if more > 0 else "")


def _identity_problems(record: dict[str, Any], path: Path | None) -> list[str]:
    from benchmark.records.identity import record_identity, sequence_tag

    run_id, out = record["run_id"], []
    if path is not None and path.stem != run_id:
        out.append(f"its file name {path.name} is not its run id {run_id}")
    if not run_id.startswith(f"{record['method']}-") or f"-seed{record['seed']}-" not in run_id:
        out.append(f"its run id {run_id} does not name its method {record['method']!r} and seed {record['seed']}")
    label = record["method_label"]
    if len(label) > LABEL_LIMIT:
        out.append(f"its method_label is {len(label):,} characters long, over the {LABEL_LIMIT:,} a row label may hold")
    elif label != record["method"] and not label.startswith(f"{record['method']}["):
        out.append(f"its method_label {label!r} is not a row of its method {record['method']!r}")
    identity = record_identity(record)
    if identity is not None:
        tag = sequence_tag(record["config"].get("sequence", ""), tuple(record["sequence"]))
        expected = identity.run_id(record["seed"], record["config"].get("sequence", ""))
        if expected != run_id:
            out.append(f"its configuration, inputs or options hash to {expected}, not to its run id ({tag})")
    return out


def _type_problems(record: dict[str, Any]) -> list[str]:
    """Fields a reader counts or labels with: the row label the run's method and options give, whole counts."""
    from benchmark.records.identity import canonical_recipe, row_label

    out, identity = [], record.get("identity") or {}
    if "method_options" in identity:
        label = row_label(record["method"], identity["method_options"], canonical_recipe(record["config"]))
        if record["method_label"] != label:
            out.append(f"its method_label {record['method_label']!r} is not {label!r} (what its method, options give)")
    counts = {"trainable_parameters": (record.get("trainable_parameters"), 0)}
    environment = record.get("environment") or {}
    for key in ("torch_threads", "num_processes"):
        if key in environment:
            counts[f"environment.{key}"] = (environment[key], 1)
    for name, (value, least) in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            out.append(f"{name} {value!r} is not a whole number >= {least}")
        elif name == "environment.torch_threads" and value > MAX_THREADS:
            out.append(f"{name} {value} is more than the {MAX_THREADS} threads any run uses")
    timing = record.get("timing") if isinstance(record.get("timing"), dict) else {}
    for key in ("wall_seconds", "dap_seconds", "last_invocation_seconds"):
        if key not in timing and key != "wall_seconds":  # the oldest records lack the other two
            continue
        value = timing.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 10**9:
            out.append(f"timing.{key} {value!r} is not a number of seconds (0 to 10^9)")
    return out


def _non_finite(record: dict[str, Any]) -> list[str]:
    try:  # the C encoder finds any NaN or infinity in milliseconds; naming where is only needed when it does
        json.dumps(record, allow_nan=False)
        return []
    except ValueError:
        return [f"{name} is {value}" for name, value in _numbers(record) if not math.isfinite(value)]


def _numbers(value: Any, name: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{name}.{key}" if name else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _numbers(item, f"{name}[{index}]")
    elif isinstance(value, float):
        yield name, value


def _derived_problems(record: dict[str, Any]) -> list[str]:
    from benchmark.metrics import record_loss_metrics
    from benchmark.records.build import summary_of

    out = []
    metrics = record_loss_metrics(record)
    for key, value in record["lm_loss"]["metrics"].items():
        if not _same(value, metrics.get(key)):
            out.append(f"lm_loss.metrics.{key} {value} is not what its held-out losses give ({metrics.get(key)})")
    for where, cells in _end_task_blocks(record):
        for score, block in cells["summary"].items():
            expected = summary_of(cells["matrices"][score], record["capabilities"])
            for key in set(block or {}) | set(expected or {}):
                got, want = (block or {}).get(key), (expected or {}).get(key)
                if not _same(got, want):
                    out.append(f"{where}summary.{score}.{key} {got} is not what its matrix gives ({want})")
        out += _prediction_problems(record, where, cells)
    return out + _chunk_problems(record)


def _end_task_blocks(record: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every set of end-task cells a record holds, with where it sits: the run's own protocol's (the record's
    ``matrices``, ``summary`` and ``predictions``), then each protocol's beside it (``end_tasks_beside``)."""
    yield "", record
    for name, block in (record.get("end_tasks_beside") or {}).items():
        yield f"end_tasks_beside.{name}.", block


def _prediction_problems(record: dict[str, Any], where: str, cells: dict[str, Any]) -> list[str]:
    """Every scored cell's scores are what its test predictions give against the task's test labels."""
    from benchmark.metrics import backbone_flags, classification_scores

    predictions, labels = cells.get("predictions"), record.get("test_labels")
    if not predictions or not labels:
        return []
    out, more = [], cells.get("seed_predictions") or {}
    if set(more) - set(predictions):
        out.append(f"{where}seed_predictions name cells without predictions")
    for cell, predicted in predictions.items():
        t, k = map(int, cell.split("/"))
        task = labels[record["end_tasks"][k]]
        every = [predicted, *more.get(cell, [])]
        if any(len(guesses) != len(task["labels"]) for guesses in every):
            out.append(f"{where}predictions {cell} do not cover the test set of {record['end_tasks'][k]}")
            continue
        each = [classification_scores(task["labels"], guesses, task["classes"]) for guesses in every]
        scores = {score: sum(s[score] for s in each) / len(each) for score in each[0]}  # the mean of its fine-tunes
        for score, value in scores.items():
            recorded = cells["matrices"][score][t][k]
            if not _same(recorded, value):
                out.append(f"{where}matrices.{score}[{t}][{k}] {recorded} is not what its predictions give ({value})")
    matrix = cells["matrices"]["acc"]
    computed = {f"{t}/{k}" for t, row in enumerate(matrix) for k, v in enumerate(row) if v is not None}
    if computed != set(predictions):
        out.append(f"{where}the scored cells and the cells with predictions differ")
    flags = cells.get("backbone_flags")
    if flags is not None and flags != backbone_flags(predictions, labels, record["end_tasks"], more):
        out.append(f"{where}backbone_flags are not what its predictions give")
    return out


def _chunk_problems(record: dict[str, Any]) -> list[str]:
    losses = record["lm_loss"]
    chunks = losses.get("chunks")
    if not chunks:
        return []
    out = []
    rows = [("base", losses["base"], chunks["base"])]
    rows += [(f"after_domain[{t}]", row, chunks["after_domain"][t]) for t, row in enumerate(losses["after_domain"])]
    for name, row, sums in rows:
        if (row is None) != (sums is None):
            out.append(f"lm_loss.{name} and its per-chunk sums do not exist together")
            continue
        for column, value in (row or {}).items():
            counts = chunks["counts"].get(column)
            per_chunk = (sums or {}).get(column)
            if not counts or per_chunk is None or len(per_chunk) != len(counts):
                out.append(f"lm_loss.chunks.{name}.{column} does not match its chunk counts")
            elif abs(sum(per_chunk) / sum(counts) - value) > CHUNK_TOLERANCE:
                out.append(f"lm_loss.{name}.{column} {value} is not what its per-chunk sums give")
    return out


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=0.0, abs_tol=DERIVED_TOLERANCE)
