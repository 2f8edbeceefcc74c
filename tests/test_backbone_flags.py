"""Issue #86: an end-task cell whose classifier predicts fewer than half of its test set's classes, or scores at or
below the majority class, does not measure the backbone: the record keeps the flag, the export says so per cell,
and the report states no verdict from such cells."""

from __future__ import annotations

import copy

import pytest

from benchmark.metrics import backbone_flags, backbone_problem, majority_macro_f1, record_backbone_flags

LABELS = [0, 0, 0, 0, 1, 1, 2, 2, 3, 4, 5, 5]
"""A test set of 12 examples over the 6 classes of a task (the majority class 0 holds a third)."""


def test_a_classifier_predicting_under_half_of_the_test_classes_is_flagged():
    two_classes = [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1]
    assert backbone_problem(LABELS, two_classes, 6) == "predicts 2 of the 6 classes in its test set"
    three_classes = [0, 0, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1]  # half of 6: enough classes, and above the majority
    assert backbone_problem(LABELS, three_classes, 6) is None


def test_a_classifier_at_or_below_the_majority_class_is_flagged():
    majority = majority_macro_f1(LABELS, 6)
    assert majority == pytest.approx(2 * (1 / 3) / (1 + 1 / 3) / 6)
    assert backbone_problem(LABELS, [0] * 12, 6).startswith("predicts 1 of the 6")
    # four classes predicted, each wrongly but for class 0's: the macro-F1 falls below always predicting class 0
    scattered = [0, 1, 1, 1, 2, 2, 3, 3, 0, 1, 2, 3]
    assert "at or below the majority class's" in backbone_problem(LABELS, scattered, 6)
    assert backbone_problem(LABELS, LABELS, 6) is None


def test_flags_name_each_cell_of_a_protocol_by_its_stage_and_task():
    labels = {"a": {"classes": 6, "labels": LABELS}, "b": {"classes": 6, "labels": LABELS}}
    predictions = {"0/0": LABELS, "1/0": [0] * 12, "1/1": LABELS}
    assert backbone_flags(predictions, labels, ["a", "b"]) == {"1/0": "predicts 1 of the 6 classes in its test set"}


def test_a_record_keeps_its_flags_and_its_check_refuses_edited_ones(report_records):
    from benchmark.errors import DapbenchError
    from benchmark.records.checks import check_record

    record = copy.deepcopy(report_records[0])
    assert record["backbone_flags"] == backbone_flags(record["predictions"], record["test_labels"], record["end_tasks"])
    cell = next(iter(record["predictions"]))
    record["backbone_flags"] = {} if record["backbone_flags"] else {cell: "predicts 1 of the 2 classes"}
    with pytest.raises(DapbenchError, match="backbone_flags are not what its predictions give"):
        check_record(record)
    older = copy.deepcopy(report_records[0])
    del older["backbone_flags"]  # a record made before the flags were kept: derived from its predictions
    assert record_backbone_flags(older) == report_records[0]["backbone_flags"]


def _collapsed(record: dict) -> dict:
    """``record`` whose own protocol's classifiers all predict the first test label: every cell flagged."""
    record = copy.deepcopy(record)
    for cell in record["predictions"]:
        task = record["end_tasks"][int(cell.split("/")[1])]
        record["predictions"][cell] = [0] * len(record["test_labels"][task]["labels"])
    record["backbone_flags"] = backbone_flags(record["predictions"], record["test_labels"], record["end_tasks"])
    return record


def test_the_export_says_per_cell_whether_it_measures_the_backbone(report_records):
    from benchmark.report.export import end_tasks_table

    table = end_tasks_table([report_records[0], _collapsed(report_records[1])])
    collapsed = table[table["run_id"] == report_records[1]["run_id"]]
    assert not collapsed["measures_backbone"].any() and set(collapsed["classes_predicted"]) == {1}
    record = report_records[0]
    own = table[table["run_id"] == record["run_id"]]
    cells = [f"{t}/{record['end_tasks'].index(task)}" for t, task in zip(own["stage"], own["task"], strict=True)]
    assert list(own["measures_backbone"]) == [cell not in record["backbone_flags"] for cell in cells]
    assert own["majority_macro_f1"].notna().all()


