"""A non-finite loss, score, feature or importance stops the run with a named error; nothing is recorded."""

import dataclasses

import pytest
import torch
from model_helpers import tiny_mlm, toy_batch

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.engine.evaluation import heldout_features, heldout_losses
from benchmark.errors import NonFiniteError
from methods._shared.importance import gate_importance, mlm_importance_loss


def _past_the_range_check(section, **values):
    """``section`` with values its declared ranges refuse: a divergence at an in-range learning rate is real but
    slow to provoke, and the guards under test must hold whatever made the numbers non-finite."""
    for name, value in values.items():
        object.__setattr__(section, name, value)
    return section


def test_a_diverging_fine_tune_is_an_error_not_a_majority_class_score(tiny_config):
    finetune = _past_the_range_check(dataclasses.replace(tiny_config.finetune), lr=1e30)
    config = dataclasses.replace(tiny_config, finetune=finetune, sequence="alpha")
    run = continual_run(config, prepare_data(config), "none", 3, show_progress=False)
    with pytest.raises(NonFiniteError, match=r"none seed 3, checkpoint after domain 0, end task alpha_sup: .* step \d"):
        run.execute()
    assert not list(run.layout.root.glob("finetune/*.json"))  # no score was recorded


def test_a_diverging_dap_domain_names_method_domain_and_step(tiny_config):
    dap = _past_the_range_check(dataclasses.replace(tiny_config.dap), lr=1e30)
    config = dataclasses.replace(tiny_config, sequence="alpha")
    object.__setattr__(config, "dap", dap)
    run = continual_run(config, prepare_data(config), "ncl", 3, show_progress=False)
    with pytest.raises(NonFiniteError, match=r"ncl seed 3, domain 0 \(alpha\): .*non-finite by step"):
        run.execute()
    assert not (run.layout.root / "domain-0.json").exists()


def test_probe_on_non_finite_features_is_an_error(tiny_config):
    from transformers import AutoTokenizer

    from benchmark.protocols.linear_probe import probe_and_evaluate

    data = prepare_data(tiny_config)
    model = _nan_model()
    tokenizer = AutoTokenizer.from_pretrained(tiny_config.model)
    task = data.tasks["alpha"]
    task = dataclasses.replace(
        task,
        train=[dict(f, input_ids=[min(t, 49) for t in f["input_ids"]]) for f in task.train],
        test=[dict(f, input_ids=[min(t, 49) for t in f["input_ids"]]) for f in task.test],
    )
    with pytest.raises(NonFiniteError, match="linear probe on alpha_sup"):
        probe_and_evaluate(model, task, tokenizer, tiny_config.finetune, _CpuAccelerator())


class _CpuAccelerator:
    device = "cpu"


def _nan_model():
    model = tiny_mlm().eval()
    with torch.no_grad():
        model.bert.encoder.layer[0].intermediate.dense.weight[0, 0] = float("nan")
    return model


def test_heldout_loss_and_features_of_a_nan_model_are_errors():
    batches = {"a": [toy_batch()]}
    with pytest.raises(NonFiniteError, match="held-out MLM loss on 'a'"):
        heldout_losses(_nan_model(), batches, "cpu")
    with pytest.raises(NonFiniteError, match="held-out features of 'a'"):
        heldout_features(_nan_model(), batches, "cpu")


def test_importance_of_a_nan_model_is_an_error():
    with pytest.raises(NonFiniteError, match="unit importance is not finite"):
        gate_importance(_nan_model(), [toy_batch()], mlm_importance_loss(), ("head",), per_example=True)


class _Payload:
    """Pickles to a call that would create a file if a loader executed it."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_a_checkpoint_holding_a_pickled_object_is_refused_and_runs_nothing(tiny_config, tmp_path):
    from benchmark.errors import DapbenchError
    from benchmark.io import write_manifest

    data = prepare_data(tiny_config)
    run = continual_run(tiny_config, data, "das", 3, show_progress=False)
    run.execute()
    checkpoint = run.layout.root / "checkpoint-1"
    marker = tmp_path / "executed"
    torch.save({"importance": _Payload(marker)}, checkpoint / "method_state.pt")
    write_manifest(checkpoint)  # a crafted checkpoint: its manifest matches, so the loader itself must refuse
    (run.layout.root / "finetune" / "row1-task1.json").unlink()  # force a resume that loads the checkpoint
    with pytest.raises(DapbenchError, match="holds objects other than tensors and plain values"):
        continual_run(tiny_config, data, "das", 3, show_progress=False).execute()
    assert not marker.exists()


def test_written_files_get_ordinary_permissions(tmp_path):
    import os

    from benchmark.io import atomic_write_json

    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644
