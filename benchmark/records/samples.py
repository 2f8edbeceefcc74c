"""A record's evaluation samples in columnar sidecars (schema 5): the record file keeps the summary a reviewer reads
in a diff, and the samples the report bootstraps over (held-out chunk losses, end-task predictions, test labels) live
beside it in Parquet.

Two sidecars per record, both in the record's folder:

- ``<run_id>.samples.parquet``, the run's own samples: its chunk loss sums after every domain and every end-task
  prediction (its own protocol's and those of ``end_tasks_beside``);
- ``samples-<digest>.parquet``, what every record of a group holds alike: the chunk counts, the base model's chunk
  loss sums, the test labels and class counts. It is named by a digest of its content, so records that share it
  point at one file, stored once.

Both are one long table of the same columns (:data:`COLUMNS`): ``part`` says what a row is, ``protocol`` which end-task
protocol a prediction is of (empty for the run's own), ``stage`` the domain index t (-1 where none), ``key`` the
held-out set, end task or cell ``t/k``, ``position`` the chunk or test example, ``value`` the number. Loss sums are
kept at :data:`~benchmark.records.schema.CHUNK_SUM_DECIMALS` decimals as the record always kept them, stored exactly as
integers of 10^-4 nats (``value / 10**4`` is the very float the JSON record held). The record names each sidecar with
the SHA-256 of its bytes: a missing, damaged or edited sidecar is a named error before any number is read.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.errors import DapbenchError
from benchmark.records.schema import CHUNK_SUM_DECIMALS, in_schema_order

SAMPLE_FIELDS = ("predictions", "test_labels")
"""Top-level record fields that move to the sidecars whole (``lm_loss.chunks`` and each protocol's predictions in
``end_tasks_beside`` move too)."""
SEEDS = "seed_predictions"
"""The field of a record (and of each protocol beside its own) that keeps the test predictions of a cell's later
fine-tunes (``finetune.seeds``); in the sidecar, fine-tune i of protocol P is the protocol ``P#i``."""
FINE_TUNE_MARK = "#"
COLUMNS = ("part", "protocol", "stage", "key", "position", "value")
"""The sidecars' columns, in order."""
OWN_SUFFIX = ".samples.parquet"
SHARED_PREFIX = "samples-"
SCALE = 10**CHUNK_SUM_DECIMALS
_LOSS_PARTS = {"chunk_loss", "base_chunk_loss"}


@dataclass(frozen=True)
class Samples:
    """A record's evaluation samples split into the run's own and what its group shares (plain JSON values)."""

    own: dict[str, Any]
    shared: dict[str, Any]


def split_samples(record: dict[str, Any]) -> tuple[dict[str, Any], Samples]:
    """``record`` without its evaluation samples (plus a ``samples`` block saying which of them it has), and the
    samples themselves."""
    lean = {key: value for key, value in record.items() if key not in (*SAMPLE_FIELDS, SEEDS, "samples")}
    chunks = record["lm_loss"].get("chunks")
    lean["lm_loss"] = {key: value for key, value in record["lm_loss"].items() if key != "chunks"}
    beside = record.get("end_tasks_beside") or {}
    if "end_tasks_beside" in record:
        lean["end_tasks_beside"] = {
            name: {key: value for key, value in cells.items() if key not in ("predictions", SEEDS)}
            for name, cells in beside.items()
        }
    predictions = {"": record.get("predictions"), **{n: c.get("predictions") for n, c in beside.items()}}
    for name, cells in [("", record), *beside.items()]:
        for cell, later in (cells.get(SEEDS) or {}).items():
            for i, guesses in enumerate(later, 2):  # the first fine-tune's are the protocol's own predictions
                predictions.setdefault(f"{name}{FINE_TUNE_MARK}{i}", {})[cell] = guesses
    own = {"after_domain": None if chunks is None else chunks["after_domain"], "predictions": predictions}
    shared = {
        "counts": None if chunks is None else chunks["counts"],
        "base": None if chunks is None else chunks["base"],
        "test_labels": record.get("test_labels"),
    }
    lean["samples"] = {
        "chunks": None if chunks is None else [stage is not None for stage in chunks["after_domain"]],
        "predictions": {name: value is not None for name, value in own["predictions"].items()},
        "test_labels": record.get("test_labels") is not None,
    }
    return lean, Samples(own, shared)


