"""The learning-rate schedule's law fitted on the within-domain curves of a lower rung, predicting the top rung's
curves before they are read (issue #90).

Wang et al. (ICML 2025, "Learning dynamics in continual pre-training for large language models") describe a held-out
loss during continual pre-training through two areas of the learning-rate schedule: the forward area S1 (the sum of
the rates so far; how far training has moved) and the annealing area S2 (Tissue et al., 2024: the rate's drops since
its peak, each kept with momentum, summed; what annealing has won back), with a distribution-shift term that saturates
in S1. Within stage t (one domain), relative to where that domain started, the form fitted here is

    dL(s) = B_t (1 - (1 + E S1(s))^-beta) - C S2(s)

with S1 and S2 in updates at the peak rate (the rate's factor of ``dap.lr``, as the runner schedules it). B_t is the
change that stage's shift tends to (negative on the domain being trained, positive on what it forgets; one per stage,
as Wang et al. fit one per transition: each pair of domains is its own shift), E and beta how fast, C >= 0 what
annealing wins back, shared by the stages. It is fitted per row and per held-out set (the domain being trained, the
mean of the domains trained before it, general text) on the seed means of every stage's curve at the highest rung
below the top that measured curves (``dap.eval_every``), then read at the end of each top-rung stage through that
stage's own areas: the top rung's schedule differs in length, so its areas differ, which is what the law is for.
The target is the set's change from a domain's start to its end, averaged over the stages; the error's 95% interval
resamples the seeds at both rungs (the lower rung's refitted); "no change", the lower rung's own change, is scored
beside it. A fit with a parameter at its bound has not pinned the law down (where a lower rung's curves show no
saturation they fix little more than the product B E, and the law then extrapolates nearly linearly in S1): the table
says so, and sets beside it the same form fitted on the top rung's own curves, so that a form that cannot describe
the curves is told apart from one the lower rung cannot identify.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmark.report.ladder import Ladder
from benchmark.report.law import CheckedPrediction, mean_errors
from benchmark.report.statistics import named_generator
from benchmark.report.words import say, say_lines

LADDER = "ladder.md.j2"
"""The template that holds the section's words (beside the ladder's and the budget law's)."""

SETS = ("own domain", "earlier domains", "general text")
"""The held-out sets the law is fitted on: the domain being trained, the mean of those trained before it, general."""

MOMENTUM = 0.999
"""The momentum of the annealing area (Tissue et al., 2024, whose value Wang et al. keep)."""

BOUNDS = (np.array([-10.0, math.log(1e-4), math.log(0.1), 0.0]), np.array([10.0, math.log(10.0), math.log(3.0), 1.0]))
"""Bounds of the fitted parameters (B nats, ln E, ln beta, C nats per update): a change within +-10 nats, E from 1e-4 to
10 per update, beta from 0.1 to 3, C from 0 to 1 nat per update of annealing area."""

REPLICATES = 200
"""Seed resamples of each row's fit and measurement."""


def schedule_areas(factors: np.ndarray, momentum: float = MOMENTUM) -> tuple[np.ndarray, np.ndarray]:
    """The forward area S1 and the annealing area S2 after 0, 1, ..., n updates of a stage whose rate at each update is
    ``factors`` (of the peak rate): S1 sums the rates; S2 sums, from the peak on, m_i = momentum m_(i-1) + the drop of
    the rate at update i (warmup adds nothing: it is not annealing)."""
    factors = np.asarray(factors, dtype=float)
    s1 = np.concatenate([[0.0], np.cumsum(factors)])
    s2, m, total = np.zeros(len(factors) + 1), 0.0, 0.0
    for i in range(int(np.argmax(factors)) + 1, len(factors)):
        m = momentum * m + (factors[i - 1] - factors[i])
        total += m
        s2[i + 1] = total
    return s1, s2


def stage_factors(record: dict) -> list[np.ndarray] | None:
    """Each stage's learning-rate factors (of ``dap.lr``) as the runner schedules them; None for a record whose stages
    are not one schedule per domain in sequence (joint training, retraining on every seen domain, no pre-training)."""
    from benchmark.engine.recipe import recorded_learning_rates

    caps = record["capabilities"]
    if not caps.get("pretrains", True) or caps.get("joint_training") or caps.get("retrains_on_seen"):
        return None
    dap = record["config"]["dap"]
    rates = np.asarray(recorded_learning_rates(record)) / float(dap["lr"])
    return np.split(rates, len(record["sequence"]))


@dataclass(frozen=True)
class StageCurve:
    """One held-out set's curve during one stage: the areas and the change of loss from the stage's start at each
    measured update."""

    stage: int
    s1: np.ndarray
    s2: np.ndarray
    change: np.ndarray


