"""End-task protocols as registered objects (issue #48): lm-evaluation-harness on a decoder, offline; a masked LM
refused before any work; a new protocol added by one registration runs through a whole run."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmark.api import run_benchmark
from benchmark.errors import DapbenchError
from benchmark.protocols import PROTOCOLS, EndTaskProtocol, get_protocol, register_protocol
from benchmark.protocols.base import ScoringSettings
from benchmark.protocols.lm_eval import label_words


def _config(tiny_config, protocol: str, model=None, **finetune):
    return dataclasses.replace(
        tiny_config,
        methods=("ncl",),
        model=str(model or tiny_config.model),
        finetune=dataclasses.replace(tiny_config.finetune, protocol=protocol, **finetune),
    )


def test_lm_eval_fills_the_end_task_matrix_of_a_decoder_offline(tiny_config, tiny_gpt2, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (record,) = run_benchmark(_config(tiny_config, "lm_eval", tiny_gpt2), write_leaderboard=False)
    acc = record["matrices"]["acc"]
    assert record["config"]["finetune"]["protocol"] == "lm_eval"
    filled = [cell for row in acc for cell in row if cell is not None]
    assert len(filled) == 3 and all(0.0 <= cell <= 1.0 for cell in filled)  # the lower triangle of 2 domains
    tasks = list(record["test_labels"])  # end tasks in domain order
    for key, predictions in record["predictions"].items():
        t, k = map(int, key.split("/"))
        labels = record["test_labels"][tasks[k]]["labels"]
        hits = sum(p == y for p, y in zip(predictions, labels, strict=True)) / len(labels)
        assert hits == pytest.approx(acc[t][k])  # the recorded score is lm-eval's, from these predictions


def test_lm_eval_refuses_a_masked_lm_before_any_work(tiny_config, tmp_path):
    config = _config(tiny_config, "lm_eval")
    with pytest.raises(DapbenchError, match="masked LM") as caught:
        run_benchmark(config, write_leaderboard=False)
    assert "linear_probe" in caught.value.args[0] + str(caught.value)
    assert not (tmp_path / "results").exists()


def test_an_unknown_protocol_is_named_with_the_registered_ones(tiny_config):
    with pytest.raises(DapbenchError, match="no end-task protocol") as caught:
        run_benchmark(_config(tiny_config, "few_shot"), write_leaderboard=False)
    assert "lm_eval" in str(caught.value) and "linear_probe" in str(caught.value)


def test_label_words_read_each_label_and_refuse_labels_that_read_alike():
    assert label_words("x", ("CompareOrContrast", "USED-FOR", "+", "-", "SUBSTRATE_PRODUCT-OF")) == [
        "compare or contrast",
        "used for",
        "positive",
        "negative",
        "substrate product of",
    ]
    with pytest.raises(DapbenchError, match="distinct label words"):
        label_words("x", ("used-for", "USED_FOR"))


@dataclasses.dataclass(frozen=True)
class MajoritySettings(ScoringSettings):
    """The toy's own settings: one field of the ``finetune`` section beyond the batch size every protocol reads."""

    seed_offset: int


class MajorityVote(EndTaskProtocol):
    """A toy protocol: predict the training split's most frequent label for every test example."""

    name = "toy_majority"
    words = "majority vote"
    short = "majority"
    settings = MajoritySettings
    given: list = []

    def evaluate(self, model, task, tokenizer, cfg, seed, accelerator) -> dict:
        from collections import Counter

        self.given.append(cfg)

        from benchmark.metrics import classification_scores

        label = Counter(f["labels"] for f in task.train).most_common(1)[0][0]
        predictions = [label] * len(task.test_labels)
        return {**classification_scores(task.test_labels, predictions, task.num_labels), "predictions": predictions}


def test_a_protocol_is_added_by_one_registration_and_runs_through_a_run(tiny_config):
    register_protocol(MajorityVote)
    try:
        assert get_protocol("toy_majority").words == "majority vote"
        (record,) = run_benchmark(_config(tiny_config, "toy_majority"), write_leaderboard=False)
    finally:
        PROTOCOLS.remove("toy_majority")
    assert record["config"]["finetune"]["protocol"] == "toy_majority"
    # it was handed its own typed settings, read from the run's finetune section, not the whole section
    assert MajorityVote.given and all(type(cfg) is MajoritySettings for cfg in MajorityVote.given)
    expected = MajoritySettings(eval_batch_size=tiny_config.finetune.eval_batch_size, seed_offset=0)
    assert MajorityVote.given[0] == expected
    scores = [cell for row in record["matrices"]["acc"] for cell in row if cell is not None]
    assert scores and all(0 < s <= 1 for s in scores)
    with pytest.raises(ValueError, match="already registered"):
        register_protocol(type("Again", (EndTaskProtocol,), {"name": "linear_probe"}))
    json.dumps(record)  # the record is plain JSON
