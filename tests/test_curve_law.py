"""Issue #90: the learning-rate schedule's law fitted on a lower rung's within-domain curves predicts the top rung's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from benchmark.report.curve_law import (
    curve_law_markdown,
    fit_law,
    law_change,
    predict_curves,
    schedule_areas,
    stage_curves,
    stage_factors,
)
from benchmark.report.ladder import Ladder, Rung

SEQUENCE = ["a", "b", "c"]
OWN = np.array([-1.5, np.log(0.05), np.log(0.8), 0.002])
FORGET = np.array([0.4, np.log(0.03), np.log(1.0), 0.0])


def test_the_forward_area_sums_the_rates_and_the_annealing_area_their_drops_after_the_peak():
    s1, s2 = schedule_areas(np.ones(5))
    assert list(s1) == [0, 1, 2, 3, 4, 5] and not s2.any()  # a constant rate anneals nothing
    rising = schedule_areas(np.array([0.25, 0.5, 0.75, 1.0]))[1]
    assert not rising.any()  # warmup is not annealing
    decay = np.array([1.0, 0.75, 0.5, 0.25])
    s1, s2 = schedule_areas(decay, momentum=1.0)
    # with full momentum, S2 after k updates is the area between the peak and the rate: sum over i < k of (1 - rate_i)
    assert s1[-1] == pytest.approx(2.5) and list(s2) == pytest.approx([0, 0, 0.25, 0.75, 1.5])
    # without momentum it is the drop so far; Tissue et al.'s 0.999 sits just below full momentum
    assert list(schedule_areas(decay, momentum=0.0)[1]) == pytest.approx([0, 0, 0.25, 0.5, 0.75])
    assert 0.75 < schedule_areas(decay)[1][-1] < 1.5


def _record(steps: int, every: int, seed: int, own=OWN, noise: float = 0.003) -> dict:
    """A run of ``steps`` updates per domain (the DAS paper's linear schedule) whose curves follow the law: ``own``
    on the domain being trained, :data:`FORGET` on the domains before it and on general text, with seed noise."""
    record = {
        "run_id": f"r{steps}-{seed}",
        "method_label": "ncl",
        "sequence": SEQUENCE,
        "capabilities": {},
        "config": {"dap": {"steps": steps, "lr": 1e-4, "warmup_ratio": 0.1}, "schedule": {"name": "per_domain_linear"}},
        "domains": [],
    }
    rng = np.random.default_rng(seed)
    marks = list(range(0, steps + 1, every))
    for t, factors in enumerate(stage_factors(record)):
        s1, s2 = (area[marks] for area in schedule_areas(factors))
        losses = {}
        for k, name in enumerate([*SEQUENCE, "general"]):
            params = own if k == t else FORGET if k < t or name == "general" else np.array([0.0, 0.0, 0.0, 0.0])
            losses[name] = list(5.0 + law_change(params, s1, s2) + noise * rng.standard_normal(len(marks)))
        record["domains"].append({"curve": {"steps": marks, "losses": losses}})
    return record


class _Stats:
    """What the law reads of a rung's statistics: its records, and the cache of readings derived once."""

    def __init__(self, records):
        self.records, self._derived = records, {}

    def derived(self, name, compute):
        if name not in self._derived:
            self._derived[name] = compute()
        return self._derived[name]


def _ladder(lower: list[dict], top: list[dict]) -> Ladder:
    rungs = [
        Rung(_Stats(records), f"g{steps}", steps, steps * 1024)
        for steps, records in ((lower[0]["config"]["dap"]["steps"], lower), (288, top))
    ]
    return Ladder(rungs, "key")


def test_the_stage_curves_are_changes_from_each_stages_start_on_the_areas_of_its_schedule():
    curves = stage_curves(_record(24, 4, 0, noise=0.0))
    assert [c.stage for c in curves["own domain"]] == [0, 1, 2]
    assert [c.stage for c in curves["earlier domains"]] == [1, 2]  # the first domain has none before it
    first = curves["own domain"][0]
    assert first.change[0] == 0 and first.s1[0] == 0 and len(first.s1) == 7
    assert first.change[1:] == pytest.approx(law_change(OWN, first.s1[1:], first.s2[1:]))
    assert stage_curves({**_record(24, 4, 0), "capabilities": {"joint_training": True}}) == {}


def test_a_law_seen_saturating_at_the_lower_rung_predicts_the_top_rung_within_its_interval():
    lower = [_record(96, 8, seed) for seed in (1, 2, 3)]
    top = [_record(288, 24, seed) for seed in (4, 5)]
    found = {p.held_out: p for p in predict_curves(_ladder(lower, top))}
    assert set(found) == {"own domain", "earlier domains", "general text"}
    own = found["own domain"]
    assert own.fit.identified and own.seeds == (3, 2) and own.fitted_on == 96
    assert own.error == pytest.approx(0.0, abs=0.02) and own.holds()
    assert abs(own.naive - own.measured) > 0.2  # no change misses what the longer schedule learns
    assert all(abs(p.error) < 0.03 for p in found.values())


def test_a_lower_rung_that_shows_no_saturation_leaves_the_law_unidentified_and_the_report_says_so():
    linear = np.array([-8.0, np.log(0.0015), np.log(1.0), 0.0])  # nearly a line over 24 updates
    lower = [_record(24, 4, seed, own=linear, noise=0.03) for seed in (1, 2, 3)]
    top = [_record(288, 24, seed) for seed in (4, 5)]
    own = next(p for p in predict_curves(_ladder(lower, top)) if p.held_out == "own domain")
    assert not own.fit.identified
    text = "\n".join(curve_law_markdown(_ladder(lower, top)))
    assert "| `ncl` | own domain | 24 (3; top 2) |" in text and "| no |" in text
    # the form describes the top rung's curves; only 24 updates cannot fix it
    assert own.top_fit.identified and own.top_fit.rmse < 0.01
    assert abs(own.error) > 0.5 and not own.holds()
    assert "0 of 3 fits identified the law" in text


def test_the_summary_says_whether_the_law_beats_no_change():
    from benchmark.report.words import say

    assert "does not beat no change" in say("ladder.md.j2", "curve_law_summary", 12, 0.98, 0.26, 3, 2)
    assert "The law beats no change" in say("ladder.md.j2", "curve_law_summary", 12, 0.05, 0.26, 12, 12)


def test_the_fit_recovers_the_laws_parameters_from_noiseless_curves():
    record = _record(288, 12, 0, noise=0.0)
    fit = fit_law(stage_curves(record)["own domain"])
    s1, s2 = np.array([10.0, 100.0, 400.0]), np.array([0.0, 20.0, 80.0])
    for stage in (0, 1, 2):
        assert fit.at(stage, s1, s2) == pytest.approx(law_change(OWN, s1, s2), abs=1e-4)
    assert fit.rmse < 1e-6 and fit.identified


def test_each_stage_keeps_its_own_amplitude_under_one_shared_shape():
    no_annealing = np.r_[OWN[:3], 0.0]  # C shared, so a stage's whole change scales with B only where C is 0
    curves = stage_curves(_record(288, 12, 0, own=no_annealing, noise=0.0))["own domain"]
    fit = fit_law(curves)
    scaled = fit_law([replace(c, change=c.change * (1 + c.stage)) for c in curves])  # shifts of other sizes
    assert [scaled.amplitudes[t] for t in (0, 1, 2)] == pytest.approx([OWN[0] * (1 + t) for t in (0, 1, 2)], rel=1e-3)
    assert scaled.shape == pytest.approx(fit.shape, abs=1e-3) and scaled.rmse < 1e-6


def test_a_ladder_whose_top_rung_measured_no_curves_has_no_section():
    lower = [_record(24, 4, 1)]
    top = [{**_record(288, 24, 4), "domains": [{} for _ in SEQUENCE]}]
    assert predict_curves(_ladder(lower, top)) == [] and curve_law_markdown(_ladder(lower, top)) == []
