"""Record comparison and configuration round trip behind ``dapbench reproduce``."""

import copy
import dataclasses

import pytest

from benchmark.config import RunConfig, profile_config
from benchmark.errors import DapbenchError
from benchmark.records.reproduce import (
    CI_TOLERANCE,
    Tolerance,
    check_data,
    compare_records,
    cpu_threads,
    kernels_line,
    key_numbers,
    largest_differences,
    recorded_cpu_threads,
)


def fake_record() -> dict:
    return {
        "summary": {"acc": {"final": 0.5, "forgetting": 0.1, "bwt": -0.1}, "macro_f1": None},
        "matrices": {"acc": [[0.6, None], [0.5, 0.5]]},
        "lm_loss": {"base": {"general": 4.0}, "after_domain": [None, {"general": 4.5}]},
        "data_checksums": {"corpus/a": "x", "task/t": "y"},
    }


def test_key_numbers_flatten_every_reported_number():
    numbers = key_numbers(fake_record())
    assert numbers == {
        "summary/acc/final": 0.5,
        "summary/acc/forgetting": 0.1,
        "summary/acc/bwt": -0.1,
        "matrices/acc/0/0": 0.6,
        "matrices/acc/1/0": 0.5,
        "matrices/acc/1/1": 0.5,
        "lm_loss/base/general": 4.0,
        "lm_loss/after_domain/1/general": 4.5,
    }


def test_compare_records_uses_the_tolerance_of_each_kind():
    expected, actual = fake_record(), copy.deepcopy(fake_record())
    actual["matrices"]["acc"][1][1] = 0.52  # a score off by 0.02
    actual["lm_loss"]["after_domain"][1]["general"] = 4.504  # a loss off by 0.004
    assert compare_records(expected, actual, Tolerance(score=0.03, loss=0.01)) == []
    names = [m.name for m in compare_records(expected, actual, Tolerance(score=0.01, loss=0.001))]
    assert names == ["lm_loss/after_domain/1/general", "matrices/acc/1/1"]
    del actual["matrices"]["acc"][1][0:1]  # a number missing on one side is a mismatch too
    assert any(m.actual is None or m.expected is None for m in compare_records(expected, actual, Tolerance(1, 1)))


def test_one_rounding_unit_is_within_a_tolerance_of_one_unit_and_two_are_not():
    expected, actual = fake_record(), copy.deepcopy(fake_record())
    expected["lm_loss"]["after_domain"][1]["general"] = 6.26021  # stored decimals: 6.26022 - 6.26021 > 1e-5 in floats
    actual["lm_loss"]["after_domain"][1]["general"] = 6.26022
    assert compare_records(expected, actual, Tolerance(score=0.0, loss=1e-5)) == []
    actual["lm_loss"]["after_domain"][1]["general"] = 6.26023
    assert [m.name for m in compare_records(expected, actual, Tolerance(score=0.0, loss=1e-5))] == [
        "lm_loss/after_domain/1/general"
    ]


def test_a_chunk_sum_may_differ_by_one_unit_of_its_stored_last_place_unless_the_tolerance_is_zero():
    def record(chunk_sum: float) -> dict:
        return {"lm_loss": {"chunks": {"counts": {"alpha": [2]}, "after_domain": [{"alpha": [chunk_sum]}]}}}

    loose, exact = Tolerance(score=0.0, loss=1e-5), Tolerance(score=0.0, loss=0.0)
    assert compare_records(record(25.4616), record(25.4617), loose) == []  # 2 tokens x 1e-5 < 1e-4, its last place
    assert compare_records(record(25.4616), record(25.4618), loose)
    assert compare_records(record(25.4616), record(25.4617), exact)


def test_largest_differences_per_kind():
    expected, actual = fake_record(), copy.deepcopy(fake_record())
    same = largest_differences(expected, actual)
    assert set(same) == {"score", "loss"} and all(diff == 0.0 for _, diff in same.values())
    actual["matrices"]["acc"][1][0] = 0.53
    actual["summary"]["acc"]["final"] = 0.51
    actual["lm_loss"]["base"]["general"] = 4.002
    largest = largest_differences(expected, actual)
    assert largest["score"] == ("matrices/acc/1/0", pytest.approx(0.03))
    assert largest["loss"] == ("lm_loss/base/general", pytest.approx(0.002))


def test_config_round_trips_through_its_dict():
    config = dataclasses.replace(profile_config("ci"), method_options={"das": {"fidelity": "reference"}})
    assert RunConfig.from_dict(config.to_dict()) == config
    with pytest.raises(DapbenchError, match="does not know: unknown_field"):
        RunConfig.from_dict({**config.to_dict(), "unknown_field": 1})


def test_different_data_is_named():
    with pytest.raises(DapbenchError, match="task/t"):
        check_data(fake_record(), {"corpus/a": "x", "task/t": "other"})


