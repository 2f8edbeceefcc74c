"""Choosing a method's rate fairly (issue #45): declared rates of a method's own parameters, validation slices that
the leaderboard never measures, and ``dapbench tune``'s recorded choice."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmark.api import continual_run
from benchmark.config import apply_overrides
from benchmark.data.corpora import validation_split
from benchmark.data.inputs import prepare_data
from benchmark.errors import DapbenchError
from benchmark.registry import default_registry

NUMBERS = ("matrices", "lm_loss", "representation")


def test_the_validation_slice_is_disjoint_and_leaves_the_training_lines_as_they_were():
    rest = [f"line {i}" for i in range(100)]
    train, validation = validation_split(rest, 60, 10)
    assert train == rest[:60] and validation == rest[60:70]  # a budget that leaves lines unread: training unchanged
    train, validation = validation_split(rest, None, 10)
    assert train == rest[:90] and validation == rest[90:]  # every line trains otherwise: the slice is taken out
    train, validation = validation_split(rest, 95, 10)
    assert not set(train) & set(validation) and len(validation) == 10


def test_validation_sets_are_not_the_held_out_sets(tiny_config):
    heldout = prepare_data(tiny_config)
    validation = prepare_data(apply_overrides(tiny_config, ["dap.evaluate_on=validation"]))
    assert set(heldout.heldout_batches) == set(validation.heldout_batches)
    for name in heldout.heldout_batches:
        assert heldout.heldout_checksums()[name] != validation.heldout_checksums()[name], name
    assert heldout.checksums["corpus/alpha"] == validation.checksums["corpus/alpha"]  # the same corpus, other lines


GROUPS = [("adapter_ncl", "adapter", []), ("domix", "lora", []), ("prompt_one", "prompts", ["adamw"])]
"""Methods whose declared group, at its default rate (prompt_one: at the DAP rate in the DAP AdamW, its version-1
setting), trains exactly as the group-less code did."""


@pytest.mark.parametrize(("method", "group", "v1"), GROUPS)
def test_a_declared_group_at_the_dap_rate_trains_exactly_as_before_and_is_measured_apart(
    method, group, v1, tiny_config, monkeypatch
):
    if v1:  # prompt_one's version-1 setting, spelled out (version 2 trains its prompt with Adafactor)
        overrides = [f"prompt_one.prompt_lr={tiny_config.dap.lr}", "prompt_one.prompt_optimizer=adamw"]
        tiny_config = apply_overrides(tiny_config, overrides)
    data = prepare_data(tiny_config)
    grouped = continual_run(tiny_config, data, method, 3, show_progress=False).execute()
    cls = default_registry().get(method)
    monkeypatch.setattr(cls, "parameter_groups", lambda self, model: [])
    before = dataclasses.replace(tiny_config, work_dir=tiny_config.work_dir + "-before")
    plain = continual_run(before, data, method, 3, show_progress=False).execute()
    assert {k: grouped[k] for k in NUMBERS} == {k: plain[k] for k in NUMBERS}
    assert grouped["run_id"] == plain["run_id"] and grouped["method_label"] == plain["method_label"]
    assert v1 or "lr" not in grouped["method_label"]
    sizes = grouped["domains"][0]["update_sizes"]
    assert sizes[group]["relative"] > 0, sizes


def test_prompt_ones_adafactor_moves_the_prompt_further_than_the_dap_adamw_and_names_the_row(tiny_config):
    data = prepare_data(tiny_config)
    default = continual_run(tiny_config, data, "prompt_one", 3, show_progress=False).execute()
    adamw = apply_overrides(tiny_config, ["prompt_one.prompt_lr=0.0001", "prompt_one.prompt_optimizer=adamw"])
    record = continual_run(adamw, prepare_data(adamw), "prompt_one", 3, show_progress=False).execute()
    assert record["method_label"] == "prompt_one[num_tokens=16,prompt_lr=0.0001,prompt_optimizer=adamw]"
    assert default["method_label"] == "prompt_one[num_tokens=16]" and record["run_id"] != default["run_id"]
    moved = [d["update_sizes"]["prompts"]["relative"] for d in (default["domains"][0], record["domains"][0])]
    assert moved[0] > 10 * moved[1], moved


def test_tune_runs_every_value_on_validation_slices_and_records_the_lowest_mean(tiny_config, tmp_path):
    from benchmark.api import TUNING_CRITERION as CRITERION
    from benchmark.api import tune_option as tune

    result = tune(tiny_config, "adapter_ncl", "adapter_ncl.adapter_lr", [1e-4, 3e-3], seed=3)
    written = json.loads((tmp_path / "tuning" / "synthetic" / "adapter_ncl-adapter_lr-seed3.json").read_text())
    assert written == result and result["criterion"] == CRITERION
    means = {row["value"]: row["mean"] for row in result["candidates"]}
    assert len(means) == 2 and result["chosen"] == min(means, key=means.get)
    labels = [row["label"] for row in result["candidates"]]  # each with every option it ran with
    assert labels == ["adapter_ncl[adapter_lr=0.0001]", "adapter_ncl[adapter_lr=0.003]"]
    for row in result["candidates"]:
        assert set(row["losses"]) == {"alpha", "beta", "general"}
        assert row["mean"] == pytest.approx(sum(row["losses"].values()) / 3)
    assert not list((tmp_path / "results").glob("**/*.json"))  # tuning writes no leaderboard record


@pytest.mark.parametrize(
    ("option", "values", "named"),
    [
        ("ncl.lr", [1e-4, 1e-3], "unknown option"),
        ("adapter_ncl.adapter_lr", [1e-4], "two or more different values"),
        ("adapter_ncl.adapter_lr", [1e-4, -1.0], "adapter_lr=-1.0 is out of range"),
        ("dap.lr", [1e-4, 1e-3], "is not an option of method 'adapter_ncl'"),
    ],
)
def test_tune_refuses_what_it_cannot_compare_before_any_work(option, values, named, tiny_config):
    from benchmark.api import tune_option as tune

    method = option.split(".")[0] if option.split(".")[0] in ("ncl",) else "adapter_ncl"
    with pytest.raises(DapbenchError, match=named):
        tune(tiny_config, method, option, values, seed=3)


def test_the_tune_command_takes_one_method_and_one_seed(capsys):
    from benchmark.cli import main

    args = ["tune", "--methods", "adapter_ncl,domix", "--option", "adapter_ncl.adapter_lr", "--values", "1e-4,1e-3"]
    assert main(args) == 2
    assert "tune takes one method and one seed" in capsys.readouterr().err
