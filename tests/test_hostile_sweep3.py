"""The third hostile sweep (issue #88), the cases this round holds so far: each one a named error before any work, or
the correct behaviour, never data lost."""

import json
import re
import shutil
from pathlib import Path

import pytest
from cli_helpers import REPO, copy_record, foreign_folder, is_untouched, whole_record

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
    with pytest.raises(DapbenchError, match="timing.wall_seconds.*(not a number of seconds|should be a valid number)"):
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


def _edited(tmp_path: Path, edit) -> Path:
    """A committed record, whole, after ``edit(record)`` changed it in place, written back as its file."""
    (record,) = _results(tmp_path)
    whole = whole_record(record)
    edit(whole)
    record.write_text(json.dumps(whole))
    return record


WRONG_TYPES = {
    "matrices.acc holding a string": (lambda r: r["matrices"].update(acc="high"), "matrices.acc"),
    "lm_loss.base a list": (lambda r: r["lm_loss"].update(base=[1.0, 2.0]), "lm_loss.base"),
    "timing.wall_seconds missing": (lambda r: r["timing"].pop("wall_seconds"), "timing.wall_seconds"),
    "environment a list": (lambda r: r.update(environment=[1, 2]), "environment"),
    "sequence a string": (lambda r: r.update(sequence="alpha"), "sequence"),
    "end_tasks null": (lambda r: r.update(end_tasks=None), "end_tasks"),
    "capabilities a string": (lambda r: r.update(capabilities="all"), "capabilities"),
    "domains a dict": (lambda r: r.update(domains={"0": {}}), "domains"),
    "a count that is a bool": (lambda r: r.update(trainable_parameters=True), "trainable_parameters"),
    "a loss deep in a matrix a string": (lambda r: r["lm_loss"]["after_domain"][0].update(x="1.0"), "after_domain"),
}


@pytest.mark.parametrize("case", WRONG_TYPES)
def test_a_wrong_type_at_any_depth_is_named_before_any_field_is_used(case, tmp_path):
    edit, where = WRONG_TYPES[case]
    record = _edited(tmp_path, edit)
    with pytest.raises(DapbenchError, match=f"not a run record of the declared schema: .*{where}"):
        load_record(record)


def test_the_report_refuses_a_record_of_the_wrong_shape_with_a_named_error(tmp_path, capsys):
    _edited(tmp_path, lambda r: r.update(domains={"0": {}}))
    assert main(["report", "--output-dir", str(tmp_path), "--quiet"]) == 2
    assert "not a run record of the declared schema: domains" in capsys.readouterr().err


