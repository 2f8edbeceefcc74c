"""Issue #86: ``dapbench rescore`` scores a finished run's kept checkpoints again under other end-task settings: a new
record of its own run id whose DAP stages are the run's own, not re-run, and whose source is never changed."""

from __future__ import annotations

import dataclasses
import os

import pytest

from benchmark.errors import DapbenchError


@pytest.fixture
def kept_run(tiny_config, tmp_path):
    """A tiny ncl run over two domains that kept every stage's checkpoint, its record on disk."""
    from benchmark.api import continual_run
    from benchmark.data.inputs import prepare_data
    from benchmark.records.store import write_record

    config = dataclasses.replace(tiny_config, keep_checkpoints=True)
    run = continual_run(config, prepare_data(config), "ncl", 3, show_progress=False)
    record = run.execute()
    path = tmp_path / "results" / "synthetic" / f"{record['run_id']}.json"
    write_record(path, record)
    return config, run, record, path


def _paths(config) -> dict:
    return {name: getattr(config, name) for name in ("model", "data_root", "general_heldout", "general_corpus")}


def test_a_rescore_scores_the_kept_checkpoints_again_and_trains_nothing(kept_run, tmp_path, monkeypatch):
    from cli_helpers import TrainingStarted

    from benchmark.api import rescore
    from benchmark.engine.training import DapTrainer

    config, run, record, path = kept_run

    def refuse(self, *args, **kwargs):
        raise TrainingStarted

    monkeypatch.setattr(DapTrainer, "train", refuse)  # any DAP training fails the test
    before = {p: p.stat().st_mtime_ns for p in run.layout.root.rglob("*") if p.is_file()}
    new, written = rescore(
        path,
        overrides=["finetune.max_train_examples=12"],
        work_dir=config.work_dir,
        output_dir=tmp_path / "rescored",
        paths=_paths(config),
    )
    assert new["run_id"] != record["run_id"] and written.is_file()
    assert new["config"]["finetune"]["max_train_examples"] == 12
    assert new["lm_loss"] == record["lm_loss"] and new["domains"] == record["domains"]  # the run's own stages
    assert new["matrices"]["acc"][1][0] is not None  # every cell scored afresh
    assert {p: p.stat().st_mtime_ns for p in before} == before  # the source run is untouched
    linked = run.layout.root.parent / new["run_id"] / "checkpoint-0"
    assert any(
        os.path.samefile(p, run.layout.root / p.relative_to(linked.parent)) for p in linked.rglob("*.safetensors")
    )


def test_a_rescore_changes_end_task_settings_only(kept_run, tmp_path):
    from benchmark.api import rescore

    config, _, _, path = kept_run
    with pytest.raises(DapbenchError, match="changes end-task settings only; got dap.steps=8") as caught:
        rescore(path, overrides=["dap.steps=8"], work_dir=config.work_dir, paths=_paths(config))
    assert "finetune.KEY=VALUE" in caught.value.fix
    with pytest.raises(DapbenchError, match="nothing to re-score"):
        rescore(path, overrides=["finetune.max_train_examples=24"], work_dir=config.work_dir, paths=_paths(config))


def test_a_run_that_kept_only_its_last_checkpoint_is_refused_before_any_work(tiny_config, tmp_path):
    from benchmark.api import continual_run, rescore
    from benchmark.data.inputs import prepare_data
    from benchmark.records.store import write_record

    run = continual_run(tiny_config, prepare_data(tiny_config), "ncl", 3, show_progress=False)
    record = run.execute()
    path = tmp_path / "results" / "synthetic" / f"{record['run_id']}.json"
    write_record(path, record)
    with pytest.raises(DapbenchError, match=r"stages \[0\] kept no checkpoint") as caught:
        rescore(
            path, overrides=["finetune.max_train_examples=12"], work_dir=tiny_config.work_dir, paths=_paths(tiny_config)
        )
    assert "keep_checkpoints=true" in caught.value.fix
    assert not list(run.layout.root.parent.glob(".*.linking"))
