"""Model families (issue #48): one object per kind of language model, chosen from the model's configuration; a new
kind is one module plus its registration and runs through a whole run."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import toy_family

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.errors import DapbenchError
from benchmark.families import CAUSAL_LM, MASKED_LM, get_family, register_family, unregister_family
from benchmark.report.frame import loss_unit


def _renamed_architecture(model_dir, out, architecture: str):
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": [architecture]}))
    return out


def test_a_model_family_is_added_by_one_module_and_runs_through_a_run(tiny_config, tmp_path):
    model = _renamed_architecture(tiny_config.model, tmp_path / "toy", "BertForEveryFourthLM")
    config = dataclasses.replace(tiny_config, model=str(model), methods=("ncl",))
    toy_family.register()
    try:
        data = prepare_data(config)
        assert data.family is toy_family.EVERY_FOURTH and data.heldout_draws == 1
        batch = data.heldout_batches["alpha"][0]
        assert (batch["mlm_positions"] % batch["input_ids"].shape[1] % 4 == 0).all()  # the toy's positions, no draw
        record = continual_run(config, data, "ncl", 3, show_progress=False).execute()
        assert loss_unit(record) == ("held-out loss at every fourth token", "nats")
    finally:
        unregister_family("every-fourth")
    assert record["model_kind"] == "every-fourth"
    base, last = record["lm_loss"]["base"], record["lm_loss"]["after_domain"][-1]
    assert all(math.isfinite(v) for v in [*base.values(), *last.values()])
    assert base != last  # it trained on the toy objective
    assert loss_unit(record) == ("held-out loss (every-fourth model)", "nats")  # not registered here: said so


def test_the_built_in_families_cannot_be_taken_or_removed():
    assert get_family("masked") is MASKED_LM and get_family("causal") is CAUSAL_LM
    with pytest.raises(DapbenchError, match="already registered"):
        register_family(type("AnotherMasked", (type(MASKED_LM),), {})())  # the name "masked" again
    with pytest.raises(DapbenchError, match="cannot be removed"):
        unregister_family("masked")
    with pytest.raises(DapbenchError, match="unknown model family 'encoder-decoder'"):
        get_family("encoder-decoder")
