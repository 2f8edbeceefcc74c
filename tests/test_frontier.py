"""Issue #86: the fine-tuning protocol is chosen from a measured frontier: per setting of the no-DAP records, the
fine-tuning noise over their seeds, the difference it lets two rows at 3 DAP seeds resolve, and its cost."""

from __future__ import annotations

import math

import pytest

from benchmark.report.comparison import resolvable_difference
from benchmark.report.frontier import frontier, frontier_markdown, protocol_points

FINETUNE = {"protocol": "linear_probe", "beside": "finetune", "lr": 3e-4, "epochs": {}, "default_epochs": 3.0}


def _none(seed: int, tuned: float, seconds: float, flags: dict | None = None, **finetune) -> dict:
    """A no-DAP record reduced to what the frontier reads (its fine-tuned cells beside a probe)."""
    return {
        "method_label": "none",
        "profile": "mini-pass",
        "seed": seed,
        "sequence": ["a", "b"],
        "capabilities": {},
        "environment": {"device": "cpu", "device_name": "cpu", "torch_threads": 1},
        "config": {"finetune": {**FINETUNE, "max_train_examples": 500, "max_test_examples": 300, **finetune}},
        "summary": {"macro_f1": {"final": 0.45}},
        "timing": {"phase_seconds": {"end_tasks": seconds}},
        "end_tasks_beside": {
            "finetune": {"summary": {"macro_f1": {"final": tuned}}, "backbone_flags": flags or {}},
        },
    }


def test_each_setting_is_one_point_whose_noise_is_the_spread_over_fine_tune_seeds():
    cheap = [_none(s, t, 600.0) for s, t in ((1, 0.30), (2, 0.34), (3, 0.32))]
    full = [_none(s, t, 3600.0, max_train_examples=None) for s, t in ((1, 0.50), (2, 0.51), (3, 0.52))]
    offset = [_none(4, 0.31, 600.0, seed_offset=7)]  # another fine-tune seed of the cheap setting: the same point
    points = protocol_points(cheap + full + offset)
    assert [p.seeds for p in points] == [4, 3]  # cheapest first
    assert points[0].hours == pytest.approx(600 / 3600) and points[1].hours == pytest.approx(1.0)
    assert points[1].macro_f1 == pytest.approx(51.0) and points[1].noise == pytest.approx(1.0)
    assert points[1].probe == pytest.approx(45.0)
    # two rows at 3 DAP seeds, fine-tuning noise independent between them: se = sqrt(2) sd / sqrt(3), 2 df
    assert points[1].resolvable == pytest.approx(resolvable_difference(math.sqrt(2) * 1.0 / math.sqrt(3), 2))


def test_the_frontier_keeps_what_no_cheaper_setting_beats_and_never_a_collapsed_one():
    noisy_cheap = [_none(s, t, 600.0) for s, t in ((1, 0.30), (2, 0.36), (3, 0.33))]
    quiet_dear = [_none(s, t, 3600.0, lr=3e-5) for s, t in ((1, 0.50), (2, 0.505), (3, 0.51))]
    noisy_dear = [_none(s, t, 7200.0, lr=1e-5) for s, t in ((1, 0.40), (2, 0.48), (3, 0.44))]
    collapsed = {"1/0": "predicts 2 of the 6 classes in its test set"}
    quiet_collapsed = [_none(s, 0.2, 60.0, collapsed, lr=1e-3) for s in (1, 2, 3)]
    points = protocol_points(noisy_cheap + quiet_dear + noisy_dear + quiet_collapsed)
    kept = {p.setting for p in frontier(points)}
    by_lr = {p.setting.split("lr ")[1].split(",")[0]: p.setting for p in points}
    assert kept == {by_lr["0.0003"], by_lr["3e-05"]}  # 1e-05 is dearer and noisier; 1e-03 does not measure
    table = "\n".join(frontier_markdown(points))
    assert "not measuring the backbone: 3 of 6 final cells" in table
    assert table.count("| yes |") == 2


def test_settings_of_other_profiles_or_machines_are_never_rivals():
    here = [_none(s, t, 3600.0) for s, t in ((1, 0.30), (2, 0.36), (3, 0.33))]
    elsewhere = [_none(s, t, 60.0) for s, t in ((1, 0.50), (2, 0.50), (3, 0.51))]
    for record in elsewhere:
        record["environment"] = {"device": "cuda", "device_name": "NVIDIA H200", "torch_threads": 1}
    assert len(frontier(protocol_points(here + elsewhere))) == 2
