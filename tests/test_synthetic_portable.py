"""The synthetic world's base models are the shipped files on every installation (issue #89): the committed synthetic
records' model is the one a fresh clone runs, whatever its library versions or CPU."""

import dataclasses

import pytest

from benchmark.config import profile_config
from benchmark.data.synthetic import SHIPPED_MODELS, materialise
from benchmark.records.identity import FileHashCache, model_checksum


@pytest.mark.parametrize(("model", "folder"), [("synthetic", "masked"), ("synthetic-causal", "causal")])
def test_the_synthetic_base_model_is_the_shipped_one_byte_for_byte(model, folder, tmp_path):
    config = dataclasses.replace(profile_config("synthetic"), work_dir=str(tmp_path / "work"), model=model)
    placed = materialise(config)
    shipped = SHIPPED_MODELS / folder
    names = sorted(p.name for p in shipped.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    for name in names:
        assert (tmp_path / "work").joinpath(placed.model, name).read_bytes() == (shipped / name).read_bytes(), name
    cache = FileHashCache(tmp_path / "hashes.json")
    assert model_checksum(placed.model, cache) == model_checksum(str(shipped), cache)
    assert materialise(config).model == placed.model  # placed once, then found
