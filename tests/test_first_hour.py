"""A newcomer's first hour (issue #44): the run says where it is, a decoder run speaks of next-token loss, a user's
own quick runs reach their leaderboard, a typo'd profile gets a suggestion."""

import dataclasses
import io
import re
import time
from typing import ClassVar

import pytest
from cli_helpers import copy_record

from benchmark.api import report, run_benchmark
from benchmark.config import profile_config
from benchmark.engine.progress import HEARTBEAT_SECONDS, RunPosition, RunProgress
from benchmark.errors import DapbenchError
from benchmark.io import read_json
from benchmark.method import ContinualMethod
from benchmark.registry import default_registry


class Terminal(io.StringIO):
    """What a terminal's stream says of itself: the run line is a redrawn bar there."""

    def isatty(self) -> bool:
        return True


def test_the_run_line_is_redrawn_while_a_silent_phase_runs():
    """A phase that reports nothing itself (a fine-tune) still shows the clock moving, every ``interval``."""
    stream = Terminal()
    progress = RunProgress("ncl seed 3", RunPosition(2, 3), ["alpha", "beta"], phases=4, interval=0.05, file=stream)
    with progress.phase(1, "end task 1/2 alpha (fine-tune)"):
        drawn = stream.getvalue().count("\r")
        time.sleep(0.6)
        redrawn = stream.getvalue().count("\r") - drawn
    progress.close()
    assert redrawn >= 5, f"{redrawn} redraws in 0.6 s with a 0.05 s heartbeat"
    assert "run 2/3 ncl seed 3 | domain 2/2 beta | end task 1/2 alpha (fine-tune)" in stream.getvalue()
    assert re.search(r"1/4 phases, 00:0\d elapsed, ~", stream.getvalue())


def test_what_is_left_is_the_mean_time_of_the_phases_run_times_the_phases_left():
    """A phase that takes no time (a base evaluation found in the work folder) must not make the line read
    ``~00:00 left`` through the long phases after it, and skipped phases (a resumed run's) are not timed."""
    stream = Terminal()
    progress = RunProgress("ncl seed 3", RunPosition(), ["alpha", "beta"], phases=6, interval=60, file=stream)
    assert progress.line() in stream.getvalue() and "0/6 phases, 00:00 elapsed, ~? left" in stream.getvalue()
    progress.skip(2)  # done in an earlier attempt
    with progress.phase(None, "held-out evaluation"):
        pass  # instant: no estimate yet, not ~00:00
    assert "3/6 phases, 00:00 elapsed, ~? left" in stream.getvalue() and "~00:00 left" not in stream.getvalue()
    with progress.phase(0, "DAP"):
        time.sleep(1.2)
    progress.close()
    # two phases timed in about 1.2 s: 0.6 s each, 2 phases left after the fourth
    (left,) = set(re.findall(r"4/6 phases, 00:0\d elapsed, ~00:0(\d) left", stream.getvalue()))  # one estimate
    assert int(left) in (1, 2), stream.getvalue()
    assert "4/6 phases, 00:01 elapsed, ~? left" not in stream.getvalue()  # the count and its estimate move together


def test_before_the_last_run_the_line_also_estimates_the_whole_command():
    """Issue #89: a grid of runs says what the command has left, at the mean time of the runs it did so far (the
    run's own estimate plus that mean for every run after it), or how many runs follow before one was timed."""
    assert RunPosition(3, 3, 100.0, 2).after_this() == 0.0
    assert RunPosition(2, 5).after_this() is None
    assert RunPosition(3, 5, 120.0, 2).after_this() == 120.0  # 60 s a run, two runs after this one
    first, later = Terminal(), Terminal()
    for stream, position in ((first, RunPosition(1, 3)), (later, RunPosition(2, 3, 600.0, 1))):
        progress = RunProgress("ncl seed 3", position, ["alpha"], phases=3, interval=60, file=stream)
        with progress.phase(0, "DAP"):
            time.sleep(1.1)
        progress.close()
    assert re.search(r"~00:0\d left \(command: 2 runs more\)", first.getvalue()), first.getvalue()
    assert re.search(r"~00:0\d left \(command: ~10:0\d more\)", later.getvalue()), later.getvalue()


def test_a_log_file_gets_one_plain_line_per_phase_and_no_redraws():
    stream = io.StringIO()  # a file, a pipe: no terminal
    progress = RunProgress("ncl seed 3", RunPosition(1, 2), ["alpha", "beta"], phases=3, interval=0.01, file=stream)
    progress.skip(1)
    with progress.phase(0, "DAP"):
        time.sleep(0.05)
    with progress.phase(1, "DAP"):
        pass
    progress.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue() and progress._thread is None
    assert lines[0] == "run 1/2 ncl seed 3 | domain 1/2 alpha | DAP | 1/3 phases, 00:00 elapsed, ~? left"
    assert lines[1].startswith("run 1/2 ncl seed 3 | domain 2/2 beta | DAP | 2/3 phases") and len(lines) == 2


def test_the_heartbeat_keeps_every_phase_under_the_30_second_bound():
    assert HEARTBEAT_SECONDS <= 30


def test_a_disabled_progress_line_prints_nothing_and_starts_no_thread():
    stream = io.StringIO()
    progress = RunProgress("ncl seed 3", RunPosition(), ["alpha"], phases=2, enabled=False, file=stream)
    with progress.phase(0, "DAP"):
        pass
    progress.close()
    assert stream.getvalue() == "" and progress._thread is None


