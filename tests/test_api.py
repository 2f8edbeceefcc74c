"""The library entry point and the record schema: what a notebook user calls, and how records are read."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from benchmark.api import leaderboard_table, migrate_results, run_benchmark
from benchmark.errors import DapbenchError
from benchmark.records.schema import REQUIRED, SCHEMA_VERSION
from benchmark.records.store import load_record, load_records, record_paths

COMMITTED = Path(__file__).resolve().parents[1] / "results"


def test_run_benchmark_returns_typed_records_and_a_table(tiny_config):
    config = dataclasses.replace(tiny_config, methods=("none", "ncl"), sequence="alpha")
    records = run_benchmark(config)
    assert [r["method"] for r in records] == ["none", "ncl"]
    for record in records:
        assert record["schema"] == SCHEMA_VERSION and set(REQUIRED) <= set(record)
        assert record["identity"]["results_version"] >= 2
    table = leaderboard_table(Path(config.output_dir) / "results")
    assert sorted(table["method"]) == ["ncl", "none"] and "forgetting" in table.columns
    assert (Path(config.output_dir) / "leaderboard.md").is_file()
    again = run_benchmark(config)  # finished runs are kept, not redone
    assert [r["run_id"] for r in again] == [r["run_id"] for r in records]


def test_a_schema_1_record_is_migrated_on_load(tmp_path):
    # A schema-1 record as the first mini leaderboard wrote it (its machine paths replaced by /data/...).
    source = Path(__file__).parent / "fixtures" / "pool-seq0-seed2021-ce864fc608.json"
    copy = tmp_path / "results" / "mini" / source.name
    copy.parent.mkdir(parents=True)
    shutil.copy(source, copy)
    record = load_record(copy)
    assert record["schema"] == SCHEMA_VERSION and record["identity"] == {"migrated_from_schema": 1}
    assert record["config"]["finetune"]["protocol"] == "finetune"
    assert set(record["lm_loss"]["metrics"]) >= {"plasticity", "forgetting", "general_rise"}
    assert "output_dir" not in record["config"] and record["config"]["model"] == "local:small"
    assert migrate_results(tmp_path / "results") == [copy]
    assert json.loads(copy.read_text())["schema"] == SCHEMA_VERSION and migrate_results(tmp_path / "results") == []


def test_every_committed_record_loads_through_the_schema_and_carries_no_absolute_path():
    records = load_records(COMMITTED)
    assert {r["profile"] for r in records} >= {"ci", "mini"}
    for path in record_paths(COMMITTED):
        assert '"/work/' not in path.read_text() and '"/tmp/' not in path.read_text(), path


def test_a_record_of_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "future.json"
    path.write_text(json.dumps({"schema": SCHEMA_VERSION + 1, "run_id": "x"}))
    with pytest.raises(DapbenchError, match="update dapbench"):
        load_record(path)


def test_a_rerun_supersedes_its_migrated_schema_1_record_and_the_leaderboard_says_so():
    from benchmark.report.groups import group_records

    old = load_record(Path(__file__).parent / "fixtures" / "pool-seq0-seed2021-ce864fc608.json")
    new = {**old, "run_id": "pool-seq0-seed2021-0123456789", "identity": {"results_version": 2, "method_version": 1}}
    other_seed = {**old, "seed": 7}
    groups, dropped = group_records([old, new, other_seed])
    assert [r["run_id"] for g in groups for r in g.records] == [new["run_id"]]
    # both schema-1 records (numerics unrecorded) are superseded by the group of recorded numerics: left out by name
    reasons = {d.run_id: d.reason for d in dropped}
    assert set(reasons) == {old["run_id"]} | {other_seed["run_id"]} and "older numerics" in reasons[old["run_id"]]


@pytest.mark.parametrize(
    ("label", "command"),
    [
        ("ewc[strength=500.0]", "--methods ewc --set ewc.strength=500.0"),
        (
            "ncl[replay.general=0.25,schedule.name=wsd]",
            "--methods ncl --set replay.general=0.25 --set schedule.name=wsd",
        ),
    ],
)
def test_a_row_label_given_as_a_method_is_refused_with_the_command_that_runs_that_row(label, command):
    from benchmark.api import resolve_config

    with pytest.raises(DapbenchError, match="is a leaderboard row label") as raised:
        resolve_config("synthetic", methods=[label])
    assert f"run that row with {command}" in str(raised.value)
    resolve_config("synthetic", methods=command.split()[1:2])  # the row's method is a method name