def join_samples(lean: dict[str, Any], samples: Samples) -> dict[str, Any]:
    """The whole record: ``lean`` with its samples put back where a schema-4 record kept them."""
    record = {key: value for key, value in lean.items() if key != "samples"}
    own, shared = samples.own, samples.shared
    has = lean["samples"]
    chunks = None
    if has["chunks"] is not None:
        chunks = {"counts": shared["counts"], "base": shared["base"], "after_domain": own["after_domain"]}
    record["lm_loss"] = {**lean["lm_loss"], "chunks": chunks}
    predictions = own["predictions"]
    record["predictions"] = predictions.get("") if has["predictions"].get("") else None
    record["test_labels"] = shared["test_labels"] if has["test_labels"] else None
    if "end_tasks_beside" in lean:
        record["end_tasks_beside"] = {
            name: {**cells, "predictions": predictions.get(name)} for name, cells in lean["end_tasks_beside"].items()
        }
    for name, later in _later_fine_tunes(predictions).items():
        (record if name == "" else record["end_tasks_beside"][name])[SEEDS] = later
    return in_schema_order(record)


def _later_fine_tunes(predictions: dict[str, Any]) -> dict[str, dict[str, list[list[int]]]]:
    """Per protocol, the ``seed_predictions`` its sidecar keeps as protocols ``<name>#<fine-tune>`` (2, 3, ...)."""
    found: dict[str, dict[int, dict[str, list[int]]]] = {}
    for key, cells in predictions.items():
        if FINE_TUNE_MARK in key:
            name, number = key.rsplit(FINE_TUNE_MARK, 1)
            found.setdefault(name, {})[int(number)] = cells or {}
    out = {}
    for name, by_number in found.items():
        cells = by_number[min(by_number)]
        out[name] = {cell: [by_number[i][cell] for i in sorted(by_number)] for cell in cells}
    return out


# ----------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------
def _fixed(value: float, where: str) -> int:
    """A loss sum as an integer of 10^-4 nats; one that does not round-trip exactly is refused (never rounded)."""
    scaled = round(value * SCALE)
    if scaled / SCALE != value:
        raise DapbenchError(
            f"{where}: the chunk loss sum {value!r} has more than {CHUNK_SUM_DECIMALS} decimals",
            f"a record keeps chunk sums rounded to {CHUNK_SUM_DECIMALS} decimals: re-run it with this dapbench",
        )
    return scaled


def own_rows(own: dict[str, Any], where: str) -> list[tuple]:
    """The run's own samples as rows of :data:`COLUMNS`."""
    rows = []
    for t, stage in enumerate(own["after_domain"] or []):
        for name, sums in (stage or {}).items():
            rows += [("chunk_loss", "", t, name, i, _fixed(v, where)) for i, v in enumerate(sums)]
    for protocol, cells in own["predictions"].items():
        for cell, labels in (cells or {}).items():
            stage = int(cell.split("/")[0])
            rows += [("prediction", protocol, stage, cell, i, int(v)) for i, v in enumerate(labels)]
    return rows


def shared_rows(shared: dict[str, Any], where: str) -> list[tuple]:
    """What a group shares as rows of :data:`COLUMNS`."""
    rows = []
    for name, counts in (shared["counts"] or {}).items():
        rows += [("chunk_count", "", -1, name, i, int(v)) for i, v in enumerate(counts)]
    for name, sums in (shared["base"] or {}).items():
        rows += [("base_chunk_loss", "", -1, name, i, _fixed(v, where)) for i, v in enumerate(sums)]
    for task, entry in (shared["test_labels"] or {}).items():
        if set(entry) != {"classes", "labels"}:
            raise DapbenchError(f"{where}: test_labels[{task!r}] holds {sorted(entry)}", "re-run it with this dapbench")
        rows.append(("classes", "", -1, task, 0, int(entry["classes"])))
        rows += [("test_label", "", -1, task, i, int(v)) for i, v in enumerate(entry["labels"])]
    return rows


