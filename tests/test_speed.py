"""DAP speed is compared only between runs that name the same machine (benchmark.report.speed)."""

import copy

import pytest

from benchmark.engine.environment import cpu_model
from benchmark.report.speed import machine_counts, machine_of, mixed_machines_flag, same_machine_speed

EPYC = {"device": "cpu", "device_name": "cpu", "cpu_model": "AMD EPYC", "cpu_kernels": "AVX512", "torch_threads": 1}
XEON = {**EPYC, "cpu_model": "Intel Xeon", "cpu_kernels": "AVX2"}


def _record(label: str, tokens_per_second: float | None, environment: dict) -> dict:
    return {"method_label": label, "timing": {"tokens_per_second": tokens_per_second}, "environment": environment}


def test_a_ratio_is_taken_on_the_machine_both_rows_ran_on_never_across_machines():
    records = [
        _record("ncl", 800.0, EPYC),
        _record("ncl", 600.0, EPYC),
        _record("ncl", 400.0, XEON),
        _record("derpp", 280.0, EPYC),
        _record("derpp", 2000.0, {**XEON, "cpu_model": "Another CPU"}),  # no ncl run there: never enters
    ]
    found = same_machine_speed(records, "derpp", "ncl")
    assert found.ratio == pytest.approx(280 / 700)
    assert found.machine == "AMD EPYC (AVX512), 1 thread(s)"
    assert (found.runs, found.reference_runs) == (1, 2)


def test_the_machine_with_most_runs_of_both_decides_where_several_are_shared():
    records = [_record("ncl", 800.0, EPYC), _record("kd", 400.0, EPYC)]
    records += [_record("ncl", 300.0, XEON), _record("ncl", 300.0, XEON), _record("kd", 30.0, XEON)]
    records += [_record("kd", 30.0, XEON)]
    found = same_machine_speed(records, "kd", "ncl")
    assert found.machine.startswith("Intel Xeon") and found.ratio == pytest.approx(0.1)


def test_records_that_name_no_machine_are_never_compared_and_kernels_alone_name_one():
    unnamed = {"device": "cpu", "device_name": "cpu", "torch_threads": 1}
    records = [_record("ncl", 800.0, unnamed), _record("das", 200.0, unnamed)]
    assert machine_of(records[0]) is None
    assert same_machine_speed(records, "das", "ncl") is None
    kernels_only = {**unnamed, "cpu_kernels": "AVX512"}
    later = [_record("ncl", 800.0, kernels_only), _record("das", 200.0, kernels_only), _record("das", 1.0, EPYC)]
    found = same_machine_speed(later, "das", "ncl")
    assert found.machine == "an unnamed AVX512 CPU, 1 thread(s)" and found.ratio == pytest.approx(0.25)
    assert machine_counts([*records, *later]) == [
        "AMD EPYC (AVX512), 1 thread(s) (1 run)",
        "a CPU that the records do not name (2 runs)",
        "an unnamed AVX512 CPU, 1 thread(s) (2 runs)",
    ]


def test_threads_processes_and_gpus_are_part_of_the_machine():
    two_threads = _record("ncl", 1.0, {**EPYC, "torch_threads": 2})
    gpus = _record("ncl", 1.0, {"device": "cuda:0", "device_name": "NVIDIA H200", "num_processes": 4})
    assert machine_of(two_threads) != machine_of(_record("ncl", 1.0, EPYC))
    assert machine_of(gpus) == "NVIDIA H200 x 4 processes"


def test_a_row_whose_tokens_per_second_mix_machines_is_flagged():
    unnamed = {"device": "cpu", "device_name": "cpu", "torch_threads": 1}
    assert mixed_machines_flag([_record("ncl", 800.0, EPYC), _record("ncl", 700.0, EPYC)]) == ""
    assert mixed_machines_flag([_record("ncl", 800.0, EPYC), _record("ncl", 300.0, XEON)]) == "tokens/s over 2 machines"
    # A run whose machine is not known may be another one; a run without DAP has no speed to mix.
    assert mixed_machines_flag([_record("ncl", 800.0, EPYC), _record("ncl", 800.0, unnamed)]) != ""
    assert mixed_machines_flag([_record("none", None, EPYC), _record("none", None, XEON)]) == ""


def test_runs_without_dap_have_no_speed_to_compare():
    records = [_record("ncl", 800.0, EPYC), _record("none", None, EPYC)]
    assert same_machine_speed(records, "none", "ncl") is None


def test_a_record_names_the_cpu_it_ran_on(report_records):
    assert report_records[0]["environment"]["cpu_model"] == cpu_model() != ""


def test_the_short_answer_names_the_machine_of_its_speed_ratio(report_records):
    from benchmark.report.answer import TEMPLATE
    from benchmark.report.groups import group_records
    from benchmark.report.words import say

    def pace(group, label: str, naive: str) -> str:  # what the short answer's best-row line says of its speed
        return say(TEMPLATE, "pace", same_machine_speed(group.records, label, naive), naive)

    moved = copy.deepcopy(report_records)
    for record in moved:  # one load class, whatever else ran beside the fixture's runs
        record["environment"]["cpu_load_per_core"] = 0.5
    (group,), _ = group_records(moved)
    line = pace(group, "das", "ncl")
    assert "x its DAP tokens per second (3 against 3 runs on" in line and cpu_model() in line
    for record in moved:
        if record["method_label"] == "das":
            record["environment"]["cpu_model"] = "Some Other CPU"
    (group,), _ = group_records(moved)
    assert pace(group, "das", "ncl") == ", its speed not measured on a machine of `ncl`'s runs"


def test_runs_on_an_oversubscribed_machine_are_compared_only_with_runs_so_loaded():
    quiet, busy = {**EPYC, "cpu_load_per_core": 0.9}, {**EPYC, "cpu_load_per_core": 3.5}
    records = [_record("ncl", 800.0, quiet), _record("one", 5800.0, busy)]  # a 7x that is the load's, not one's
    assert same_machine_speed(records, "one", "ncl") is None
    records.append(_record("ncl", 200.0, busy))
    found = same_machine_speed(records, "one", "ncl")
    assert found.ratio == pytest.approx(29.0) and "oversubscribed" in found.machine
    assert machine_of(_record("ncl", 1.0, EPYC)) == machine_of(_record("ncl", 1.0, {**EPYC, "cpu_load_per_core": None}))


def test_a_record_says_how_loaded_its_machine_was(report_records):
    loads = [r["environment"].get("cpu_load_per_core") for r in report_records]
    assert all(isinstance(load, float) and load >= 0 for load in loads)
