"""``dapbench reproduce --stages-only``: a record made before per-stage update sizes were measured (issue #45) gets
them from a re-run of its stages alone, only where every number those stages make matches the record's."""

import copy
import dataclasses

import pytest

from benchmark.errors import DapbenchError
from benchmark.records.reproduce import CI_TOLERANCE, compare_stages, with_measured_update_sizes


@pytest.fixture
def ncl_record(tiny_config, tmp_path):
    """A tiny NCL record as the runner writes it, and the same record as one made before update sizes were."""
    from benchmark.api import continual_run
    from benchmark.data.inputs import prepare_data

    config = dataclasses.replace(tiny_config, methods=("ncl",))
    record = continual_run(config, prepare_data(config), "ncl", 3, show_progress=False).execute()
    old = copy.deepcopy(record)
    for stage in old["domains"]:
        del stage["update_sizes"]
    inputs = {name: getattr(config, name) for name in ("model", "data_root", "general_heldout", "general_corpus")}
    return record, old, inputs  # a test world's inputs are recorded as local:<name>: the re-runs are told them


def _write(record, folder):
    from benchmark.records.store import write_record

    path = folder / "results" / record["profile"] / f"{record['run_id']}.json"
    write_record(path, record)
    return path


def test_a_record_without_update_sizes_gets_those_of_its_matching_rerun(ncl_record, tmp_path):
    from benchmark.api import reproduce_stages
    from benchmark.records.store import load_record

    made, old, inputs = ncl_record
    path = _write(old, tmp_path / "old")
    before = path.read_bytes()
    result = reproduce_stages(path, output_dir=tmp_path / "rerun", paths=inputs)
    assert result.ok and result.largest_loss_difference == 0.0
    assert path.read_bytes() == before  # the record's own file is never touched
    added = load_record(result.path)
    assert [stage["update_sizes"] for stage in added["domains"]] == [stage["update_sizes"] for stage in made["domains"]]
    assert all(stage["update_sizes"]["weights"]["relative"] > 0 for stage in added["domains"])
    facts = added["update_sizes_measured"]
    assert facts["compared"] == result.compared > 50 and facts["largest_loss_difference"] == 0.0
    assert facts["cpu_kernels"] == made["environment"]["cpu_kernels"]  # the kernels of the re-run, here the record's
    assert result.kernels == f"CPU float kernels: {facts['cpu_kernels']} (the record's: {facts['cpu_kernels']})"
    assert {k: v for k, v in added.items() if k not in ("domains", "update_sizes_measured")} == {
        k: v for k, v in load_record(path).items() if k != "domains"
    }
    again = reproduce_stages(result.path, output_dir=tmp_path / "again", paths=inputs)  # now compared on the sizes too
    assert again.ok and again.path is None and again.compared > result.compared


def test_a_record_whose_stages_differ_gets_no_update_sizes(ncl_record, tmp_path):
    from benchmark.api import reproduce_stages

    _, old, inputs = ncl_record
    old["domains"][1]["loss_log"][0]["mlm"] += 0.5  # a stage number the re-run cannot match
    result = reproduce_stages(_write(old, tmp_path / "old"), output_dir=tmp_path / "rerun", paths=inputs)
    assert [m.name for m in result.mismatches] == ["domains/1/loss_log/0/mlm"]
    assert result.path is None and not (tmp_path / "rerun" / "results").exists()
    assert all("update_sizes" not in stage for stage in result.record["domains"])


def test_stages_of_other_domains_are_named():
    record = {"domains": [{"domain": "alpha"}, {"domain": "beta"}], "lm_loss": {"chunks": None}}
    with pytest.raises(DapbenchError, match=r"re-run's stages \(alpha\) are not the record's \(alpha, beta\)"):
        compare_stages(record, [{"domain": "alpha"}], CI_TOLERANCE)


def test_untrained_stages_get_no_sizes_and_a_record_with_all_of_them_is_returned_as_it_is():
    stages = [{"domain": "alpha", "trained": False}, {"domain": "beta", "trained": True, "update_sizes": {"w": {}}}]
    record = {"domains": [{"domain": "alpha"}, {"domain": "beta"}]}
    added = with_measured_update_sizes(record, stages, {"compared": 3})
    assert added["domains"] == [{"domain": "alpha"}, {"domain": "beta", "update_sizes": {"w": {}}}]
    assert added["update_sizes_measured"] == {"compared": 3} and "update_sizes_measured" not in record
    assert with_measured_update_sizes(added, stages, {"compared": 4}) is added


