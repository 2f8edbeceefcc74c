"""Issue #86: several fine-tunes per checkpoint (``finetune.seeds``), their scores averaged and each one's test
predictions kept in the record, its sidecar, its checks, its flags, its bootstrap and its export."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from benchmark.errors import DapbenchError


@pytest.fixture(scope="module")
def fine_tuned_thrice(world_root, tiny_model, tmp_path_factory):
    """A tiny ncl run over two domains, the linear probe its own protocol and fine-tuning beside it three times."""
    from conftest import TINY_DAP, TINY_FINETUNE, world_config

    from benchmark.api import continual_run
    from benchmark.data.inputs import prepare_data

    out = tmp_path_factory.mktemp("seeds")
    finetune = {**TINY_FINETUNE, "protocol": "linear_probe", "beside": "finetune", "seeds": 3}
    config = world_config(world_root, tiny_model, out, {**TINY_DAP, "steps": 4}, finetune, seeds=(3,))
    return config, continual_run(config, prepare_data(config), "ncl", 3, show_progress=False).execute()


def test_each_cell_is_the_mean_of_its_fine_tunes_and_keeps_each_ones_predictions(fine_tuned_thrice):
    from benchmark.metrics import classification_scores

    _, record = fine_tuned_thrice
    tuned = record["end_tasks_beside"]["finetune"]
    assert "seed_predictions" not in record  # the probe is seed-free: scored once
    assert set(tuned["seed_predictions"]) == set(tuned["predictions"]) == {"0/0", "1/0", "1/1"}
    labels = record["test_labels"][record["end_tasks"][1]]
    every = [tuned["predictions"]["1/1"], *tuned["seed_predictions"]["1/1"]]
    assert len(every) == 3
    scores = [classification_scores(labels["labels"], p, labels["classes"])["macro_f1"] for p in every]
    assert tuned["matrices"]["macro_f1"][1][1] == pytest.approx(sum(scores) / 3)


def test_the_record_round_trips_its_sidecar_and_its_check_reads_every_fine_tune(fine_tuned_thrice, tmp_path):
    from benchmark.records.checks import check_record
    from benchmark.records.store import load_record, write_record

    _, record = fine_tuned_thrice
    path = tmp_path / "results" / "synthetic" / f"{record['run_id']}.json"
    write_record(path, record)
    assert "seed_predictions" not in path.read_text()  # the predictions live in the Parquet sidecar
    again = load_record(path)
    assert (
        again["end_tasks_beside"]["finetune"]["seed_predictions"]
        == record["end_tasks_beside"]["finetune"]["seed_predictions"]
    )
    edited = copy.deepcopy(record)
    later = edited["end_tasks_beside"]["finetune"]["seed_predictions"]["1/1"][1]
    later[:] = [(label + 1) % 2 for label in later]  # another fine-tune's answers: the recorded mean no longer holds
    with pytest.raises(DapbenchError, match=r"end_tasks_beside\.finetune\.matrices\.\w+\[1\]\[1\]"):
        check_record(edited)


def test_the_export_says_how_many_fine_tunes_each_cell_averages(fine_tuned_thrice):
    from benchmark.report.export import end_tasks_table

    _, record = fine_tuned_thrice
    table = end_tasks_table([record])
    assert set(table[table["protocol"] == "finetune"]["fine_tunes"]) == {3}
    assert set(table[table["protocol"] == "linear_probe"]["fine_tunes"]) == {1}


def test_a_cell_is_flagged_when_any_of_its_classifiers_does_not_measure_the_backbone():
    from benchmark.metrics import backbone_flags

    labels = {"a": {"classes": 3, "labels": [0, 0, 1, 1, 2, 2]}}
    good = [0, 0, 1, 1, 2, 2]
    assert backbone_flags({"0/0": good}, labels, ["a"], {"0/0": [good, good]}) == {}
    flagged = backbone_flags({"0/0": good}, labels, ["a"], {"0/0": [good, [0] * 6]})
    assert flagged == {"0/0": "fine-tune 3: predicts 1 of the 3 classes in its test set"}


def test_repeated_fine_tunes_without_a_protocol_that_trains_are_refused(tiny_config):
    from benchmark.api import validate_config

    probe = dataclasses.replace(tiny_config.finetune, protocol="linear_probe", beside=None, seeds=3)
    with pytest.raises(DapbenchError, match="no end-task protocol of this run trains") as caught:
        validate_config(dataclasses.replace(tiny_config, finetune=probe))
    assert "finetune.beside=finetune" in caught.value.fix


def test_the_bootstrap_resamples_the_mean_of_every_fine_tune(fine_tuned_thrice):
    import numpy as np

    from benchmark.report.statistics import score_replicates

    _, record = fine_tuned_thrice
    tuned = record["end_tasks_beside"]["finetune"]
    own = {**copy.deepcopy(record), **{key: tuned[key] for key in ("matrices", "predictions", "seed_predictions")}}
    unweighted = {task: np.ones((2, len(own["test_labels"][task]["labels"]))) for task in own["end_tasks"]}
    replicates = score_replicates(own, unweighted, 2)  # every example once: each replicate is the recorded score
    assert replicates["macro_f1/final"] == pytest.approx([tuned["summary"]["macro_f1"]["final"]] * 2)