def test_a_run_says_which_run_domain_and_phase_it_is_in(tiny_config, capsys):
    config = dataclasses.replace(tiny_config, methods=("none", "ncl"))
    run_benchmark(config, show_progress=True, write_leaderboard=False)
    shown = capsys.readouterr().err
    for expected in (
        "run 1/2 none seed 3 | base model | held-out evaluation",
        "run 2/2 ncl seed 3 | domain 1/2 alpha | DAP",
        "run 2/2 ncl seed 3 | domain 2/2 beta | held-out evaluation",
        "run 2/2 ncl seed 3 | domain 2/2 beta | end task 2/2 beta_sup (fine-tune)",
    ):
        assert expected in shown, expected
    assert re.search(r"\d+/\d+ phases, \d\d:\d\d elapsed, ~", shown)


def test_a_decoder_run_says_next_token_loss_and_never_mlm(tiny_config, tiny_gpt2, tmp_path, capsys, monkeypatch):
    """What a decoder user sees, the progress bars, the console summary, the leaderboard and its run tables, names
    the loss for what it is."""
    from benchmark.cli import main

    monkeypatch.setattr("benchmark.engine.training.bar_disabled", lambda show: not show)  # drawn as on a terminal

    config = dataclasses.replace(tiny_config, model=str(tiny_gpt2), output_dir=str(tmp_path / "out"))
    args = ["run", "--profile", "synthetic", "--methods", "ncl", "--seeds", "3", "--output-dir", config.output_dir]
    args += ["--model", config.model, "--data-root", config.data_root, "--sequence", config.sequence]
    args += ["--work-dir", config.work_dir]
    for key in ("steps", "batch_size", "per_device_batch_size", "heldout_chunks", "probe_chunks", "log_every"):
        args += ["--set", f"dap.{key}={getattr(config.dap, key)}"]
    args += ["--set", "finetune.default_epochs=1", "--set", "finetune.max_train_examples=24"]
    args += ["--set", "finetune.max_test_examples=24", "--set", f"general_heldout={config.general_heldout}"]
    args += ["--set", f"general_corpus={config.general_corpus}"]
    assert main(args) == 0
    printed = capsys.readouterr()
    board = (tmp_path / "out" / "leaderboard.md").read_text()
    tables = "".join(p.read_text() for p in (tmp_path / "out" / "results" / "report" / "runs").glob("*.md"))
    assert "next-token=" in printed.err and "next-token loss" in board and "next-token loss" in tables
    for name, text in (("console", printed.out + printed.err), ("leaderboard", board), ("run tables", tables)):
        assert "mlm" not in text.lower(), f"{name} says mlm: {text[text.lower().index('mlm') - 80 :][:160]}"


class MyPlugin(ContinualMethod):
    """A plugin author's first method (naive continual DAP under its own name)."""

    name: ClassVar[str] = "myplugin"


@pytest.fixture
def my_plugin():
    registry = default_registry()
    registry.register("myplugin", "test_first_hour:MyPlugin")
    yield "myplugin"
    default_registry.cache_clear()  # the next test sees the built-in methods only


def test_a_users_ci_profile_runs_reach_their_own_leaderboard(tiny_config, tmp_path, my_plugin):
    """``--profile ci --methods ncl,PLUGIN`` is a plugin author's first try: every record of their folder is
    reported; only a key-number folder (the repository's results/ci, marked by KEY-NUMBERS.md) stays off."""
    out = str(tmp_path / "out")
    config = dataclasses.replace(tiny_config, profile="ci", methods=("ncl", my_plugin), output_dir=out)
    records = run_benchmark(config)
    board = (tmp_path / "out" / "leaderboard.md").read_text()
    assert len(records) == 2 and "No complete run records yet" not in board
    assert "| `ncl` |" in board and "| `myplugin` |" in board
    assert report(tmp_path / "out")["records"] == 2

    (tmp_path / "out" / "results" / "ci" / "KEY-NUMBERS.md").write_text("key numbers\n")
    assert report(tmp_path / "out")["records"] == 0
    assert "No complete run records yet" in (tmp_path / "out" / "leaderboard.md").read_text()


def test_the_repositorys_key_number_records_stay_off_its_leaderboard(tmp_path):
    import shutil
    from pathlib import Path

    from benchmark.records.store import KEY_NUMBERS_MARKER, leaderboard_records, load_records

    results = Path(__file__).resolve().parents[1] / "results"
    assert (results / "ci" / KEY_NUMBERS_MARKER).is_file()
    assert all(read_json(path, "record")["profile"] == "ci" for path in (results / "ci").glob("*.json"))
    # the key-number folder beside one leaderboard record, not all of them: reading every committed record is
    # test_api's (and CI's report --check's) work, and takes minutes
    shutil.copytree(results / "ci", tmp_path / "results" / "ci")
    row = min((results / "mini").glob("ncl-seq0-*.json"), key=lambda path: path.stat().st_size)
    copy_record(row, tmp_path / "results" / "mini")
    ci = [r["run_id"] for r in load_records(tmp_path / "results" / "ci")]
    assert len(ci) == 3 and [r["run_id"] for r in leaderboard_records(tmp_path / "results")] == [row.stem]


def test_a_typod_profile_gets_did_you_mean():
    with pytest.raises(DapbenchError, match="did you mean 'mini'"):
        profile_config("mnii")


def test_a_final_macro_f1_at_the_majority_class_is_said_as_such():
    from benchmark.report.summary import majority_note

    majority = {"acc": 0.6, "macro_f1": 0.25}
    assert majority_note(0.2502, majority) == " (= always predicting the majority class)"
    assert majority_note(0.31, majority) == "" and majority_note(0.25, None) == ""


def test_dapbench_list_names_the_choices_of_the_schedule(capsys):
    from benchmark.cli import main

    assert main(["list"]) == 0
    (schedule,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("schedule ")]
    for name in ("per_domain_linear", "rewarm_cosine", "global", "wsd"):
        assert name in schedule