def test_the_cpu_kernels_of_record_and_rerun_are_named_and_a_difference_explained():
    same = kernels_line({"environment": {"device": "cpu", "cpu_kernels": "AVX2"}}, "AVX2")
    assert same == "CPU float kernels: AVX2 (the record's: AVX2)"
    other = kernels_line({"environment": {"device": "cpu", "cpu_kernels": "AVX512"}}, "AVX2")
    assert other.startswith("CPU float kernels: AVX2 (the record's: AVX512); other kernels round")
    unknown = kernels_line({"environment": {"device": "cpu"}}, "AVX2")
    assert "(the record's: not recorded); other kernels" in unknown
    assert kernels_line({"environment": {"device": "cuda:0"}}, "AVX2") == ""


def test_a_record_names_the_cpu_kernels_that_made_it():
    from types import SimpleNamespace

    import torch

    from benchmark.engine.environment import environment_facts

    accelerator = SimpleNamespace(device=torch.device("cpu"), num_processes=1, mixed_precision="no")
    facts = environment_facts(accelerator)
    assert facts["cpu_kernels"] == torch.backends.cpu.get_cpu_capability() != ""


def test_reproduction_uses_the_recorded_cpu_thread_count():
    import torch
    from threadpoolctl import threadpool_info

    assert recorded_cpu_threads({"environment": {"device": "cpu", "torch_threads": 1}}) == 1
    assert recorded_cpu_threads({"environment": {"device": "cuda:0", "torch_threads": 8}}) is None
    assert recorded_cpu_threads({}) is None  # records without an environment block
    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
        assert all(pool["num_threads"] == 1 for pool in threadpool_info())
    assert torch.get_num_threads() == before


def test_a_record_of_other_numerics_is_refused_naming_the_commit_that_made_it(tmp_path):
    import json
    from pathlib import Path

    from cli_helpers import whole_record

    from benchmark.api import reproduce
    from benchmark.errors import DapbenchError
    from benchmark.records.identity import RESULTS_VERSION

    (committed,) = sorted(Path(__file__).resolve().parents[1].glob("results/ci/ncl-*.json"))[:1]
    record = whole_record(committed)  # one whole JSON file, edited and written back
    record["identity"]["results_version"] = RESULTS_VERSION - 1
    record["environment"]["git_commit"] = "0123abc"
    from benchmark.records.identity import record_identity

    record["run_id"] = record_identity(record).run_id(record["seed"], record["config"]["sequence"])  # as it was made
    path = tmp_path / f"{record['run_id']}.json"
    path.write_text(json.dumps(record))
    said = f"results_version {RESULTS_VERSION - 1} \\(this checkout: {RESULTS_VERSION}\\)"
    with pytest.raises(DapbenchError, match=said) as caught:
        reproduce(path, output_dir=tmp_path / "out")
    assert "check out 0123abc" in caught.value.fix
    assert not (tmp_path / "out").exists()


def test_a_replay_record_of_the_earlier_replay_counting_is_refused():
    from benchmark.api import require_current_numerics
    from benchmark.errors import DapbenchError
    from benchmark.records.identity import REPLAY_VERSION

    record = _committed("ncl")
    require_current_numerics(record, "ncl.json")  # no replay: no replay version asked for
    record["config"]["replay"] = {"general": 0.25, "past": 0.0}
    with pytest.raises(DapbenchError, match=f"replay_version 1 \\(this checkout: {REPLAY_VERSION}\\)"):
        require_current_numerics(record, "ncl.json")
    record["identity"]["replay_version"] = REPLAY_VERSION
    require_current_numerics(record, "ncl.json")


def _committed(method: str) -> dict:
    from pathlib import Path

    from benchmark.records.store import load_record

    (path,) = Path(__file__).resolve().parents[1].glob(f"results/ci/{method}-*.json")
    return load_record(path)


def _set_path(record: dict, path: str, value) -> None:
    *parents, last = path.split("/")
    node = record
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(last) if isinstance(node, list) else last] = value


def test_every_number_of_a_record_is_classified_and_every_reported_one_is_compared():
    from benchmark.records.reproduce import NOT_RESULTS, kind_of, numeric_fields

    record = _committed("das")
    kinds = {path: kind_of(path) for path, _ in numeric_fields(record)}  # an unclassified field raises here
    assert {"score", "loss", "chunk", "drift", "report", "exact"} <= set(kinds.values())
    assert all(reason for reason in NOT_RESULTS.values())
    # fields a run writes only when asked: a committed record with continual-evaluation curves (issue #90)
    curved = _committed_with_curves()
    kinds = {path: kind_of(path) for path, _ in numeric_fields(curved)}
    assert {kinds[p] for p in kinds if "/curve/steps/" in p} == {"exact"}
    assert {kinds[p] for p in kinds if "/curve/losses/" in p} == {"loss"}


