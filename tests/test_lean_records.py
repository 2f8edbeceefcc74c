"""Lean records (issue #83): a record file is its summary, its evaluation samples live in Parquet sidecars that it names
by checksum, what a group shares is stored once, older records migrate without a number changing, and
``dapbench export`` writes the results as a dataset that pandas and ``datasets`` load."""

import json
import statistics
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from benchmark.api import migrate_results
from benchmark.cli import main
from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_json
from benchmark.records import store
from benchmark.records.samples import OWN_SUFFIX, SHARED_PREFIX
from benchmark.records.store import load_record, load_records, record_paths, write_record
from benchmark.report.writer import write_report

ROOT = Path(__file__).resolve().parents[1]


def _as_schema_4(record: dict) -> dict:
    """A record as a schema-4 run wrote it: whole, samples inline."""
    return {**record, "schema": 4}


@pytest.fixture
def lean(report_records, tmp_path):
    """The conftest's records written by this dapbench (lean files) under ``tmp_path/results/synthetic``."""
    folder = tmp_path / "results" / "synthetic"
    for record in report_records:
        write_record(folder / f"{record['run_id']}.json", record)
    return folder


def test_a_written_record_reads_back_whole_from_its_summary_and_sidecars(report_records, lean):
    for record in report_records:
        path = lean / f"{record['run_id']}.json"
        summary = json.loads(path.read_text())
        assert summary["schema"] == 5 and "predictions" not in summary and "chunks" not in summary["lm_loss"]
        assert (lean / summary["samples"]["file"]).name == f"{record['run_id']}{OWN_SUFFIX}"
        back = load_record(path)
        assert back["lm_loss"]["chunks"] == record["lm_loss"]["chunks"]
        assert back["predictions"] == record["predictions"] and back["test_labels"] == record["test_labels"]
        assert json.dumps({**back, "schema": 0}) == json.dumps({**store.in_schema_order(record), "schema": 0})


def test_what_a_group_shares_is_one_file(report_records, lean):
    shared = sorted(lean.glob(f"{SHARED_PREFIX}*.parquet"))
    assert len(shared) == 1 and len(list(lean.glob(f"*{OWN_SUFFIX}"))) == len(report_records)
    names = {json.loads(p.read_text())["samples"]["shared_file"] for p in lean.glob("*.json")}
    assert names == {shared[0].name}


