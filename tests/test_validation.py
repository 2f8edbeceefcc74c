"""No bad input gets past validation (issue 26): every case found by a hostile user is a named error (exit 2) before
any DAP step, and property-based tests (hypothesis) keep it so for random settings and random corruptions of the
data: every case either runs or is refused by name, never a traceback, never a record."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path

import pytest
from cli_helpers import TrainingStarted
from cli_helpers import no_record as _no_record
from cli_helpers import quick_run_args as _args
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from benchmark.cli import main
from benchmark.config import DapConfig, FinetuneConfig
from benchmark.settings import declaration

CI_EXAMPLES = 12
"""Examples per property in the default run; the ``slow`` variants run 10x as many."""


def _outcome(args: list[str], capsys) -> str:
    """``refused`` (exit 2, a named error, no traceback) or ``runs`` (the first DAP stage was reached)."""
    try:
        code = main(args)
    except TrainingStarted:
        return "runs"
    err = capsys.readouterr().err
    assert code == 2 and "dapbench: error:" in err and "fix:" in err and "Traceback" not in err, (code, err)
    return "refused"


# ----------------------------------------------------------------------------------------------
# The cases of issue 26, one test each
# ----------------------------------------------------------------------------------------------
REFUSED_SETTINGS = [
    ("dap.max_grad_norm=-1", "dap.max_grad_norm=-1.0 is out of range"),
    ("dap.max_grad_norm=0", "dap.max_grad_norm=0.0 is out of range"),
    ("dap.max_grad_norm=NaN", "dap.max_grad_norm=nan is not a finite number"),
    ("dap.lr=Infinity", "dap.lr=inf is not a finite number"),
    ("finetune.epoch_scale=Infinity", "finetune.epoch_scale=inf is not a finite number"),
    ("finetune.epochs.alpha=30", "unknown end task finetune.epochs.alpha (did you mean 'alpha_sup'?)"),
    ("seeds=[-5]", "seeds=-5 is out of range"),
    (f"seeds=[{2**70}]", "is out of range"),
    ("dap.seq_len=100000", "dap.seq_len=100000 exceeds the"),
]


@pytest.mark.parametrize(("setting", "message"), REFUSED_SETTINGS, ids=[s for s, _ in REFUSED_SETTINGS])
def test_a_bad_setting_is_refused_by_name_before_any_work(
    setting, message, world_root, tiny_model, tmp_path, capsys, started
):
    assert main(_args(world_root, tiny_model, tmp_path, "--set", setting)) == 2
    err = capsys.readouterr().err
    assert message in err and "fix:" in err
    _no_record(tmp_path)


def test_a_heldout_split_without_a_chunk_is_named(world_root, tiny_model, tmp_path, capsys, started):
    world = _copy(world_root, tmp_path)
    (world / "general_heldout.txt").write_text("too short\n")
    assert main(_args(world, tiny_model, tmp_path / "out")) == 2
    assert "yields no full chunk" in capsys.readouterr().err


def _copy(world_root: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(world_root, tmp_path / "world"))


def _rewrite_jsonl(path: Path, change) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    change(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


ESCAPE = f"dapbench-escape-{os.getpid()}"
"""Where a domain named like a path would write if it were not refused (unique per test process)."""

DATA_CASES = {
    "a label that is a list": (
        lambda w: _rewrite_jsonl(w / "alpha_train.jsonl", lambda r: r[0].update(label=["L0"])),
        "unknown label ['L0']",
    ),
    "a text that is null": (
        lambda w: _rewrite_jsonl(w / "alpha_train.jsonl", lambda r: r[0].update(text=None)),
        "has no text",
    ),
    "an empty train split": (lambda w: (w / "alpha_train.jsonl").write_text(""), "empty train split"),
    "one class under the probe": (
        lambda w: _rewrite_jsonl(w / "alpha_train.jsonl", lambda r: [x.update(label="L0") for x in r]),
        "one class only",
    ),
    "a python tag in an end-task YAML": (
        lambda w: (w / "endtasks" / "alpha_sup.yaml").write_text("name: !!python/object/apply:os.system ['true']\n"),
        "is not valid YAML",
    ),
    "a domain named like a path": (
        lambda w: (w / "dapbench_suite.yaml").write_text(
            (w / "dapbench_suite.yaml").read_text().replace("  alpha:", f"  ../../../tmp/{ESCAPE}:", 1)
        ),
        "cannot name a file",
    ),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_bad_data_is_refused_by_name_before_any_work(case, world_root, tiny_model, tmp_path, capsys, started):
    world = _copy(world_root, tmp_path)
    corrupt, message = DATA_CASES[case]
    corrupt(world)
    extra = ("--set", "finetune.protocol=linear_probe") if case == "one class under the probe" else ()
    assert main(_args(world, tiny_model, tmp_path / "out", *extra)) == 2
    assert message in capsys.readouterr().err
    _no_record(tmp_path / "out")
    assert not Path("/tmp", ESCAPE).exists() or case != "a domain named like a path"


def test_repeated_example_ids_in_an_asc_json_file_are_refused(tmp_path):
    from benchmark.data.endtasks import load_end_task
    from benchmark.data.suite import EndTaskSpec
    from benchmark.errors import DapbenchError

    example = '{"term": "food", "sentence": "good food", "polarity": "positive"}'
    (tmp_path / "train.json").write_text(f'{{"1": {example}, "2": {example}, "1": {example}}}')
    (tmp_path / "test.json").write_text(f'{{"1": {example}}}')
    spec = EndTaskSpec("t", "asc_json", ("train.json",), ("test.json",), ("positive", "negative"))
    with pytest.raises(DapbenchError, match=r"example id\(s\) \['1'\] occur more than once"):
        load_end_task(spec, tmp_path)


def test_a_model_that_does_not_fit_its_tokenizer_is_refused(world_root, tiny_model, tmp_path, capsys, started):
    model = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    assert main(_args(world_root, model, tmp_path / "out")) == 2
    assert "embeds 100 tokens but its tokenizer has" in capsys.readouterr().err


def test_a_pickled_model_that_is_not_plain_tensors_is_refused_unrun(world_root, tiny_model, tmp_path, capsys, started):
    import pickle

    model = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(pickle.dumps(os.getcwd))  # a callable: code, not tensors
    assert main(_args(world_root, model, tmp_path / "out")) == 2
    assert "are not plain tensors or are corrupt: refused without running them" in capsys.readouterr().err


def test_every_sequence_of_a_grid_is_checked_before_the_first_trains(world_root, tiny_model, tmp_path, capsys, started):
    args = _args(world_root, tiny_model, tmp_path / "out")
    args[args.index("--sequence") + 1] = "alpha,beta+alpha,mars"
    assert main(args) == 2
    assert "unknown sequence or domain(s) ['mars']" in capsys.readouterr().err
    _no_record(tmp_path / "out")


def test_symbolic_links_in_the_output_folder_and_a_work_folder_inside_results_are_refused(
    world_root, tiny_model, tmp_path, capsys, started
):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (out / "results").mkdir(parents=True)
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "results" / "synthetic")
    assert main(_args(world_root, tiny_model, out)) == 2
    assert "symbolic link" in capsys.readouterr().err
    os.unlink(out / "results" / "synthetic")
    assert main(_args(world_root, tiny_model, out, "--work-dir", str(out / "results" / "work"))) == 2
    assert "is inside the results folder" in capsys.readouterr().err


def test_when_every_launched_run_fails_the_message_says_so(world_root, tiny_model, tmp_path, capsys, monkeypatch):
    from benchmark.tools import launch

    monkeypatch.setattr(launch.subprocess, "call", lambda *args, **kwargs: 1)
    assert main([*_args(world_root, tiny_model, tmp_path / "out"), "--launcher", "local:2"]) == 1
    said = capsys.readouterr().out
    assert "1 run(s) failed; their logs are in" in said and "no results directory" not in said


# ----------------------------------------------------------------------------------------------
# Properties
# ----------------------------------------------------------------------------------------------
def _numeric_fields() -> list[tuple[str, str, type, bool, object]]:
    """(section, name, int or float, optional, declaration) of every declared numeric setting."""
    import dataclasses
    import typing

    out = []
    for section, cls in (("dap", DapConfig), ("finetune", FinetuneConfig)):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            declared, kinds = declaration(field), typing.get_args(hints[field.name]) or (hints[field.name],)
            number = next((k for k in kinds if k in (int, float)), None)
            if declared is not None and number is not None and declared.keys is None:
                out.append((section, field.name, number, type(None) in kinds, declared))
    return out


NUMERIC_FIELDS = _numeric_fields()
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 0.5, 1e30, "abc", "true", "null", "[1, 2]", ""]),
)


def _json(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value if isinstance(value, str) else json.dumps(value)


def _declared_invalid(kind: type, optional: bool, declared, value) -> bool:
    """Whether ``value`` breaks the field's own declaration (type, finiteness, range): then it must be refused.
    Settings it satisfies may still be refused by a rule between fields (a batch size that is no multiple)."""
    if value == "null":
        return not optional
    if isinstance(value, str) or isinstance(value, bool):
        return True
    if kind is int and isinstance(value, float):
        return True
    return not math.isfinite(value) or not declared.admits(value)


def _check_setting(field, value, world_root, tiny_model, out, capsys):
    section, name, kind, optional, declared = field
    outcome = _outcome(_args(world_root, tiny_model, out, "--set", f"{section}.{name}={_json(value)}"), capsys)
    event(outcome)  # shown by --hypothesis-show-statistics
    _no_record(out)
    if _declared_invalid(kind, optional, declared, value):
        assert outcome == "refused", f"{section}.{name}={value!r} was accepted"


SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck), "derandomize": True}


@settings(max_examples=CI_EXAMPLES, **SETTINGS)
@given(field=st.sampled_from(NUMERIC_FIELDS), value=VALUES)
def test_random_settings_run_or_are_refused_by_name(
    field, value, world_root, tiny_model, tmp_path_factory, capsys, started
):
    _check_setting(field, value, world_root, tiny_model, tmp_path_factory.mktemp("out"), capsys)


@pytest.mark.slow
@settings(max_examples=10 * CI_EXAMPLES, **SETTINGS)
@given(field=st.sampled_from(NUMERIC_FIELDS), value=VALUES)
def test_random_settings_at_ten_times_the_examples(
    field, value, world_root, tiny_model, tmp_path_factory, capsys, started
):
    _check_setting(field, value, world_root, tiny_model, tmp_path_factory.mktemp("out"), capsys)


CORRUPTIONS = ("truncate", "flip_bytes", "invalid_utf8", "delete", "empty", "garbage_line", "json_field")
FILES = (
    "alpha_train.jsonl",
    "alpha_test.jsonl",
    "beta.txt",
    "general_heldout.txt",
    "dapbench_suite.yaml",
    "endtasks/beta_sup.yaml",
)


def _corrupt(path: Path, how: str, rng: random.Random) -> None:
    data = path.read_bytes() if path.exists() else b""
    if how == "truncate":
        path.write_bytes(data[: rng.randrange(len(data) + 1)])
    elif how == "flip_bytes":
        mutable = bytearray(data)
        for _ in range(rng.randint(1, 20)):
            if mutable:
                mutable[rng.randrange(len(mutable))] = rng.randrange(256)
        path.write_bytes(bytes(mutable))
    elif how == "invalid_utf8":
        path.write_bytes(data[:50] + b"\xff\xfe\xfd" + data[50:])
    elif how == "delete":
        path.unlink(missing_ok=True)
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage_line":
        path.write_bytes(data + b"\n{not: valid, [json\n")
    elif how == "json_field" and path.suffix == ".jsonl":
        value = rng.choice([None, [], {}, 3, "", "L99", True])
        _rewrite_jsonl(path, lambda rows: rows[rng.randrange(len(rows))].update({rng.choice(["text", "label"]): value}))
    else:
        path.write_bytes(data.replace(b":", b": !!python/name:os.system", 1))


def _check_corruption(file, how, seed, world_root, tiny_model, tmp_path_factory, capsys) -> None:
    root = tmp_path_factory.mktemp("corrupt")
    world = Path(shutil.copytree(world_root, root / "world"))
    _corrupt(world / file, how, random.Random(seed))
    outcome = _outcome(_args(world, tiny_model, root / "out"), capsys)  # refused by name, or runs: never a traceback
    event(f"{how}: {outcome}")
    _no_record(root / "out")


@settings(max_examples=CI_EXAMPLES, **SETTINGS)
@given(file=st.sampled_from(FILES), how=st.sampled_from(CORRUPTIONS), seed=st.integers(0, 2**16))
def test_random_corruptions_of_the_data_run_or_are_refused_by_name(
    file, how, seed, world_root, tiny_model, tmp_path_factory, capsys, started
):
    _check_corruption(file, how, seed, world_root, tiny_model, tmp_path_factory, capsys)


@pytest.mark.slow
@settings(max_examples=10 * CI_EXAMPLES, **SETTINGS)
@given(file=st.sampled_from(FILES), how=st.sampled_from(CORRUPTIONS), seed=st.integers(0, 2**16))
def test_random_corruptions_at_ten_times_the_examples(
    file, how, seed, world_root, tiny_model, tmp_path_factory, capsys, started
):
    _check_corruption(file, how, seed, world_root, tiny_model, tmp_path_factory, capsys)