def _committed_with_curves() -> dict:
    """The first committed top-rung record that measured curves (``dap.eval_every``)."""
    from pathlib import Path

    from benchmark.records.store import load_record

    for path in sorted(Path(__file__).resolve().parents[1].glob("results/mini-pass/ncl-*.json")):
        if '"curve"' in path.read_text():
            return load_record(path)
    raise AssertionError("no committed record with curves under results/mini-pass")


def test_a_numbers_kind_read_from_its_path_shape_is_the_kind_its_full_path_matches():
    import fnmatch
    import re

    from benchmark.records.reproduce import KIND_RULES, NOT_RESULTS, kind_of, numeric_fields

    patterns = [*NOT_RESULTS, *(pattern for pattern, _ in KIND_RULES)]
    assert not [p for p in patterns if re.search(r"\d", p)]  # what reading every index as 0 relies on
    for path, _ in numeric_fields(_committed("das")):
        unlisted = not any(fnmatch.fnmatchcase(path, pattern) for pattern in NOT_RESULTS)
        rule = next((kind for pattern, kind in KIND_RULES if fnmatch.fnmatchcase(path, pattern)), None)
        assert kind_of(path) == (rule if unlisted else None), path


def test_editing_any_reported_number_is_caught_by_the_comparison():
    from benchmark.records.reproduce import kind_of

    record = _committed("das")
    numbers = key_numbers(record)
    assert len(numbers) > 300
    for path, value in numbers.items():
        edited = copy.deepcopy(record)
        _set_path(edited, path, value + (1 if isinstance(value, int) else 0.5))
        names = [m.name for m in compare_records(record, edited, CI_TOLERANCE)]
        if kind_of(path) == "histogram":  # one more unit: its histogram's unit count (the last bin's cumulative) moved
            histogram = path.rpartition("/")[0]
            last = max(int(name.rpartition("/")[2]) for name in numbers if name.rpartition("/")[0] == histogram)
            assert f"{histogram}/{last} (units up to this bin)" in names, path
            assert all(name.startswith(f"{histogram}/") for name in names), path
        else:
            assert names == [path], path


def _importance_histogram(counts: list[int]) -> dict:
    return {"domains": [{"method_report": {"mask": {"importance_histogram": {"intermediate": counts}}}}]}


def test_a_histogram_is_compared_as_its_units_up_to_each_bin_edge_and_its_unit_count_exactly():
    bins = [6348, 392, 309, 293, 294, 276, 267, 241, 294, 502]  # a DAS record's 9216 intermediate units
    path = "domains/0/method_report/mask/importance_histogram/intermediate"
    one_crossed = [*bins[:3], 294, 293, *bins[5:]]  # one unit on the 0.4 edge moved to the next bin (seen on AVX2)
    assert compare_records(_importance_histogram(bins), _importance_histogram(one_crossed), CI_TOLERANCE) == []
    many_crossed = [*bins[:3], 293 - 20, 294 + 20, *bins[5:]]  # 20 > 0.002 x 9216 units crossed that edge
    (moved,) = compare_records(_importance_histogram(bins), _importance_histogram(many_crossed), CI_TOLERANCE)
    assert moved.name == f"{path}/3 (units up to this bin)"
    assert (moved.expected, moved.actual) == (sum(bins[:4]), sum(bins[:4]) - 20)
    one_more = [*bins[:9], 503]  # within any share of the units, but not the histogram of the same units
    (count,) = compare_records(_importance_histogram(bins), _importance_histogram(one_more), CI_TOLERANCE)
    assert (count.name, count.allowed) == (f"{path}/9 (units up to this bin)", 0.0)
    heads = [47, 2, 1, 2, 4, 2, 0, 4, 1, 9]  # 72 units: one unit is more than 0.2% of them, so each move is caught
    (head,) = compare_records(
        _importance_histogram(heads), _importance_histogram([47, 2, 1, 2, 4, 2, 0, 3, 2, 9]), CI_TOLERANCE
    )
    assert head.name == f"{path}/7 (units up to this bin)"


def test_a_record_whose_headline_was_edited_is_refused_when_read(tmp_path):
    import json

    from benchmark.records.store import load_record

    for field, value in (("lm_loss/metrics/plasticity", 0.5), ("summary/acc/final", 0.99), ("matrices/acc/0/0", 0.9)):
        record = _committed("ncl")
        _set_path(record, field, value)
        path = tmp_path / f"{record['run_id']}.json"
        path.write_text(json.dumps(record))
        with pytest.raises(DapbenchError, match="is not what its run wrote"):
            load_record(path)
    record = _committed("ncl")
    record["config"]["dap"]["lr"] = 0.5  # the id no longer hashes the configuration
    path.write_text(json.dumps(record))
    with pytest.raises(DapbenchError, match="hash to"):
        load_record(path)