def test_an_own_domain_rerun_adds_the_same_sizes_and_never_stands_in_for_a_full_one(ncl_record, tmp_path):
    from benchmark.api import reproduce_stages
    from benchmark.records.store import load_record

    made, old, inputs = ncl_record
    path = _write(old, tmp_path / "old")
    full = reproduce_stages(path, output_dir=tmp_path / "full", paths=inputs)
    quick = reproduce_stages(path, output_dir=tmp_path / "quick", paths=inputs, own_domain_only=True)
    assert quick.ok and quick.largest_loss_difference == 0.0
    assert len(made["domains"]) < quick.compared < full.compared  # own sets' losses and chunk sums, no drift
    added = load_record(quick.path)
    assert [stage["update_sizes"] for stage in added["domains"]] == [stage["update_sizes"] for stage in made["domains"]]
    assert added["update_sizes_measured"]["heldout_scope"] == "own domain"
    assert "heldout_scope" not in load_record(full.path)["update_sizes_measured"]
    with pytest.raises(DapbenchError, match="evaluated on its own held-out set alone"):
        reproduce_stages(path, output_dir=tmp_path / "quick", paths=inputs)  # its partial stages are not a run's


def test_an_own_domain_comparison_covers_each_stage_own_loss_and_chunk_sums_and_nothing_else(ncl_record):
    from benchmark.records.reproduce import own_domain_view

    made, _, _ = ncl_record
    made = copy.deepcopy(made)
    for stage in made["domains"]:  # curves (dap.eval_every) score every set: an own-domain re-run makes none
        stage["curve"] = {"steps": [0, 2], "losses": {stage["domain"]: [3.0, 2.9]}, "seconds": 0.1}
    rows = made["lm_loss"]["chunks"]["after_domain"]
    stages = [
        {**stage, "lm_loss_chunks": {stage["domain"]: list(row[stage["domain"]])}}
        for stage, row in zip(own_domain_view(made["domains"]), rows, strict=True)
    ]
    assert all(len(stage["lm_loss"]) == 1 and not {"representation", "curve"} & set(stage) for stage in stages)
    compared, mismatches = compare_stages(made, stages, CI_TOLERANCE, own_domain_only=True)
    assert not mismatches and compared > len(stages) * len(rows[0][made["domains"][0]["domain"]])
    own = stages[1]["domain"]
    stages[1]["lm_loss"][own] += 0.01
    stages[0]["lm_loss_chunks"][stages[0]["domain"]][2] += 1.0
    _, mismatches = compare_stages(made, stages, CI_TOLERANCE, own_domain_only=True)
    assert sorted(m.name for m in mismatches) == [
        f"domains/1/lm_loss/{own}",
        f"lm_loss/chunks/after_domain/0/{stages[0]['domain']}/2",
    ]


def test_rerun_share_a_work_folder_that_never_holds_the_run_they_redo(ncl_record, tmp_path):
    from benchmark.api import reproduce_stages

    _, old, inputs = ncl_record
    path, shared = _write(old, tmp_path / "old"), tmp_path / "shared"
    first = reproduce_stages(path, output_dir=tmp_path / "a", paths=inputs, work_dir=shared, own_domain_only=True)
    assert first.ok and (shared / "runs" / old["run_id"]).is_dir() and not (tmp_path / "a" / ".dapbench").exists()
    with pytest.raises(DapbenchError, match=f"already holds run {old['run_id']}"):
        reproduce_stages(path, output_dir=tmp_path / "b", paths=inputs, work_dir=shared)  # it would compare itself
    assert not (tmp_path / "b").exists()


def test_an_own_domain_comparison_pairs_a_single_stage_with_its_own_row():
    """A method trained once on every domain (``pool``) has one stage, and its chunk row is the last domain's."""
    stage = {"domain": "beta", "lm_loss": {"alpha": 1.0, "beta": 2.0}}
    counts = {"alpha": [3], "beta": [3]}
    record = {
        "domains": [stage],
        "lm_loss": {"chunks": {"counts": counts, "after_domain": [None, {"alpha": [1.5], "beta": [2.5]}]}},
    }
    rerun = [{"domain": "beta", "lm_loss": {"beta": 2.0}, "lm_loss_chunks": {"beta": [2.5]}}]
    assert compare_stages(record, rerun, CI_TOLERANCE, own_domain_only=True)[1] == []
    rerun[0]["lm_loss_chunks"]["beta"] = [2.9]
    assert [m.name for m in compare_stages(record, rerun, CI_TOLERANCE, own_domain_only=True)[1]] == [
        "lm_loss/chunks/after_domain/0/beta/0"
    ]


def test_a_run_never_builds_its_record_from_stages_an_own_domain_call_left(tiny_config):
    from benchmark.api import continual_run
    from benchmark.data.inputs import prepare_data

    config = dataclasses.replace(tiny_config, methods=("ncl",))
    run = continual_run(config, prepare_data(config), "ncl", 3, show_progress=False)
    assert all(len(stage["lm_loss"]) == 1 for stage in run.pretrained_stages(own_domain_only=True))
    with pytest.raises(DapbenchError, match="evaluated on its own held-out set alone"):
        run.execute()
