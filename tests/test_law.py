"""Issue #90: a law fitted on a ladder's two lower rungs predicts the top rung, and the report says how well."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmark.report.ladder import Ladder, LadderReading, Rung
from benchmark.report.law import forecast_top, law_at, law_markdown, predict_top


def test_the_law_is_linear_in_the_log_of_the_updates():
    # m = 0.1 + 0.05 ln N through N = 24 and 96, read at 288
    values = tuple(0.1 + 0.05 * math.log(n) for n in (24, 96))
    assert law_at((24, 96), values, 288) == pytest.approx(0.1 + 0.05 * math.log(288))
    assert law_at((24, 96), (0.2, 0.2), 10_000) == pytest.approx(0.2)  # a flat row stays flat
    replicated = law_at((24, 96), (np.array([0.1, 0.2]), np.array([0.2, 0.2])), 288)
    assert replicated.shape == (2,) and replicated[1] == pytest.approx(0.2)


class _NoCurves:
    """A rung's statistics as the laws read them, with no records: no curves for the schedule's law to fit."""

    records: list = []

    def derived(self, name, compute):
        return compute()


def _reading(measured_top: float, spread: float) -> LadderReading:
    """A three-rung ladder whose ``ncl`` forgetting follows the law exactly up to 96 updates, measured at 288 as
    ``measured_top``, with seed-and-sample replicates of ``spread``; ``none`` has zeros throughout."""
    rng = np.random.default_rng(0)
    rungs = [Rung(stats=_NoCurves(), key=f"g{n}", steps=n, tokens_per_domain=n * 1024) for n in (24, 96, 288)]
    law = {n: 0.1 + 0.05 * math.log(n) for n in (24, 96)}
    means = {"forgetting": {"ncl": [law[24], law[96], measured_top], "none": [0.0, 0.0, 0.0]}}
    samples = {
        "forgetting": [
            {"ncl": value + spread * rng.standard_normal(1000), "none": np.zeros(1000)}
            for value in means["forgetting"]["ncl"]
        ]
    }
    return LadderReading(Ladder(rungs, "key"), [], [], means, samples)


def test_a_top_rung_on_the_law_is_predicted_within_its_interval_and_one_off_it_is_not():
    on_law = 0.1 + 0.05 * math.log(288)
    (held,) = predict_top(_reading(on_law, 0.01))  # none (zero at every rung) has nothing to predict
    assert held.label == "ncl" and held.error == pytest.approx(0.0, abs=1e-12) and held.holds()
    (missed,) = predict_top(_reading(on_law + 0.2, 0.01))
    assert missed.error == pytest.approx(-0.2) and not missed.holds()
    assert missed.naive == pytest.approx(0.1 + 0.05 * math.log(96))
    table = "\n".join(law_markdown(_reading(on_law + 0.2, 0.01)))
    assert "| forgetting | 1 | 0.200 |" in table and "0 of 1 |" in table
    assert "| `ncl` | forgetting |" in table


def test_a_ladder_of_two_rungs_predicts_nothing():
    reading = _reading(0.3, 0.01)
    reading.ladder.rungs = reading.ladder.rungs[:2]
    assert predict_top(reading) == [] and law_markdown(reading) == []


def test_the_papers_budget_is_the_paper_profiles():
    from benchmark.config import profile_config
    from benchmark.report.law import PAPER_TOKENS_PER_DOMAIN

    dap = profile_config("paper").dap
    assert PAPER_TOKENS_PER_DOMAIN == dap.steps * dap.batch_size * dap.seq_len


def test_the_law_is_read_at_the_papers_budget_only_where_it_held_at_the_top_rung():
    from benchmark.report.law import PAPER_TOKENS_PER_DOMAIN, beyond_top

    on_law = 0.1 + 0.05 * math.log(288)
    reading = _reading(on_law, 0.01)
    (held,) = beyond_top(reading, predict_top(reading))
    paper = PAPER_TOKENS_PER_DOMAIN / 1024  # the ladder's updates are of 1024 tokens
    assert held.stated and held.values[0][0] == "ncl"
    assert held.values[0][1] == pytest.approx(0.1 + 0.05 * math.log(paper))
    text = "\n".join(law_markdown(reading))
    assert f"`ncl` {0.1 + 0.05 * math.log(paper):.3f}" in text and "not predicted: none" in text
    missed = _reading(on_law + 0.2, 0.01)
    (off,) = beyond_top(missed, predict_top(missed))
    assert not off.stated and off.values == ()
    assert "No metric qualifies, so no prediction is stated (forgetting: 0 of 1 rows" in "\n".join(law_markdown(missed))


def test_the_site_shows_the_law_on_the_page_of_the_ladders_top_rung(report_records):
    """The leaderboard's law section appears on the group page of the ladder's top rung, as a table, and on no other
    group's page."""
    from benchmark.report.groups import group_records
    from benchmark.report.site import site_files
    from benchmark.report.writer import group_statistics

    (group,), _ = group_records(report_records)
    sections = [(group, group_statistics(group), {})]
    reading = _reading(0.1 + 0.05 * math.log(288) + 0.2, 0.01)
    page = f"group-{group.key}.html"
    assert '<div class="law">' not in site_files(sections, [reading], {})[page]  # its top rung is another group
    reading.ladder.rungs[-1].key = group.key
    law = site_files(sections, [reading], {})[page].split('<div class="law">')[1].split("</div>")[0]
    assert "Predicting 288 updates from 24 and 96" in law and "<table>" in law and "<td>0 of 1</td>" in law
    assert "Beyond the top rung" in law


def test_a_row_the_top_rung_has_not_measured_is_forecast_with_its_interval():
    """A plugin's row run at the two lower rungs only: the law's forecast at the top rung, stated before the top rung
    measures it, with the interval of its replicates at the two rungs it is fitted on."""
    reading = _reading(0.1 + 0.05 * math.log(288), 0.01)
    rng = np.random.default_rng(1)
    lower = {n: 0.2 + 0.03 * math.log(n) for n in (24, 96)}
    reading.means["forgetting"]["mine"] = [lower[24], lower[96], None]
    for i, n in enumerate((24, 96)):
        reading.samples["forgetting"][i]["mine"] = lower[n] + 0.01 * rng.standard_normal(1000)
    reading.samples["forgetting"][2]["mine"] = None
    (forecast,) = forecast_top(reading)  # ncl is measured at the top (predicted, not forecast); none is all zero
    assert forecast.label == "mine" and forecast.predicted == pytest.approx(0.2 + 0.03 * math.log(288))
    assert forecast.low < forecast.predicted < forecast.high and forecast.high - forecast.low < 0.2
    assert [p.label for p in predict_top(reading)] == ["ncl"]  # the unmeasured row is not scored as a prediction
    text = "\n".join(law_markdown(reading))
    assert "Not measured at 288 updates yet" in text
    assert f"| `mine` | forgetting | {forecast.predicted:.3f} [{forecast.low:.3f}, {forecast.high:.3f}] |" in text
    reading.ladder.rungs[1].untrained["mine"] = "untrained"  # a row a lower budget did not train is not forecast
    assert forecast_top(reading) == []