def test_a_record_nested_deeper_than_the_parser_is_named(tmp_path):
    (record,) = _results(tmp_path)
    record.write_text('{"schema": 5, "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(DapbenchError, match="nested too deeply"):
        load_record(record)


def test_an_integer_of_thousands_of_digits_is_named(tmp_path):
    record = _edited(tmp_path, lambda r: r.update(trainable_parameters=0))
    record.write_text(record.read_text().replace('"trainable_parameters": 0', '"trainable_parameters": ' + "9" * 5000))
    with pytest.raises(DapbenchError, match="holds a number dapbench cannot read"):
        load_record(record)


def test_a_record_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    (record,) = _results(tmp_path)
    monkeypatch.setattr("benchmark.io.JSON_SIZE_LIMIT", record.stat().st_size - 1)
    with pytest.raises(DapbenchError, match="bytes, over the"):
        load_record(record)


def test_a_record_without_its_identity_is_refused(tmp_path):
    record = _edited(tmp_path, lambda r: r.update(identity=None))
    with pytest.raises(DapbenchError, match="without its identity"):
        load_record(record)


def test_a_record_whose_configuration_was_edited_is_refused_not_a_new_group(tmp_path):
    record = _edited(tmp_path, lambda r: r["config"]["dap"].update(lr=0.5))  # its numbers under another setting
    with pytest.raises(DapbenchError, match="is not what its run wrote: its configuration, inputs or options hash to"):
        load_record(record)


def test_a_method_label_of_another_method_is_refused(tmp_path):
    record = _edited(tmp_path, lambda r: r.update(method_label="das" if r["method"] != "das" else "ncl"))
    with pytest.raises(DapbenchError, match="is not a row of its method"):
        load_record(record)


def test_a_cell_that_starts_like_a_formula_is_written_to_csv_as_text():
    from benchmark.report.escape import spreadsheet_cell

    assert spreadsheet_cell('=HYPERLINK("http://example.invalid","x")') == '\'=HYPERLINK("http://example.invalid","x")'
    assert [spreadsheet_cell(v) for v in ("+1", "@sum", "-2", "ncl", -0.5, None)] == [
        "'+1",
        "'@sum",
        "'-2",
        "ncl",
        -0.5,
        None,
    ]


def test_a_setting_with_thousands_of_digits_or_characters_is_named(tmp_path, capsys):
    from benchmark.config import RunConfig, apply_overrides

    with pytest.raises(DapbenchError, match="no number dapbench can use"):
        apply_overrides(RunConfig(), ["dap.steps=" + "9" * 5000])
    with pytest.raises(DapbenchError, match="over the 1024 a setting may hold"):
        apply_overrides(RunConfig(), ["model=" + "m" * 200_000])


def test_a_row_label_over_the_limit_is_refused(tmp_path):
    (record,) = _results(tmp_path)
    from cli_helpers import record_with_options

    long = record_with_options(record, tmp_path / "results" / "long", note="x" * 300)
    with pytest.raises(DapbenchError, match="over the 256 a row label may hold"):
        load_record(long)


def test_a_run_whose_row_label_would_be_too_long_is_refused_before_work(tiny_config, monkeypatch):
    import dataclasses
    from types import SimpleNamespace

    from benchmark.method import ContinualMethod, MethodConfig
    from benchmark.preflight import check_labels
    from benchmark.settings import setting

    @dataclasses.dataclass(frozen=True)
    class NotedConfig(MethodConfig):
        note: str = setting("x", checked_by="the test")

    class Noted(ContinualMethod):
        name = "noted"
        config_cls = NotedConfig

    monkeypatch.setattr("benchmark.registry.default_registry", lambda: SimpleNamespace(get=lambda name: Noted))
    config = dataclasses.replace(tiny_config, methods=("noted",), method_options={"noted": {"note": "n" * 300}})
    with pytest.raises(DapbenchError, match="noted's row label would be 312 characters long, over the 256"):
        check_labels(config)
    check_labels(dataclasses.replace(config, method_options={"noted": {"note": "short"}}))


@pytest.mark.parametrize("linked", [".dapbench/cache", ".dapbench/runs", ".dapbench/cache/base-evaluation"])
def test_a_run_refuses_a_work_folder_below_linked_elsewhere(linked, world_root, tiny_model, tmp_path, capsys, started):
    from cli_helpers import no_record, quick_run_args

    out, elsewhere = tmp_path / "out", foreign_folder(tmp_path)
    (out / linked).parent.mkdir(parents=True)
    (out / linked).symlink_to(elsewhere)
    assert main(quick_run_args(world_root, tiny_model, out)) == 2
    assert "is a symbolic link" in capsys.readouterr().err and is_untouched(elsewhere)
    no_record(out)


def test_a_runs_own_work_or_tracking_folder_linked_elsewhere_is_refused(
    world_root, tiny_model, tmp_path, capsys, started
):
    from importlib.util import find_spec

    from cli_helpers import TrainingStarted, quick_run_args

    out, elsewhere = tmp_path / "out", foreign_folder(tmp_path)
    with pytest.raises(TrainingStarted):  # the run's own folder is made, then its first stage stops the test
        main(quick_run_args(world_root, tiny_model, out))
    (run,) = [p for p in (out / ".dapbench" / "runs").iterdir() if p.is_dir()]
    shutil.rmtree(run)
    run.symlink_to(elsewhere)
    assert main(quick_run_args(world_root, tiny_model, out)) == 2
    assert "is a symbolic link" in capsys.readouterr().err and is_untouched(elsewhere)
    if find_spec("tensorboard") or find_spec("tensorboardX"):
        run.unlink()
        (out / "tracking").mkdir()
        (out / "tracking" / run.name).symlink_to(elsewhere)
        assert main(quick_run_args(world_root, tiny_model, out, "--report-to", "tensorboard")) == 2
        assert "is a symbolic link" in capsys.readouterr().err and is_untouched(elsewhere)


@pytest.mark.parametrize("linked", ["assets", "data"])
def test_the_report_refuses_a_site_folder_linked_elsewhere(linked, tmp_path, capsys):
    _results(tmp_path)
    site = tmp_path / "results" / "report" / "site"
    site.mkdir(parents=True)
    elsewhere = foreign_folder(tmp_path)
    (site / linked).symlink_to(elsewhere)
    assert main(["report", "--output-dir", str(tmp_path), "--quiet"]) == 2
    assert "is a symbolic link" in capsys.readouterr().err and is_untouched(elsewhere)
    assert not (tmp_path / "leaderboard.md").exists()


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (["finetune.max_test_examples=1"], "1 test example\\(s\\) would be scored"),
        (["finetune.max_test_examples=1", "finetune.protocol=linear_probe"], "1 test example\\(s\\) would be scored"),
        (["finetune.max_train_examples=1"], "one class only"),
    ],
)
def test_an_end_task_sample_too_small_to_measure_is_refused_before_work(
    settings, named, world_root, tiny_model, tmp_path, capsys, started
):
    from cli_helpers import no_record, quick_run_args

    extra = [arg for setting in settings for arg in ("--set", setting)]
    assert main(quick_run_args(world_root, tiny_model, tmp_path, *extra)) == 2
    assert re.search(named, capsys.readouterr().err)
    no_record(tmp_path)


