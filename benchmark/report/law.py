"""A budget law fitted on a ladder's lower rungs, predicting its top rung before it is read (issue #90).

The law: a row's metric m (forgetting, general rise, plasticity, final gain; nats) is linear in the logarithm of the
DAP updates per domain N, m(N) = a + b ln N. It is the first-order form of the loss-against-compute relations
(a power law in N is linear in ln N over a narrow range of budgets) and, unlike a power law, holds for metrics of
either sign (an oracle's forgetting is negative). Two rungs fix it; the third tests it. Fitted per row on the means
of the two rungs below the top and read at the top rung's N, it is compared with what the top rung measured; the
interval of the error comes from the ladder's joint bootstrap of seeds and evaluation sample at all three rungs
(:func:`benchmark.report.ladder.replicates`), so it holds the noise of the fit and of the measurement alike. The
naive predictor, "the middle rung's value", is scored beside it: a law that does not beat it predicts nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmark.report.ladder import LadderReading
from benchmark.report.words import say, say_lines

LADDER = "ladder.md.j2"
"""The template that holds the law section's words (beside the ladder's)."""

LAW_METRICS = ("forgetting", "general rise", "plasticity", "final gain")
"""The held-out-loss metrics the law predicts (nats)."""

PAPER_TOKENS_PER_DOMAIN = 2580 * 248 * 164
"""The paper's DAP budget per domain in tokens (the ``paper`` profile: 2580 updates of 248 x 164 tokens; the report
reads records only, so it holds the number, and ``tests/test_law.py`` holds it equal to the profile's)."""


class CheckedPrediction:
    """What a prediction checked against its measurement offers (``predicted``, ``measured``, the prediction of no
    change ``naive`` and the 95% interval ``low``-``high`` of their difference, set by the dataclass that mixes it in):
    its error and whether the interval holds zero."""

    predicted: float
    measured: float
    naive: float
    low: float
    high: float

    @property
    def error(self) -> float:
        """Predicted minus measured."""
        return self.predicted - self.measured

    def holds(self) -> bool:
        """Whether the error's interval holds zero: the prediction is within what the noise allows."""
        return self.low <= 0 <= self.high


@dataclass(frozen=True)
class Prediction(CheckedPrediction):
    """One row's metric at the top rung: as the law fitted on the two rungs below predicts it, and as measured."""

    label: str
    metric: str
    predicted: float
    measured: float
    naive: float
    """The middle rung's value: the prediction of "no change"."""
    low: float
    high: float
    """95% bootstrap interval of ``predicted - measured``."""


def law_at(steps: tuple[float, float], values: tuple[np.ndarray | float, np.ndarray | float], target: float):
    """The value at ``target`` updates of the law m = a + b ln N through two rungs (``steps``, ``values``; arrays of
    replicates alike)."""
    (n0, n1), (m0, m1) = steps, values
    return m1 + (m1 - m0) * math.log(target / n1) / math.log(n1 / n0)


@dataclass(frozen=True)
class _Fit:
    """One row's law on one metric, fitted through the two rungs below the top and read at the top rung's budget."""

    metric: str
    label: str
    values: tuple
    """The row's means at the lower, middle and top rung (None where a rung lacks it)."""
    replicates: tuple
    """Its bootstrap replicates at the same rungs (None where there are none)."""
    predicted: float
    drawn: np.ndarray | None
    """The law through the lower rungs' replicates, read at the top (None without replicates at both)."""


def _fits(reading: LadderReading, top_untrained: bool) -> list[_Fit]:
    """Per metric of :data:`LAW_METRICS`, the law of every row the two rungs below the top measured and trained
    (``top_untrained``: also leave out the rows flagged untrained at the top rung); none for fewer than three rungs."""
    rungs = reading.ladder.rungs
    if len(rungs) < 3:
        return []
    low, mid, top = len(rungs) - 3, len(rungs) - 2, len(rungs) - 1
    untrained = set().union(*(rungs[i].untrained for i in ((low, mid, top) if top_untrained else (low, mid))))
    steps, target = (float(rungs[low].steps), float(rungs[mid].steps)), rungs[top].steps
    out = []
    for metric in LAW_METRICS:
        means, samples = reading.means.get(metric, {}), reading.samples.get(metric)
        for label, values in sorted(means.items()):
            chosen = (values[low], values[mid], values[top])
            if label in untrained or None in chosen[:2]:
                continue
            replicated = tuple(samples[i].get(label) for i in (low, mid, top)) if samples else (None,) * 3
            drawn = None if any(r is None for r in replicated[:2]) else law_at(steps, replicated[:2], target)
            predicted = law_at(steps, chosen[:2], target)
            out.append(_Fit(metric, label, chosen, replicated, predicted, drawn))
    return out


def _percentiles(values: np.ndarray | None) -> tuple[float, float]:
    """The 95% interval of bootstrap draws (NaN without them)."""
    return (math.nan, math.nan) if values is None else tuple(float(v) for v in np.percentile(values, [2.5, 97.5]))


