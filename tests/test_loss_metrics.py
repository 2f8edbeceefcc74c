"""Loss-based continual metrics, checked against numbers computed by hand."""

import pytest

from benchmark.metrics import loss_metrics

DOMAINS = ("a", "b", "c")
BASE = {"a": 5.0, "b": 6.0, "c": 7.0, "general": 4.0}
# L[t][k]: row t = after stage t. Stage 1 forgets a by 0.5, stage 2 recovers a to 0.2 above its best.
AFTER = [
    {"a": 4.0, "b": 5.9, "c": 6.9, "general": 4.3},
    {"a": 4.5, "b": 5.0, "c": 6.8, "general": 4.6},
    {"a": 4.2, "b": 5.3, "c": 6.0, "general": 4.5},
]


def test_continual_run_by_hand():
    out = loss_metrics(BASE, AFTER, DOMAINS)
    # plasticity: ((5-4) + (6-5) + (7-6)) / 3 = 1
    assert out["plasticity"] == pytest.approx(1.0)
    # forgetting at the end: ((4.2-4.0) + (5.3-5.0)) / 2 = 0.25
    assert out["forgetting"] == pytest.approx(0.25)
    # stage 1: (4.5-4.0) / 1 = 0.5; stage 2: 0.25 -> worst 0.5
    assert out["max_forgetting"] == pytest.approx(0.5)
    # final gain: ((5-4.2) + (6-5.3) + (7-6.0)) / 3 = 0.8333
    assert out["final_gain"] == pytest.approx(2.5 / 3)
    assert out["general_rise"] == pytest.approx(0.5)


def test_per_domain_method_reads_the_diagonal_and_has_no_forgetting():
    out = loss_metrics(BASE, AFTER, DOMAINS, independent_per_domain=True)
    assert out["final_gain"] == pytest.approx(1.0)  # final model of k is row k
    assert out["forgetting"] is None and out["max_forgetting"] is None
    assert out["general_rise"] == pytest.approx((0.3 + 0.6 + 0.5) / 3)  # mean over the per-domain models


def test_joint_training_has_only_its_final_row():
    out = loss_metrics(BASE, [None, None, AFTER[-1]], DOMAINS, final_row_only=True)
    assert out["plasticity"] is None and out["forgetting"] is None
    assert out["final_gain"] == pytest.approx(2.5 / 3)
    assert out["general_rise"] == pytest.approx(0.5)


def test_no_dap_baseline_is_zero_everywhere_and_general_is_optional():
    base = {k: v for k, v in BASE.items() if k != "general"}
    out = loss_metrics(base, [base, base, base], DOMAINS)
    assert out == {
        "plasticity": 0.0,
        "forgetting": 0.0,
        "max_forgetting": 0.0,
        "final_gain": 0.0,
        "general_rise": None,
    }


def test_single_domain_has_no_forgetting():
    out = loss_metrics(BASE, AFTER[:1], DOMAINS[:1])
    assert out["forgetting"] is None and out["plasticity"] == pytest.approx(1.0)


def test_drift_metrics_by_hand():
    import numpy as np

    from benchmark.metrics import anisotropy, linear_cka, mean_cosine

    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert mean_cosine(x, 3 * x) == pytest.approx(1.0)
    assert mean_cosine(x, -x) == pytest.approx(-1.0)
    # cos((1,0),(0,1)) = 0, cos((1,0),(1,1)) = cos((0,1),(1,1)) = 1/sqrt(2): mean of the 3 pairs
    assert anisotropy(x) == pytest.approx(2 / np.sqrt(2) / 3)
    rotation = np.array([[0.0, -1.0], [1.0, 0.0]])
    assert linear_cka(x, 2 * x @ rotation + 5) == pytest.approx(1.0)  # rotation, scale, shift
    rng = np.random.default_rng(0)
    assert linear_cka(rng.normal(size=(200, 8)), rng.normal(size=(200, 8))) < 0.2