def stage_curves(record: dict) -> dict[str, list[StageCurve]]:
    """A record's curves per held-out set of :data:`SETS` (empty where it measured none, or its stages are not one
    schedule per domain)."""
    if not any(domain.get("curve") for domain in record["domains"]):
        return {}
    factors = stage_factors(record)
    if factors is None:
        return {}
    out: dict[str, list[StageCurve]] = {name: [] for name in SETS}
    for t, domain in enumerate(record["domains"]):
        curve = domain.get("curve")
        if not curve:
            continue
        s1, s2 = schedule_areas(factors[t])
        steps, losses = np.asarray(curve["steps"]), curve["losses"]
        earlier = [name for name in record["sequence"][:t] if name in losses]
        sets = {"own domain": losses.get(record["sequence"][t]), "general text": losses.get("general")}
        sets["earlier domains"] = np.mean([losses[n] for n in earlier], axis=0) if earlier else None
        for name, values in sets.items():
            if values is not None:
                values = np.asarray(values, dtype=float)
                out[name].append(StageCurve(t, s1[steps], s2[steps], values - values[0]))
    return out


@dataclass(frozen=True)
class LawFit:
    """The law fitted on one row's curves of one held-out set: an amplitude per stage (each domain shift its own B),
    one shape (E, beta, C) shared by every stage."""

    amplitudes: dict[int, float]
    """B per stage index."""
    shape: np.ndarray
    """ln E, ln beta, C."""
    rmse: float
    """Root mean square residual on the points fitted (nats)."""
    identified: bool
    """Whether no parameter sits at its bound (:data:`BOUNDS`)."""

    def at(self, stage: int, s1, s2):
        """The law's change of loss in ``stage`` at areas ``s1``, ``s2``."""
        return law_change(np.r_[self.amplitudes[stage], self.shape], s1, s2)

    def vector(self) -> np.ndarray:
        """The parameters as :func:`fit_law` optimises them (amplitudes in stage order, then the shape)."""
        return np.r_[[self.amplitudes[t] for t in sorted(self.amplitudes)], self.shape]


def law_change(params, s1, s2):
    """dL = B (1 - (1 + E S1)^-beta) - C S2 for ``params`` = (B, ln E, ln beta, C)."""
    b, log_e, log_beta, c = params
    return b * (1.0 - (1.0 + math.exp(log_e) * np.asarray(s1)) ** -math.exp(log_beta)) - c * np.asarray(s2)


def fit_law(curves: list[StageCurve], start: np.ndarray | None = None) -> LawFit:
    """The law fitted by bounded least squares on every stage's points after its start, one amplitude per stage
    (``start``: initial parameters as :meth:`LawFit.vector` orders them, e.g. a fit to warm-start a resample from)."""
    from scipy.optimize import least_squares

    stages = len(curves)
    low = np.r_[[BOUNDS[0][0]] * stages, BOUNDS[0][1:]]
    high = np.r_[[BOUNDS[1][0]] * stages, BOUNDS[1][1:]]
    change = np.concatenate([c.change[1:] for c in curves])

    def residuals(p: np.ndarray) -> np.ndarray:
        shape, amplitudes = p[stages:], p[:stages]
        fitted = [law_change(np.r_[b, shape], c.s1[1:], c.s2[1:]) for b, c in zip(amplitudes, curves, strict=True)]
        return np.concatenate(fitted) - change

    if start is None:
        start = np.r_[[float(np.clip(c.change[-1], -1, 1)) or 0.01 for c in curves], math.log(0.1), 0.0, 0.001]
    found = least_squares(residuals, np.clip(start, low + 1e-9, high - 1e-9), bounds=(low, high))
    at_bound = np.isclose(found.x, low, atol=1e-6) | np.isclose(found.x, high, atol=1e-6)
    # C at 0 is the law without annealing gain, not a bound the data pressed against
    at_bound[-1] = bool(np.isclose(found.x[-1], high[-1], atol=1e-6))
    amplitudes = {c.stage: float(b) for b, c in zip(found.x[:stages], curves, strict=True)}
    return LawFit(amplitudes, found.x[stages:], float(np.sqrt(np.mean(found.fun**2))), not bool(at_bound.any()))


def _mean_curves(runs: list[list[StageCurve]]) -> list[StageCurve]:
    """The seed mean of one set's stage curves (runs measured at the same updates)."""
    return [
        StageCurve(first.stage, first.s1, first.s2, np.mean([run[i].change for run in runs], axis=0))
        for i, first in enumerate(runs[0])
    ]


def _end_change(curves: list[StageCurve]) -> float:
    """A set's change from each stage's start to its end, averaged over the stages."""
    return float(np.mean([c.change[-1] for c in curves]))