def test_no_end_task_verdict_is_stated_from_cells_that_do_not_measure_the_backbone(report_records):
    from benchmark.report.answer import _end_tasks
    from benchmark.report.end_task_reading import end_task_reading, measuring_comparisons
    from benchmark.report.frame import backbone_flag, by_label
    from benchmark.report.groups import group_records
    from benchmark.report.writer import group_statistics

    records = [_collapsed(r) if r["method"] == "ncl" else copy.deepcopy(r) for r in report_records]
    (group,), _ = group_records(records)
    stats = group_statistics(group)
    comparisons, left_out = measuring_comparisons(stats, "none")
    rows = by_label(records)
    expected = sorted(label for label in rows if label != "none" and backbone_flag(rows[label]))
    assert "ncl" in expected and left_out == expected  # the tiny fixture's das cells may be flagged too
    assert not set(left_out) & {c.label for c in comparisons}
    ncl = [r for r in records if r["method"] == "ncl"]
    assert backbone_flag(ncl) == "not measuring the backbone: 6 of 6 final cells"  # 3 seeds x 2 tasks
    reading = "\n".join(end_task_reading(stats))
    assert "Not compared with `none`: " + ", ".join(f"`{label}`" for label in expected) in reading
    records = [_collapsed(r) if r["method"] == "none" else copy.deepcopy(r) for r in report_records]
    (group,), _ = group_records(records)
    stats = group_statistics(group)
    assert measuring_comparisons(stats, "none")[0] == []
    assert _end_tasks(stats, "none") == [
        "on the end tasks no verdict against no DAP (`none`): the cells compared do not measure the backbone"
    ]


def _beside_record(label: str, seed: int, tuned: float, flags: dict[str, str]) -> dict:
    """A record reduced to what the fine-tune-beside section reads, with its fine-tuned cells' flags."""
    return {
        "method_label": label,
        "seed": seed,
        "sequence": ["a", "b"],
        "capabilities": {},
        "config": {"finetune": {"protocol": "linear_probe"}},
        "summary": {"macro_f1": {"final": 0.45}},
        "end_tasks_beside": {"finetune": {"summary": {"macro_f1": {"final": tuned}}, "backbone_flags": flags}},
    }


def test_the_protocol_beside_states_no_verdict_from_flagged_cells():
    from benchmark.report.beside import _section, beside_rows, unmeasured_note

    collapsed = {"1/0": "predicts 2 of the 6 classes in its test set"}
    none = [_beside_record("none", s, t, {}) for s, t in enumerate((0.33, 0.34, 0.35))]
    ncl = [_beside_record("ncl", s, t, {}) for s, t in enumerate((0.45, 0.46, 0.47))]
    measured = _section(none + ncl, "finetune")
    assert " resolved |" in next(line for line in measured if line.startswith("| `ncl` |"))
    flagged = _section(none + ncl[:2] + [_beside_record("ncl", 2, 0.47, collapsed)], "finetune")
    row = next(line for line in flagged if line.startswith("| `ncl` |"))
    assert "(no verdict: not measuring the backbone: 1 of 6 final cells)" in row
    assert not any("Beating `none`" in line or "No method beats" in line for line in flagged)
    rows = beside_rows(none + ncl[:2] + [_beside_record("ncl", 2, 0.47, collapsed)], "finetune")
    assert unmeasured_note(rows) == "no verdict: the cells of 1 of 1 rows (or of `none`) do not measure the backbone"
    assert unmeasured_note(beside_rows(none + ncl, "finetune")) == ""
    unmeasured_none = _section([_beside_record("none", 0, 0.33, collapsed), *none[1:], *ncl], "finetune")
    row = next(line for line in unmeasured_none if line.startswith("| `ncl` |"))
    assert "no verdict: none: not measuring the backbone: 1 of 6 final cells" in row
