"""Issue #86: the fine-tune chooses its epoch on a validation split carved from the training split (never on test):
the split is fixed and stratified, the weights scored on test are those of the best validation epoch, and a split
too small to choose on is refused before any work."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from torch import nn

from benchmark.data.endtasks import validation_split
from benchmark.errors import DapbenchError
from benchmark.protocols import finetune as finetune_module
from benchmark.protocols.finetune import BestEpoch


def _examples(counts: dict[int, int]) -> list[dict]:
    return [{"input_ids": [1, 2, i], "labels": label} for label, n in counts.items() for i in range(n)]


def test_the_validation_split_is_fixed_stratified_and_disjoint():
    features = _examples({0: 60, 1: 30, 2: 10})
    train, held = validation_split(features, 0.2, "task/validation")
    assert len(held) == 20 and len(train) == 80
    assert Counter(f["labels"] for f in held) == {0: 12, 1: 6, 2: 2}  # every label in its share
    assert sorted(map(id, train + held)) == sorted(map(id, features))  # a partition of the training split
    again = validation_split(features, 0.2, "task/validation")
    assert [f["input_ids"] for f in again[1]] == [f["input_ids"] for f in held]  # the same for every run and seed
    assert validation_split(features, 0.2, "other/validation")[1] != held
    assert validation_split(features, 0.0, "task/validation") == (features, [])


def test_a_label_too_rare_to_stratify_leaves_the_split_unstratified_not_refused():
    features = _examples({0: 30, 1: 1})
    train, held = validation_split(features, 0.25, "rare/validation")
    assert len(held) == 8 and len(train) == 23


class _Scalar(nn.Module):
    """A model of one weight; what it predicts is scripted by the test, not computed."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))


def test_the_best_validation_epoch_is_kept_and_scored_and_ties_keep_the_earlier(monkeypatch):
    validation = _examples({0: 2, 1: 2})  # labels 0, 0, 1, 1
    scripted = iter([[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1]])  # epochs 1..4: epoch 2 and 4 tie best
    monkeypatch.setattr(finetune_module, "predict", lambda *args, **kwargs: next(scripted))
    model, best = _Scalar(), BestEpoch(validation, 2, None, 8, None)
    for epoch in (1, 2, 3, 4):
        with torch.no_grad():
            model.weight.fill_(float(epoch))  # the weights after this epoch
        best.score(model, float(epoch))
    summary = best.summary()
    assert summary["selected_epoch"] == 2.0 and summary["n_validation"] == 4
    assert summary["validation_macro_f1"][1] == summary["validation_macro_f1"][3] == 1.0
    best.restore(model)
    assert float(model.weight.detach()) == 2.0  # the test split is scored with epoch 2's weights, not the last


def test_without_a_validation_split_the_last_weights_are_scored_and_nothing_is_added():
    model, best = _Scalar(), BestEpoch([], 2, None, 8, None)
    with torch.no_grad():
        model.weight.fill_(3.0)
    best.score(model, 1.0)
    best.restore(model)
    assert float(model.weight.detach()) == 3.0 and best.summary() == {}


def test_a_fine_tune_with_a_validation_split_reports_its_chosen_epoch(tiny_config):
    """End to end on the tiny world: the fine-tune trains on the rest of the training split and says which of its
    epochs it scored; a run without the setting keeps its run id (the default changes no number)."""
    from benchmark.api import continual_run, planned_run_ids
    from benchmark.data.inputs import prepare_data
    from benchmark.engine.workfiles import read_work_file

    finetune = dataclasses.replace(
        tiny_config.finetune,
        protocol="finetune",
        max_train_examples=48,
        default_epochs=3,
        validation_share=0.25,
    )
    config = dataclasses.replace(tiny_config, finetune=finetune, methods=("none",), seeds=(1,))
    run = continual_run(config, prepare_data(config), "none", 1, show_progress=False)
    run.execute()
    cells = sorted((run.layout.root / "finetune").glob("*.json"))
    cell = read_work_file(cells[0], "fine-tune result")
    assert cell["n_validation"] == 12 and cell["n_train"] == 36
    assert len(cell["validation_macro_f1"]) == 3 and cell["selected_epoch"] in (1.0, 2.0, 3.0)
    best = max(range(3), key=lambda i: cell["validation_macro_f1"][i])
    assert cell["selected_epoch"] == best + 1.0
    plain = dataclasses.replace(config, finetune=dataclasses.replace(finetune, validation_share=0.0))
    unset = dataclasses.replace(config, finetune=dataclasses.replace(finetune, validation_share=0))
    assert planned_run_ids(plain) == planned_run_ids(unset) != planned_run_ids(config)


def test_a_validation_split_too_small_to_choose_on_is_refused_before_any_work(tiny_config):
    from benchmark.data.inputs import prepare_data
    from benchmark.preflight import check_run_data

    finetune = dataclasses.replace(
        tiny_config.finetune, protocol="finetune", max_train_examples=24, validation_share=0.2
    )
    config = dataclasses.replace(tiny_config, finetune=finetune)
    with pytest.raises(DapbenchError, match=r"validation split would hold 5 example\(s\)") as caught:
        check_run_data(config, prepare_data(config))
    assert "finetune.validation_share" in caught.value.fix