@dataclass(frozen=True)
class CurvePrediction(CheckedPrediction):
    """One row's held-out set at the top rung: its mean change over a domain as the law fitted on a lower rung's
    curves predicts it, and as measured."""

    label: str
    held_out: str
    fitted_on: int
    """The updates per domain of the rung the law was fitted on."""
    seeds: tuple[int, int]
    """Runs with curves at the rung fitted on and at the top rung."""
    fit: LawFit
    top_fit: LawFit
    """The same form fitted on the top rung's own curves: whether it describes them at all (its RMSE), apart from
    whether the lower rung's curves identify it."""
    predicted: float
    measured: float
    naive: float
    """The fitted rung's own change: the prediction of "no change with the budget"."""
    low: float
    high: float
    """95% interval of ``predicted - measured`` over seed resamples at both rungs."""


def _curves_by_row(records: list[dict]) -> dict[str, list[dict[str, list[StageCurve]]]]:
    """Per row, the curves of each of its runs that measured them at the same updates as its first."""
    out: dict[str, list[dict[str, list[StageCurve]]]] = {}
    for record in sorted(records, key=lambda r: r["run_id"]):
        curves = stage_curves(record)
        if curves:
            out.setdefault(record["method_label"], []).append(curves)
    for label, runs in out.items():
        shape = [[len(c.change) for c in runs[0][name]] for name in SETS]
        out[label] = [run for run in runs if [[len(c.change) for c in run[name]] for name in SETS] == shape]
    return out


def predict_curves(ladder: Ladder) -> list[CurvePrediction]:
    """Per row with curves at the top rung and at a rung below it, and per held-out set, the law fitted on the
    highest such lower rung's curves against the top rung's (nothing for a ladder whose top rung measured none).
    Computed once per ladder (the leaderboard and the site both show it)."""
    return ladder.rungs[-1].stats.derived(f"curve law {ladder.key}", lambda: _predict_all(ladder))


def _predict_all(ladder: Ladder) -> list[CurvePrediction]:
    top = _curves_by_row(ladder.rungs[-1].stats.records)
    lower = [(rung.steps, _curves_by_row(rung.stats.records)) for rung in reversed(ladder.rungs[:-1])]
    out = []
    for label in sorted(top):
        fitted = next(((steps, rows[label]) for steps, rows in lower if label in rows), None)
        if fitted is None:
            continue
        steps, runs = fitted
        for name in SETS:
            fitted_on, measured = [r[name] for r in runs], [r[name] for r in top[label]]
            if fitted_on[0] and measured[0]:
                out.append(_predict(ladder.key, label, name, steps, fitted_on, measured))
    return out


def _predict(key: str, label: str, name: str, steps: int, fitted: list, measured: list) -> CurvePrediction:
    """One row's prediction of one set, with its seed-resampled error interval."""
    fitted_mean, measured_mean = _mean_curves(fitted), _mean_curves(measured)
    fit = fit_law(fitted_mean)
    ends = [(c.stage, c.s1[-1], c.s2[-1]) for c in measured_mean]

    def predicted(law: LawFit) -> float:
        return float(np.mean([law.at(stage, s1, s2) for stage, s1, s2 in ends]))

    rng = named_generator("curve-law", key, label, name)
    errors = []
    for _ in range(REPLICATES):
        low = [fitted[i] for i in rng.integers(len(fitted), size=len(fitted))]
        high = [measured[i] for i in rng.integers(len(measured), size=len(measured))]
        errors.append(predicted(fit_law(_mean_curves(low), fit.vector())) - _end_change(_mean_curves(high)))
    low, high = (float(v) for v in np.percentile(errors, [2.5, 97.5]))
    return CurvePrediction(
        label,
        name,
        steps,
        (len(fitted), len(measured)),
        fit,
        fit_law(measured_mean),
        predicted(fit),
        _end_change(measured_mean),
        _end_change(fitted_mean),
        low,
        high,
    )


def curve_law_markdown(ladder: Ladder) -> list[str]:
    """The section on the schedule's law (:func:`predict_curves`) as the leaderboard and the site show it: how it
    was fitted, each row's and set's prediction against the measurement and against no change, and the mean errors;
    empty where no row has curves at the top rung and below it."""
    predictions = predict_curves(ladder)
    if not predictions:
        return []
    law, naive = mean_errors(predictions)
    lines = say_lines(LADDER, "curve_law_intro", sorted({p.fitted_on for p in predictions}), ladder.rungs[-1].steps)
    lines += [say(LADDER, "curve_law_row", p) for p in predictions]
    identified = sum(p.fit.identified for p in predictions)
    held = sum(p.holds() for p in predictions)
    return [*lines, "", say(LADDER, "curve_law_summary", len(predictions), law, naive, held, identified), ""]