def _grouped(rows: list[tuple], part: str) -> dict[tuple, list]:
    """``(protocol, stage, key) -> values`` of one part, keys in their order of first appearance."""
    out: dict[tuple, list] = {}
    for row_part, protocol, stage, key, _, value in rows:
        if row_part == part:
            out.setdefault((protocol, stage, key), []).append(value / SCALE if part in _LOSS_PARTS else value)
    return out


def own_from_rows(rows: list[tuple], has: dict[str, Any]) -> dict[str, Any]:
    """The run's own samples from its sidecar's rows (``has``: the record's ``samples`` block)."""
    losses = _grouped(rows, "chunk_loss")
    after_domain = None
    if has["chunks"] is not None:
        after_domain = [
            {key: values for (_, stage, key), values in losses.items() if stage == t} if present else None
            for t, present in enumerate(has["chunks"])
        ]
    found = _grouped(rows, "prediction")
    predictions: dict[str, Any] = {}
    for protocol, present in has["predictions"].items():
        cells = {key: values for (name, _, key), values in found.items() if name == protocol}
        predictions[protocol] = cells if present else None
    return {"after_domain": after_domain, "predictions": predictions}


def shared_from_rows(rows: list[tuple]) -> dict[str, Any]:
    """What a group shares, from its sidecar's rows."""
    counts = {key: values for (_, _, key), values in _grouped(rows, "chunk_count").items()}
    base = {key: values for (_, _, key), values in _grouped(rows, "base_chunk_loss").items()}
    classes = _grouped(rows, "classes")
    labels = _grouped(rows, "test_label")
    test_labels = {
        key: {"classes": values[0], "labels": labels.get(("", -1, key), [])} for (_, _, key), values in classes.items()
    }
    return {"counts": counts or None, "base": base or None, "test_labels": test_labels or None}


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------
def shared_digest(shared: dict[str, Any]) -> str:
    """A digest of what a group shares (its content, not its file's bytes): the shared sidecar's name."""
    return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:16]


def parquet_bytes(rows: list[tuple], what: str) -> bytes:
    """``rows`` as a Parquet file (zstd; the same rows give the same bytes with the same pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in COLUMNS]
    table = pa.table(
        {
            "part": pa.array(columns[0], pa.string()),
            "protocol": pa.array(columns[1], pa.string()),
            "stage": pa.array(columns[2], pa.int16()),
            "key": pa.array(columns[3], pa.string()),
            "position": pa.array(columns[4], pa.int32()),
            "value": pa.array(columns[5], pa.int64()),
        },
        metadata={"dapbench": what, "value_scale_for_losses": str(SCALE)},
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd", compression_level=19, use_dictionary=["part", "protocol", "key"])
    return buffer.getvalue()


def read_rows(path: Path, sha256: str, source: str) -> list[tuple]:
    """The rows of the sidecar ``path`` after checking it is there and its bytes are the ones the record names."""
    import pyarrow.parquet as pq

    if path.is_symlink() or not path.is_file():
        raise DapbenchError(
            f"{source}: its samples file {path.name} is missing (or not a plain file) in {path.parent}",
            "restore it with the record (git checkout -- the folder), or re-run the record",
        )
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise DapbenchError(
            f"{source}: its samples file {path.name} is damaged or was edited (its SHA-256 is not the record's)",
            "restore it with the record (git checkout -- the folder), or re-run the record",
        )
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DapbenchError(f"{source}: its samples file {path.name} is not Parquet ({exc})", "re-run it") from exc
    if tuple(table.column_names) != COLUMNS:
        raise DapbenchError(f"{source}: {path.name} has columns {table.column_names}", "re-run the record")
    return list(zip(*(table.column(name).to_pylist() for name in COLUMNS), strict=True))
