"""Reading records: validate, migrate older schemas, find the record files of a results folder (no symbolic link
followed), and load them through the checks every record passes (:mod:`benchmark.records.checks`)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmark.errors import DapbenchError
from benchmark.families import MASKED_LM
from benchmark.io import read_json, safe_name
from benchmark.records.checks import first_problems
from benchmark.records.schema import (
    REQUIRED,
    SCHEMA_VERSION,
    RunRecord,
    in_schema_order,
    portable_config,
    type_problems,
)


def validate_record(record: Any, source: str) -> RunRecord:
    """``record`` as a :class:`RunRecord` if it is one of the current schema, else a named error."""
    if not isinstance(record, dict):
        raise DapbenchError(f"{source} is not a run record (not a JSON object)", "remove it from results/")
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise DapbenchError(
            f"{source} is not a complete schema-{SCHEMA_VERSION} run record: missing {', '.join(missing)}",
            "re-run it with the current dapbench, or remove it from results/",
        )
    problems = type_problems(RunRecord, record)  # before any field is used
    if problems:
        raise DapbenchError(
            f"{source} is not a run record of the declared schema: {first_problems(problems)}",
            "restore the record from version control, or delete it and run it again",
        )
    safe_name(record["run_id"], "record run id")  # it names files and folders
    safe_name(record["profile"], "record profile")
    if record["status"] != "complete":
        raise DapbenchError(f"{source} has status {record['status']!r}", "only complete records belong in results/")
    return record  # type: ignore[return-value]


def migrate_record(record: dict[str, Any], source: str) -> dict[str, Any]:
    """``record`` upgraded to :data:`SCHEMA_VERSION`; a record of a newer schema is refused."""
    version = record.get("schema")
    if not isinstance(version, int) or version < 1:
        raise DapbenchError(f"{source} has no valid schema version ({version!r})", "remove it from results/")
    if version > SCHEMA_VERSION:
        raise DapbenchError(
            f"{source} is a schema-{version} record; this dapbench reads schema {SCHEMA_VERSION} and older",
            "update dapbench (git pull; pip install -e .) to read it",
        )
    identity = record.get("identity")
    if version >= 3 and not (
        isinstance(identity, dict) and identity.keys() & {"method_options", "migrated_from_schema"}
    ):
        # every record since schema 3 names what its id hashed; without it no check could tie numbers to their name
        raise DapbenchError(
            f"{source} is a schema-{version} record without its identity (what its run id hashed)",
            "restore the record from version control, or delete it and run it again",
        )
    if version < 4:
        record = _kind_neutral_names(record)
    if version == 1:
        record = _from_schema_1(record)
    if record["schema"] == 2:
        record = _from_schema_2(record)
    return in_schema_order({**record, "schema": SCHEMA_VERSION})


LEGACY_LOSS_NAMES = {"mlm_loss": "lm_loss", "mlm_loss_chunks": "lm_loss_chunks"}
"""Names the held-out losses had before they were kind-neutral (records before schema 4, and the stage progress
files of runs started by that code), with their names now."""


def kind_neutral(entry: Any) -> Any:
    """``entry`` (a record, a domain's entry or a stage's progress file) with the held-out losses under their
    kind-neutral names (:data:`LEGACY_LOSS_NAMES`), in place of the old ones; every value as it was."""
    if not isinstance(entry, dict) or not LEGACY_LOSS_NAMES.keys() & entry.keys():
        return entry
    return {LEGACY_LOSS_NAMES.get(key, key): value for key, value in entry.items()}


def _kind_neutral_names(record: dict[str, Any]) -> dict[str, Any]:
    """Schema 3 and older -> 4: the held-out losses renamed ``mlm_loss`` -> ``lm_loss`` (the record's block and each
    domain's entry); every value stays as it was."""
    return {**kind_neutral(record), "domains": [kind_neutral(domain) for domain in record.get("domains") or []]}


def _from_schema_1(record: dict[str, Any]) -> dict[str, Any]:
    from benchmark.metrics import record_loss_metrics

    record = dict(record)
    config = portable_config(record["config"])
    # Schema-1 records were made before the linear probe existed whenever they lack the field.
    config["finetune"] = {"protocol": "finetune", **config["finetune"]}
    record["config"] = config
    record["identity"] = {"migrated_from_schema": 1}  # its id hashed machine paths: nothing to re-derive it from
    record.setdefault("representation", None)
    record.setdefault("majority_class", None)
    record["lm_loss"] = {**record["lm_loss"], "metrics": record_loss_metrics(record)}
    record["lm_loss"].setdefault("batch_checksums", {})
    record["schema"] = 2
    return record


def _from_schema_2(record: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 -> 3: no per-chunk losses (the evaluation sample's error is unknown for it); no comparison role and
    no note, which a schema-2 record did not keep (``dapbench migrate`` fills them from the installed plugin,
    :func:`completed_record`)."""
    record = {
        **record,
        "schema": 3,
        "model_kind": MASKED_LM.name,
        "identity": record.get("identity") or {"migrated_from_schema": 1},  # None: a schema-1 record migrated to 2
        "predictions": None,
        "test_labels": None,
        "comparison_role": None,
        "leaderboard_note": "",
    }
    record["lm_loss"] = {**record["lm_loss"], "chunks": None}
    return {key: record[key] for key in REQUIRED}


def completed_record(record: RunRecord, plugin_of: Callable[[str], type | None]) -> RunRecord:
    """``record`` with the fields a run writes today that records made before them lack, filled in as a run now writes
    them: each protocol's ``backbone_flags`` (derived from its predictions) and, from the method's plugin
    (``plugin_of(name)``: its class, None where it is not installed), the ``comparison_role`` of a method at its
    defaults and the method's ``leaderboard_note``. ``dapbench migrate`` writes them, so that the report reads the
    records alone; every number is unchanged."""
    from benchmark.metrics import record_backbone_flags

    out: dict[str, Any] = dict(record)
    if out.get("predictions") and out.get("test_labels") and "backbone_flags" not in out:
        out["backbone_flags"] = record_backbone_flags(out)
    if out.get("end_tasks_beside") and out.get("test_labels"):
        out["end_tasks_beside"] = {
            name: cells if "backbone_flags" in cells else {**cells, "backbone_flags": record_backbone_flags(out, name)}
            for name, cells in out["end_tasks_beside"].items()
        }
    cls = plugin_of(out["method"])
    at_defaults = out["method_label"] == out["method"]
    if cls is not None and at_defaults and out.get("comparison_role") is None and cls.comparison_role is not None:
        out["comparison_role"] = cls.comparison_role  # what the run writes today for the method at its defaults
    if cls is not None and not out.get("leaderboard_note") and cls.leaderboard_note:
        out["leaderboard_note"] = cls.leaderboard_note
    return in_schema_order(out)


def load_record(path: str | Path) -> RunRecord:
    """Read, migrate and check one run record file: its schema, that its run id is its file name, method and seed
    (and, for schema 3, the hash of its own identity fields), and that every derived number is what its raw
    numbers give (:func:`benchmark.records.checks.check_record`). A schema-5 record is read with its evaluation
    samples from its sidecars (:mod:`benchmark.records.samples`), whose checksums it names."""
    from benchmark.records.checks import check_record

    path = Path(path)
    if path.is_symlink():
        raise DapbenchError(
            f"{path} is a symbolic link: records are read only as plain files inside the results folder",
            "replace the link by a copy of the record, or remove it",
        )
    data = read_json(path, "run record")
    if not isinstance(data, dict):
        raise DapbenchError(f"{path} is not a run record (not a JSON object)", "remove it from results/")
    record = validate_record(migrate_record(with_samples(data, path), str(path)), str(path))
    check_record(record, path)
    return record


def with_samples(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A record file's content with its evaluation samples joined in from its sidecars, where it keeps them apart
    (schema 5 on); an older record, or a whole one (a record as the library returns it, dumped as JSON), as it is."""
    from benchmark.records import samples as sidecars

    pointer = data.get("samples")
    if not isinstance(data.get("schema"), int) or not 5 <= data["schema"] <= SCHEMA_VERSION:
        return data  # older: whole as it is; newer: refused by its schema version (migrate_record)
    if pointer is None and {"predictions", "test_labels"} <= data.keys():
        return data
    if not isinstance(pointer, dict) or not {"file", "sha256", "shared_file", "shared_sha256"} <= pointer.keys():
        raise DapbenchError(f"{path} names no samples files (its 'samples' block)", "re-run it, or restore it from git")
    own_file = safe_name(pointer["file"], "samples file")
    shared_file = safe_name(pointer["shared_file"], "samples file")
    own_rows = sidecars.read_rows(path.parent / own_file, pointer["sha256"], str(path))
    shared = _shared_samples(path.parent / shared_file, pointer["shared_sha256"], str(path))
    return sidecars.join_samples(data, sidecars.Samples(sidecars.own_from_rows(own_rows, pointer), shared))


_SHARED_CACHE: dict[tuple, dict[str, Any]] = {}
"""Shared sidecars already read in this process, by path, checksum and the file's mtime and size: a group's records all
name one."""


def _shared_samples(path: Path, sha256: str, source: str) -> dict[str, Any]:
    from benchmark.records import samples as sidecars

    stat = path.stat() if path.is_file() else None  # an edited file is read (and its checksum checked) again
    key = (str(path.resolve()), sha256, stat and stat.st_mtime_ns, stat and stat.st_size)
    if key not in _SHARED_CACHE:
        _SHARED_CACHE[key] = sidecars.shared_from_rows(sidecars.read_rows(path, sha256, source))
    return copy.deepcopy(_SHARED_CACHE[key])


def write_record(path: str | Path, record: RunRecord) -> None:
    """Write ``record`` to ``path`` (atomically) after the very checks :func:`load_record` applies to it when read:
    dapbench never writes a record that it, or the report, would refuse afterwards (every write path calls this).
    The evaluation samples go to sidecars first (:mod:`benchmark.records.samples`), the summary naming them last,
    so a record file never names a sidecar that is not there."""
    import json

    from benchmark.io import atomic_write_text, json_default, readable_json
    from benchmark.records.checks import check_record

    path = Path(path)
    plain = json.loads(json.dumps(record, default=json_default))  # as a reader will see it
    checked = validate_record(migrate_record(plain, str(path)), str(path))
    check_record(checked, path)
    atomic_write_text(path, readable_json(lean_record(checked, path)))


def lean_record(record: dict[str, Any], path: Path) -> dict[str, Any]:
    """Write ``record``'s sidecars beside ``path`` and return the summary that names them (schema 5)."""
    import hashlib

    from benchmark.io import atomic_write_bytes
    from benchmark.records import samples as sidecars

    lean, samples = sidecars.split_samples(record)
    own_name = f"{record['run_id']}{sidecars.OWN_SUFFIX}"
    own = sidecars.parquet_bytes(sidecars.own_rows(samples.own, str(path)), "run samples")
    shared_path = path.parent / f"{sidecars.SHARED_PREFIX}{sidecars.shared_digest(samples.shared)}.parquet"
    shared = _stored_shared(shared_path, samples.shared, str(path))
    atomic_write_bytes(path.parent / own_name, lambda tmp: tmp.write_bytes(own))
    lean["samples"] = {
        **lean["samples"],
        "file": own_name,
        "sha256": hashlib.sha256(own).hexdigest(),
        "shared_file": shared_path.name,
        "shared_sha256": hashlib.sha256(shared).hexdigest(),
    }
    return lean


def _stored_shared(path: Path, shared: dict[str, Any], source: str) -> bytes:
    """The bytes of the shared sidecar at ``path``: the file already there when it holds ``shared`` (another record
    of the group wrote it), else written now."""
    import hashlib

    from benchmark.io import atomic_write_bytes
    from benchmark.records import samples as sidecars

    if path.is_file() and not path.is_symlink():
        data = path.read_bytes()
        with contextlib.suppress(DapbenchError):
            if _shared_samples(path, hashlib.sha256(data).hexdigest(), source) == shared:
                return data
    data = sidecars.parquet_bytes(sidecars.shared_rows(shared, source), "group samples")
    atomic_write_bytes(path, lambda tmp: tmp.write_bytes(data))
    return data


REPORT_FOLDER = "report"
"""The folder under ``results/`` where ``dapbench report`` writes what it generates (tables, plots, a manifest)."""
OTHER_REPORTS = ("bench", REPORT_FOLDER)
"""Folders directly under ``results/`` that hold files other than run records (``dapbench bench --save``, the
report's generated files)."""


def record_paths(results_dir: str | Path) -> list[Path]:
    """The JSON files under ``results_dir`` (recursively) that are run records: all but :data:`OTHER_REPORTS`.
    A symbolic link inside (to a record or a folder elsewhere) is a named error: records are read only as plain
    files inside the results folder, and a linked folder would silently hide or add records."""
    import os

    root = Path(results_dir)
    found = []
    for folder, subfolders, files in os.walk(root):
        here = Path(folder)
        if here == root:
            subfolders[:] = [d for d in subfolders if d not in OTHER_REPORTS]
        for name in [*subfolders, *files]:
            if (here / name).is_symlink():
                raise DapbenchError(
                    f"{here / name} is a symbolic link: records are read only as plain files inside {root}",
                    "replace the link by a copy (or remove it)",
                )
        # a name that starts with a dot is a writer's temporary (``.X.json.<host>-<pid>.tmp.json``) or hidden: never a
        # record, so a report beside a run, or a run resumed after a kill between write and rename, never reads one
        found += [here / name for name in files if name.endswith(".json") and not name.startswith(".")]
    return sorted(found)


def load_records(results_dir: str | Path) -> list[RunRecord]:
    """Every run record under ``results_dir`` (recursively), migrated; a corrupt or foreign file is an error."""
    return [record for _, record in _loaded(results_dir)]


def leaderboard_records(results_dir: str | Path) -> list[RunRecord]:
    """The records a leaderboard of ``results_dir`` reports: every record but those of key-number folders
    (:data:`KEY_NUMBERS_MARKER`), which are still read and checked, so a corrupt one is named."""
    return [record for _, record in leaderboard_entries(results_dir)]


def leaderboard_entries(results_dir: str | Path) -> list[tuple[Path, RunRecord]]:
    """:func:`leaderboard_records` with each record's file."""
    return [(path, record) for path, record in _loaded(results_dir) if not in_key_number_folder(path, results_dir)]


KEY_NUMBERS_MARKER = "KEY-NUMBERS.md"
"""A folder under ``results/`` holding a file of this name keeps key numbers: records that CI re-derives to pin the
code's behaviour (the repository's ``results/ci/``), not leaderboard entries. Whatever profile a record has, only
such a folder keeps it off the leaderboard: a user's own runs, ``--profile ci`` included, are always reported."""


def in_key_number_folder(path: Path, results_dir: str | Path) -> bool:
    """Whether the record file ``path`` lies in a key-number folder (:data:`KEY_NUMBERS_MARKER`) below
    ``results_dir``."""
    root = Path(results_dir)
    # only a folder below results/ keeps key numbers: a marker in results/ itself would hide every record
    return any((folder / KEY_NUMBERS_MARKER).is_file() for folder in path.parents if root in folder.parents)


def _loaded(results_dir: str | Path) -> list[tuple[Path, RunRecord]]:
    root = Path(results_dir)
    if not root.is_dir():
        raise DapbenchError(f"no results directory at {root}", "run `dapbench run` first or pass --output-dir")
    return [(path, load_record(path)) for path in record_paths(root)]