def test_a_schedule_for_a_method_that_trains_nothing_is_refused_not_a_new_row(
    world_root, tiny_model, tmp_path, capsys, started
):
    from cli_helpers import no_record, quick_run_args

    args = quick_run_args(world_root, tiny_model, tmp_path, "--set", "schedule.name=wsd", methods="none")
    assert main(args) == 2
    assert "none does not pre-train, so schedule.* changes none of its numbers" in capsys.readouterr().err
    no_record(tmp_path)


def test_a_run_resumed_at_another_thread_count_is_refused(world_root, tiny_model, tmp_path, capsys, started):
    import torch
    from cli_helpers import TrainingStarted, no_record, quick_run_args

    threads = torch.get_num_threads()
    with pytest.raises(TrainingStarted):  # the base evaluation is done and kept; the first stage stops the test
        main(quick_run_args(world_root, tiny_model, tmp_path))
    torch.set_num_threads(threads + 1)
    try:
        assert main(quick_run_args(world_root, tiny_model, tmp_path)) == 2
    finally:
        torch.set_num_threads(threads)
    assert f"started at {threads} CPU thread(s) and is resumed at {threads + 1}" in capsys.readouterr().err
    with pytest.raises(TrainingStarted):  # at its own count it resumes
        main(quick_run_args(world_root, tiny_model, tmp_path))
    no_record(tmp_path)


def test_the_slurm_launcher_without_slurm_is_named_before_anything_is_written(
    world_root, tiny_model, tmp_path, capsys, monkeypatch
):
    from cli_helpers import synthetic_run

    pytest.importorskip("submitit")
    monkeypatch.setattr("shutil.which", lambda name, *args, **kwargs: None)  # a machine without sbatch
    assert main([*synthetic_run(world_root, tiny_model, tmp_path, "ncl"), "--launcher", "slurm"]) == 2
    said = capsys.readouterr()
    assert "no Slurm on this machine" in said.err and "submitted as job" not in said.out
    assert not tmp_path.exists() or list(tmp_path.rglob("*")) == []


@pytest.mark.parametrize("size", ["4096", "1000000000"])
def test_a_batch_larger_than_a_domain_is_refused_before_training(
    size, world_root, tiny_model, tmp_path, capsys, started
):
    from cli_helpers import no_record, quick_run_args

    settings = ["--set", f"dap.batch_size={size}", "--set", f"dap.per_device_batch_size={size}"]
    assert main(quick_run_args(world_root, tiny_model, tmp_path, *settings)) == 2
    assert f"dap.batch_size={size} chunks is more than domain alpha's" in capsys.readouterr().err
    no_record(tmp_path)


@pytest.mark.parametrize(
    "manifest",
    [
        {"runs": {}, "groups": {}, "site": ["mynotes.txt"]},
        {"runs": {}, "groups": {}, "site": ["site/../../mynotes.txt"]},
        {"runs": [], "groups": {}},
        {"runs": {}, "groups": {"g": "plots/g.png"}},
    ],
)
def test_a_manifest_that_is_not_the_reports_deletes_nothing(manifest, tmp_path, capsys):
    _results(tmp_path)
    report = tmp_path / "results" / "report"
    report.mkdir(parents=True)
    (report / "mynotes.txt").write_text("mine\n")
    (tmp_path / "mynotes.txt").write_text("mine\n")
    (report / "manifest.json").write_text(json.dumps(manifest))
    assert main(["report", "--output-dir", str(tmp_path), "--quiet"]) == 2
    assert "manifest" in capsys.readouterr().err
    assert (report / "mynotes.txt").read_text() == "mine\n" and (tmp_path / "mynotes.txt").read_text() == "mine\n"


def test_pages_of_a_report_stopped_before_its_manifest_are_removed_by_the_next(tmp_path, monkeypatch):
    first, second = _results(tmp_path, 2)

    def stopped(*args):
        raise KeyboardInterrupt  # the report is killed after writing its pages, before its manifest

    with monkeypatch.context() as patch:
        patch.setattr("benchmark.report.writer._remove_unproduced", stopped)
        assert main(["report", "--output-dir", str(tmp_path), "--quiet"]) == 130  # Ctrl-C's exit code
    report = tmp_path / "results" / "report"
    page = report / "runs" / f"{second.stem}.md"
    assert page.is_file() and not (report / "manifest.json").exists()
    second.unlink()
    assert main(["report", "--output-dir", str(tmp_path), "--quiet"]) == 0
    assert not page.exists() and (report / "runs" / f"{first.stem}.md").is_file()
    assert not (report / "pending.txt").exists()
    assert main(["report", "--output-dir", str(tmp_path), "--check", "--quiet"]) == 0