def predict_top(reading: LadderReading) -> list[Prediction]:
    """Per row measured at the top rung and the two rungs below it, and per metric of :data:`LAW_METRICS`, the law's
    prediction of the top rung from those two, against what the top rung measured (rows left out as untrained at any
    of the three rungs, and rows whose metric is 0 at every rung, no DAP's, are not predicted). Nothing for a ladder
    of fewer than three rungs."""
    out = []
    for fit in _fits(reading, top_untrained=True):
        low, mid, top = fit.values
        if top is None or not any(fit.values):  # no DAP (all zero) has nothing to predict
            continue
        errors = None if fit.drawn is None or fit.replicates[2] is None else fit.drawn - fit.replicates[2]
        out.append(Prediction(fit.label, fit.metric, fit.predicted, top, mid, *_percentiles(errors)))
    return out


@dataclass(frozen=True)
class Forecast:
    """One row's metric at the top rung, predicted by the law from the two rungs below, where the top rung has not
    measured the row yet: a prediction made before the measurement, to be checked when it lands."""

    label: str
    metric: str
    predicted: float
    low: float
    high: float
    """95% bootstrap interval of the prediction (seeds and evaluation sample at the two rungs it is fitted on)."""


def forecast_top(reading: LadderReading) -> list[Forecast]:
    """Per row measured at the two rungs below the top but not at the top, and per metric of :data:`LAW_METRICS`,
    the law's prediction at the top rung with its interval (rows left out as untrained at either lower rung, and rows
    whose metric is 0 at both, are not forecast). What a plugin author's own rows at the lower rungs get before they
    pay for the top rung; nothing for a ladder of fewer than three rungs."""
    return [
        Forecast(fit.label, fit.metric, fit.predicted, *_percentiles(fit.drawn))
        for fit in _fits(reading, top_untrained=False)
        if fit.values[2] is None and any(fit.values[:2])
    ]


@dataclass(frozen=True)
class Beyond:
    """What the law says of one metric beyond the top rung, at the paper's budget: whether it may be stated (it beats
    no change and every row's error interval holds zero), and, where it may, each row's extrapolated value."""

    metric: str
    rows: int
    within: int
    """Rows whose error interval holds zero (:meth:`Prediction.holds`)."""
    beats_no_change: bool
    values: tuple[tuple[str, float], ...] = ()
    """``(label, value at the paper's budget)`` where the law may be stated, else empty."""

    @property
    def stated(self) -> bool:
        """Whether the law is tight enough on this metric to be read beyond the top rung."""
        return self.beats_no_change and self.within == self.rows


def mean_errors(predictions: list[CheckedPrediction]) -> tuple[float, float]:
    """The mean absolute error of a law's predictions and of predicting no change (each prediction's ``naive``: the
    budget law's middle rung, the curve law's fitted rung)."""
    law = float(np.mean([abs(p.error) for p in predictions]))
    return law, float(np.mean([abs(p.naive - p.measured) for p in predictions]))


def paper_updates(reading: LadderReading) -> float:
    """The paper's budget per domain in the ladder's updates (its top rung's tokens per update)."""
    top = reading.ladder.rungs[-1]
    return PAPER_TOKENS_PER_DOMAIN / (top.tokens_per_domain / top.steps)


def beyond_top(reading: LadderReading, predictions: list[Prediction]) -> list[Beyond]:
    """Per metric the law predicted, whether it may be read at the paper's budget and, where it may, each row's value
    there from the law through the two highest rungs (the budgets nearest to it)."""
    rungs = reading.ladder.rungs
    target, steps = paper_updates(reading), (float(rungs[-2].steps), float(rungs[-1].steps))
    out = []
    for metric in LAW_METRICS:
        found = [p for p in predictions if p.metric == metric]
        if not found:
            continue
        law, naive = mean_errors(found)
        beyond = Beyond(metric, len(found), sum(p.holds() for p in found), bool(law < naive))
        if beyond.stated:
            means = reading.means[metric]
            values = tuple((p.label, law_at(steps, (means[p.label][-2], means[p.label][-1]), target)) for p in found)
            beyond = Beyond(metric, beyond.rows, beyond.within, True, values)
        out.append(beyond)
    return out


def law_markdown(reading: LadderReading) -> list[str]:
    """The ladder's law section (:func:`predict_top`), as the leaderboard and the site show it: per metric, how well
    the law fitted on the two rungs below the top predicts it, each row's prediction, measurement and error interval,
    the rows the top rung has not measured yet with their forecast (:func:`forecast_top`), and whether the law is read
    at the paper's budget (:func:`beyond_top`); empty for a ladder of fewer than three rungs."""
    predictions = predict_top(reading)
    if not predictions:
        return []
    rungs = reading.ladder.rungs
    forecasts = forecast_top(reading)
    lines = say_lines(LADDER, "law_intro", rungs[-3:-1], rungs[-1])
    for metric in LAW_METRICS:
        found = [p for p in predictions if p.metric == metric]
        if found:
            law, naive = mean_errors(found)
            lines.append(say(LADDER, "law_metric_row", metric, len(found), law, naive, sum(p.holds() for p in found)))
    lines += ["", *say_lines(LADDER, "law_rows_header")]
    lines += [say(LADDER, "law_row", p) for p in predictions]
    if forecasts:
        lines += ["", *say_lines(LADDER, "forecast_header", rungs[-1])]
        lines += [say(LADDER, "forecast_row", f) for f in forecasts]
    updates = paper_updates(reading)
    lines += ["", say(LADDER, "law_beyond", updates, updates / rungs[-1].steps, beyond_top(reading, predictions))]
    return [*lines, ""]