@pytest.mark.parametrize("which", ["own", "shared"])
def test_a_sidecar_edited_by_one_byte_or_missing_is_named(report_records, lean, which):
    path = lean / f"{report_records[0]['run_id']}.json"
    pointer = json.loads(path.read_text())["samples"]
    sidecar = lean / pointer["file" if which == "own" else "shared_file"]
    data = bytearray(sidecar.read_bytes())
    data[len(data) // 2] ^= 0x01
    sidecar.write_bytes(bytes(data))
    with pytest.raises(DapbenchError, match=f"{sidecar.name} is damaged or was edited"):
        load_record(path)
    sidecar.unlink()
    with pytest.raises(DapbenchError, match=f"{sidecar.name} is missing"):
        load_record(path)


def test_a_record_naming_a_sidecar_outside_its_folder_is_refused(report_records, lean):
    path = lean / f"{report_records[0]['run_id']}.json"
    summary = json.loads(path.read_text())
    summary["samples"]["file"] = "../elsewhere.parquet"
    path.write_text(json.dumps(summary))
    with pytest.raises(DapbenchError, match="cannot name a file"):
        load_record(path)


def test_chunk_sums_with_more_decimals_than_a_record_keeps_are_refused_not_rounded(report_records, tmp_path):
    record = json.loads(json.dumps(report_records[0]))
    first = next(iter(record["lm_loss"]["chunks"]["after_domain"][0]))
    record["lm_loss"]["chunks"]["after_domain"][0][first][0] += 1e-7
    with pytest.raises(DapbenchError, match="more than 4 decimals"):
        store.lean_record(record, tmp_path / f"{record['run_id']}.json")


def test_migrate_rewrites_schema_4_records_lean_and_changes_no_number_or_report(report_records, tmp_path):
    out = tmp_path / "out"
    folder = out / "results" / "synthetic"
    for record in report_records:
        atomic_write_json(folder / f"{record['run_id']}.json", _as_schema_4(record))
    before = {p.name: json.dumps(load_record(p)) for p in record_paths(out / "results")}
    write_report(out)
    board = (out / "leaderboard.md").read_text()
    rewritten = migrate_results(out / "results")
    assert len(rewritten) == len(report_records) and migrate_results(out / "results") == []
    assert {p.name: json.dumps(load_record(p)) for p in record_paths(out / "results")} == before
    assert write_report(out, check=True)["stale"] == [] and (out / "leaderboard.md").read_text() == board
    sizes = [p.stat().st_size for p in record_paths(out / "results")]
    assert max(sizes) < min(len(json.dumps(r, indent=2)) for r in report_records)


def test_check_of_a_clone_without_a_built_report_compares_the_committed_files_alone(report_records, lean):
    out = lean.parents[1]
    write_report(out)
    board = (out / "leaderboard.md").read_text()
    built = out / "results" / "report"
    for path in sorted(built.rglob("*"), reverse=True):  # a fresh clone: the built report is not committed
        path.unlink() if path.is_file() else path.rmdir()
    built.rmdir()
    assert write_report(out, check=True)["stale"] == [] and not built.exists()
    (out / "leaderboard.md").write_text(board.replace("dapbench leaderboard", "edited leaderboard"))
    assert write_report(out, check=True)["stale"] == ["leaderboard.md"] and not built.exists()


def test_export_loads_in_pandas_and_datasets_with_a_runs_row_per_record(report_records, lean, tmp_path, capsys):
    out = lean.parents[1]
    assert main(["export", str(tmp_path / "dataset"), "--output-dir", str(out)]) == 0
    assert "runs 9 rows" in capsys.readouterr().out
    dataset = tmp_path / "dataset"
    runs = pd.read_parquet(dataset / "runs.parquet")
    assert sorted(runs.run_id) == sorted(r["run_id"] for r in report_records)
    assert {"plasticity", "forgetting", "general_rise", "final_macro_f1", "group", "protocol"} <= set(runs.columns)
    stages = pd.read_parquet(dataset / "stages.parquet")
    first = report_records[0]
    mine = stages[(stages.run_id == first["run_id"]) & (stages.stage == -1)]
    assert dict(zip(mine.eval_set, mine.loss, strict=True)) == first["lm_loss"]["base"]
    tasks = pd.read_parquet(dataset / "end_tasks.parquet")
    cell = tasks[(tasks.run_id == first["run_id"]) & (tasks.stage == 0)].iloc[0]
    predicted = first["predictions"]["0/0"]
    assert cell.classes_predicted == len(set(predicted)) and list(cell.predicted_classes) == sorted(set(predicted))
    assert cell.test_examples == len(predicted) and cell.classes_in_test >= cell.classes_predicted - 0
    from datasets import load_dataset

    loaded = load_dataset("parquet", data_files={"runs": str(dataset / "runs.parquet")})["runs"]
    assert loaded.num_rows == len(report_records)
    card = (dataset / "README.md").read_text()
    assert card.startswith("---\n") and "config_name: end_tasks" in card and "data_files: runs.parquet" in card


def test_export_writes_lm_eval_results_json_for_lm_eval_records(report_records, tmp_path):
    record = json.loads(json.dumps(report_records[0]))
    record["config"]["finetune"]["protocol"] = "lm_eval"
    export_results_folder = tmp_path / "dataset"
    from benchmark.report.export import export_results as export

    export([record], export_results_folder)
    files = sorted((export_results_folder / "lm_eval").glob("*.json"))
    assert files and all(json.loads(f.read_text())["results"] for f in files)
    task = record["end_tasks"][0]
    first = json.loads(files[0].read_text())["results"][task]
    assert first["acc,none"] == record["matrices"]["acc"][0][0]


def test_the_committed_results_are_lean():
    """Issue #83's bounds on the repository itself: the median record summary at most 40 KB, and ``results/`` (what a
    clone holds of it: tracked files only) at most 40 MB."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "results"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    files = [ROOT / name for name in tracked if name]
    if not files:
        pytest.skip("not a git checkout")
    records = [f for f in files if f.suffix == ".json" and "bench" not in f.parts]
    assert statistics.median(f.stat().st_size for f in records) <= 40_000
    assert sum(f.stat().st_size for f in files) <= 40 * 2**20
    assert not any(f.name.endswith(".json") and "report" in f.parts for f in files)


def test_every_committed_record_reads(tmp_path):
    """Every committed record loads with its sidecars (none missing or damaged)."""
    assert load_records(ROOT / "results")


def test_migrate_completes_records_made_before_their_flags_and_roles_and_moves_no_number(report_records, tmp_path):
    """Records made before ``backbone_flags`` were kept, or before their method declared its comparison role, are
    completed by ``dapbench migrate`` as a run now writes them; the report then reads the records alone."""
    folder = tmp_path / "results" / "synthetic"
    for record in report_records:
        older = {key: value for key, value in record.items() if key != "backbone_flags"}
        if record["method"] == "ncl":
            older["comparison_role"] = None  # as a record made before NCL declared its role
        write_record(folder / f"{record['run_id']}.json", older)
    assert "backbone_flags" not in load_record(next(record_paths(tmp_path / "results").__iter__()))
    rewritten = migrate_results(tmp_path / "results")
    assert len(rewritten) == len(report_records) and migrate_results(tmp_path / "results") == []
    for record in report_records:
        whole = tmp_path / "whole" / f"{record['run_id']}.json"
        write_record(whole, record)  # the record as its run wrote it, read back the same way
        completed = load_record(folder / whole.name)
        assert json.dumps(completed) == json.dumps(load_record(whole))  # flags and role as written; every number too


def test_the_leaderboard_is_a_function_of_the_records_alone_with_the_methods_unimportable(lean):
    """The report reads no plugin: with the ``methods`` package unimportable it writes the same leaderboard."""
    out = lean.parents[1]
    write_report(out)
    board = (out / "leaderboard.md").read_bytes()
    (out / "leaderboard.md").unlink()
    script = (
        "import sys; sys.modules['methods'] = None\n"  # `import methods` now raises ImportError
        "from benchmark.report.writer import write_report; write_report(sys.argv[1])\n"
        "assert 'methods' not in {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}\n"
    )
    subprocess.run(["python", "-c", script, str(out)], check=True, env={**__import__("os").environ})
    assert (out / "leaderboard.md").read_bytes() == board
