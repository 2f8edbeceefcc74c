"""Inputs a hostile user gives (issue #47): each is refused with exit 2 and a named error before any work."""

import pytest

from benchmark.cli import main


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"line {i} of a small corpus\n" for i in range(50)))
    return path


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--steps", "0"], "steps=0 is out of range"),
        (["--steps", "-5"], "steps=-5 is out of range"),
        (["--lr", "inf"], "lr"),
        (["--lr", "nan"], "lr"),
        (["--vocab-size", "0"], "vocab_size=0 is out of range"),
        (["--seq-len", "1"], "seq_len=1 is out of range"),
        (["--batch-size", "0"], "batch_size=0 is out of range"),
        (["--hidden-size", "130"], "not divisible by --num-heads 4"),
        (["--causal", "--kv-heads", "3"], "does not divide --num-heads 4"),
    ],
)
def test_pretrain_base_refuses_a_meaningless_spec_before_any_work(corpus, tmp_path, capsys, flags, named):
    out = tmp_path / "model"
    assert main(["pretrain-base", str(corpus), str(out), *flags]) == 2
    assert named in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "model.cache").exists()


@pytest.mark.parametrize(("flag", "value"), [("--score-tolerance", "nan"), ("--loss-tolerance", "-1")])
def test_reproduce_refuses_a_tolerance_that_cannot_compare_before_re_running(tmp_path, capsys, flag, value):
    record = tmp_path / "missing.json"  # never read: the tolerance is refused first
    assert main(["reproduce", str(record), flag, value]) == 2
    assert f"{flag} {float(value)!r} is not a finite number >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [("--slurm-time", "-5"), ("--slurm-gpus", "-1"), ("--slurm-cpus", "0")])
def test_a_slurm_grid_with_impossible_resources_is_refused(flag, value):
    from benchmark.errors import DapbenchError
    from benchmark.tools.launch import SlurmOptions

    field = {"--slurm-time": "time_min", "--slurm-gpus": "gpus", "--slurm-cpus": "cpus"}[flag]
    with pytest.raises(DapbenchError, match=f"{flag} {value} must be a whole number"):
        SlurmOptions(**{field: int(value)})


def test_a_key_below_a_value_is_a_named_error_not_a_traceback(capsys):
    assert main(["run", "--set", "dap.steps.x=1", "--methods", "ncl"]) == 2
    assert "holds a value (" in capsys.readouterr().err