@pytest.mark.parametrize(
    ("methods", "setting", "named"),
    [
        ("ncl,freeze_bottom", "freeze_bottom.layers=5", "freezes every one of the model's 2 layers"),
        ("ncl,merge", "merge.density=1e-300", "keeps less than one of the 32 entries"),
    ],
)
def test_a_method_option_the_model_cannot_run_is_refused_before_any_method_runs(
    methods, setting, named, world_root, tiny_model, tmp_path, capsys, started
):
    from cli_helpers import no_record, quick_run_args

    extra = ["--set", setting] + (["--set", "merge.how=ties"] if "merge" in setting else [])
    assert main(quick_run_args(world_root, tiny_model, tmp_path, *extra, methods=methods)) == 2
    assert named in capsys.readouterr().err
    no_record(tmp_path)
    assert not (tmp_path / ".dapbench" / "runs").exists()  # ncl, listed first, did not start either


def test_a_thread_count_past_any_machine_is_refused_before_threads_start(tmp_path, capsys):
    (record,) = _results(tmp_path)
    assert main(["reproduce", str(record), "--threads", "3000", "--output-dir", str(tmp_path / "re")]) == 2
    assert "--threads must be 1 to 512, got 3000" in capsys.readouterr().err
    whole = whole_record(record)
    whole["environment"]["torch_threads"] = 3000
    record.write_text(json.dumps(whole))
    with pytest.raises(DapbenchError, match="environment.torch_threads 3000 is more than the 512 threads"):
        load_record(record)


@pytest.mark.parametrize(("chunks", "named"), [("0", "at least 2 chunks"), ("100000", "fewer than two disjoint")])
def test_a_study_sample_of_no_chunks_or_more_than_the_domain_is_named(chunks, named, tiny_config):
    from methods._shared.importance_study import stability_study

    with pytest.raises(DapbenchError, match=named):
        stability_study(tiny_config, {"chunks": chunks})


def test_a_base_model_too_large_to_build_is_refused_before_any_allocation():
    from benchmark.data.pretrain import BaseModelSpec

    with pytest.raises(DapbenchError, match="would hold about 2.6e\\+13 parameters"):
        BaseModelSpec(hidden_size=65536, num_layers=1000, num_heads=64, intermediate_size=65536)
    assert BaseModelSpec().parameters() < 2_000_000  # the default stand-in is tiny


def test_an_output_folder_name_longer_than_a_file_system_holds_is_named(world_root, tiny_model, tmp_path, capsys):
    from cli_helpers import quick_run_args

    out = tmp_path / ("o" * 300)
    assert main(quick_run_args(world_root, tiny_model, out)) == 2
    assert "is 300 bytes, over the 255 a file name may hold" in capsys.readouterr().err


def test_a_file_size_limit_during_the_data_cache_write_is_named(world_root, tiny_model, tmp_path):
    import resource
    import signal
    import subprocess
    import sys

    from cli_helpers import one_thread_env, quick_run_args

    def limited():  # a write past 4 KB fails with EFBIG instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    args = quick_run_args(world_root, tiny_model, tmp_path / "out")
    done = subprocess.run(
        [sys.executable, "-m", "benchmark.cli", *args], preexec_fn=limited, env=one_thread_env(),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot build" in done.stderr and "ulimit -f" in done.stderr and "Traceback" not in done.stderr


def test_a_work_folder_that_cannot_be_written_is_named_before_work(
    world_root, tiny_model, tmp_path, capsys, monkeypatch
):
    import tempfile

    from cli_helpers import no_record, quick_run_args

    work = tmp_path / "work"
    work.mkdir()
    real = tempfile.TemporaryFile

    def refused(*args, dir=None, **kwargs):  # what an immutable folder answers (root ignores chmod, so it is stubbed)
        if dir is not None and Path(dir) == work:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    assert main(quick_run_args(world_root, tiny_model, tmp_path / "out", "--work-dir", str(work))) == 2
    assert f"cannot write under {work}: Permission denied" in capsys.readouterr().err
    no_record(tmp_path / "out")


def test_an_lm_eval_score_over_one_test_example_is_refused_before_work(
    world_root, tiny_gpt2, tmp_path, capsys, started
):
    from cli_helpers import no_record, quick_run_args

    args = quick_run_args(world_root, tiny_gpt2, tmp_path, "--set", "finetune.protocol=lm_eval")
    assert main([*args, "--set", "finetune.max_test_examples=1"]) == 2
    assert "1 test example(s) would be scored" in capsys.readouterr().err
    no_record(tmp_path)
