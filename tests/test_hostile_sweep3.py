"""The third hostile sweep (issue #88), the cases this round holds so far: each one a named error before any work, or
the correct behaviour, never data lost."""

import json
from pathlib import Path

import pytest
from cli_helpers import REPO, copy_record, whole_record

from benchmark.api import plot_learning_rates
from benchmark.cli import main
from benchmark.errors import DapbenchError
from benchmark.records.store import KEY_NUMBERS_MARKER, leaderboard_records, load_record, record_paths

CI = sorted((REPO / "results" / "ci").glob("*.json"))


def _results(tmp_path: Path, n: int = 1) -> list[Path]:
    return [copy_record(path, tmp_path / "results" / "ci-copy") for path in CI[:n]]


def test_a_writers_temporary_beside_a_record_is_never_read_as_one(tmp_path):
    (record,) = _results(tmp_path)
    temporary = record.with_name(f".{record.name}.host-123.tmp.json")
    temporary.write_text(record.read_text()[:100])  # a run killed between writing and renaming its record
    assert record_paths(tmp_path / "results") == [record]
    assert main(["report", "--output-dir", str(tmp_path), "--quiet"]) == 0
    assert temporary.exists()  # not dapbench's to delete: another process may still rename it


def test_lr_curve_refuses_to_write_over_a_record(tmp_path, capsys):
    (record,) = _results(tmp_path)
    before = record.read_bytes()
    assert main(["lr-curve", str(record), "--output", str(record)]) == 2
    assert "is not a new PNG file" in capsys.readouterr().err and record.read_bytes() == before
    with pytest.raises(DapbenchError, match="not a new PNG"):
        plot_learning_rates([record], tmp_path / "curve.json")
    assert plot_learning_rates([record], tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("command", ["run", "report", "migrate", "export"])
def test_an_empty_output_dir_is_a_named_error_not_the_current_folder(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = {"run": ["run", "--output-dir", ""], "export": ["export", "x", "--output-dir", " "]}.get(
        command, [command, "--output-dir", ""]
    )
    assert main(args) == 2
    assert "--output-dir is empty" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_a_key_numbers_marker_in_results_itself_hides_nothing(tmp_path):
    (record,) = _results(tmp_path)
    (tmp_path / "results" / KEY_NUMBERS_MARKER).write_text("")
    assert [r["run_id"] for r in leaderboard_records(tmp_path / "results")] == [record.stem]


@pytest.mark.parametrize("value", [-1e300, "an hour", None, 1e300])
def test_a_wall_time_that_is_no_number_of_seconds_is_named(value, tmp_path):
    (record,) = _results(tmp_path)
    whole = whole_record(record)
    whole["timing"]["wall_seconds"] = value
    record.write_text(json.dumps(whole))
    with pytest.raises(DapbenchError, match="timing.wall_seconds .* is not a number of seconds"):
        load_record(record)


def test_a_plugin_whose_entry_point_names_a_missing_class_is_named_and_the_rest_still_list(monkeypatch, capsys):
    from benchmark.registry import Registry

    registry = Registry({"ncl": "methods.ncl:NCL", "broken": "methods.ncl:NoSuchClass"})
    with pytest.raises(DapbenchError, match="'broken' is registered as methods.ncl:NoSuchClass, which cannot be"):
        registry.get("broken")
    assert registry.get("ncl").name == "ncl"
    monkeypatch.setattr("benchmark.registry.default_registry", lambda: registry)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "broken" in out and "cannot be loaded" in out and "ncl " in out
