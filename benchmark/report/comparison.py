"""The one comparison behind every verdict the report prints (issue #85): the group tables, the end tasks against no
DAP and the budget ladder's kept and flipped verdicts all decide through :func:`paired_test` (or :func:`welch_test`
where two rows share no seeds) and :func:`benjamini_hochberg` over the family the verdict belongs to.

The test is a t-test on the mean difference whose standard error adds the two sources a reader's conclusion must
survive: the seeds (the spread of the per-seed differences, s^2 / n) and, where the records keep their evaluation
samples, the evaluation sample they were all measured on (the variance of the mean difference over bootstrap
resamples of held-out chunks or test examples, shared by both rows). Its reference distribution is Student's t with
n - 1 degrees of freedom, which keeps the test's size at or below the nominal level at 3-5 seeds (the second part has
far more degrees of freedom than the first, so n - 1 is the conservative count); the calibration tests
(``tests/test_comparison_calibration.py``) measure that size on simulated null groups with the committed groups'
seed correlations.

A difference not resolved says how small a difference its seeds could have resolved: :meth:`Test.resolvable`, the
difference the same test finds with 80% power at its standard error and degrees of freedom (non-central t), so "not
separated" reads as "equal within X", or as "too few seeds" when X is large.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
POWER = 0.8


@dataclass(frozen=True)
class Test:
    """One comparison of a row with another: the mean difference, its standard error, degrees of freedom, p-value."""

    mean: float
    se: float
    df: int
    p: float

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """The t interval of the mean difference (the point always inside it)."""
        from scipy.stats import t

        half = float(t.ppf(0.5 + level / 2, self.df)) * self.se if self.df > 0 else math.inf
        return self.mean - half, self.mean + half

    def resolvable(self, alpha: float = ALPHA, power: float = POWER) -> float:
        """The smallest |difference| this test resolves with probability ``power`` (two-sided, level ``alpha``)."""
        return resolvable_difference(self.se, self.df, alpha, power)


def paired_test(differences: np.ndarray, eval_se: float | None = None) -> Test | None:
    """The t-test of the mean of per-seed ``differences`` (row minus reference, paired by seed and order), its
    standard error sqrt(s^2 / n + eval_se^2); None for fewer than two pairs (no seed spread is measured)."""
    diffs = np.asarray(differences, dtype=float)
    n = len(diffs)
    if n < 2:
        return None
    mean = float(diffs.mean())
    se = math.sqrt(float(diffs.var(ddof=1)) / n + (eval_se or 0.0) ** 2)
    return Test(mean, se, n - 1, _p_value(mean, se, n - 1))


def welch_test(a: np.ndarray, b: np.ndarray, eval_se: float | None = None) -> Test | None:
    """Welch's t-test of mean(a) - mean(b) for rows that share no seeds (Welch-Satterthwaite degrees of freedom,
    rounded down), the evaluation sample's variance added as in :func:`paired_test`; None below two seeds a row."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    seed_var = float(va + vb)
    df = int(seed_var**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))) if seed_var > 0 else len(a) + len(b) - 2
    mean, se = float(a.mean() - b.mean()), math.sqrt(seed_var + (eval_se or 0.0) ** 2)
    return Test(mean, se, max(df, 1), _p_value(mean, se, max(df, 1)))


def _p_value(mean: float, se: float, df: int) -> float:
    from scipy.stats import t

    if se == 0:
        return 1.0 if mean == 0 else 0.0
    return float(2 * t.sf(abs(mean) / se, df))


def benjamini_hochberg(p_values: list[float]) -> list[float]:
    """Benjamini-Hochberg q-values of a family of p-values (in their order)."""
    from scipy.stats import false_discovery_control

    return [float(q) for q in false_discovery_control(p_values)] if p_values else []


def resolvable_difference(se: float, df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The difference a two-sided t-test at level ``alpha`` with standard error ``se`` and ``df`` degrees of freedom
    resolves with probability ``power`` (non-central t; infinite with no degrees of freedom)."""
    from scipy.optimize import brentq
    from scipy.stats import nct, t

    if df < 1 or not math.isfinite(se):
        return math.inf
    if se == 0:
        return 0.0
    critical = float(t.ppf(1 - alpha / 2, df))

    def shortfall(ncp: float) -> float:
        wrong_side = float(nct.cdf(-critical, df, ncp))  # negligible, and NaN in scipy's far tail
        return float(nct.sf(critical, df, ncp)) + (0.0 if math.isnan(wrong_side) else wrong_side) - power

    upper = 1.0
    while shortfall(upper) < 0:  # widen the bracket step by step: nct's tail is not finite at huge ncp
        upper *= 2
    return float(brentq(shortfall, 0.0, upper)) * se
