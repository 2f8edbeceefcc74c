import math

import pytest

from benchmark.metrics import (
    accuracy,
    backward_transfer,
    classification_scores,
    final_average,
    forgetting_rate,
    macro_f1,
    micro_f1,
    summarize_matrix,
)

NAN = math.nan
# A 3x3 matrix computed by hand: rows = after domain t, columns = task k.
A = [[0.80, NAN, NAN], [0.70, 0.60, NAN], [0.50, 0.55, 0.90]]


def test_final_average_is_last_row_mean():
    assert final_average(A) == pytest.approx((0.50 + 0.55 + 0.90) / 3)


def test_final_average_of_independent_methods_is_the_diagonal():
    assert final_average(A, independent_per_domain=True) == pytest.approx((0.80 + 0.60 + 0.90) / 3)


def test_forgetting_rate_by_hand():
    # ((0.80 - 0.50) + (0.60 - 0.55)) / 2 = 0.175
    assert forgetting_rate(A) == pytest.approx(0.175)
    assert backward_transfer(A) == pytest.approx(-0.175)


def test_forgetting_needs_two_domains():
    with pytest.raises(ValueError):
        forgetting_rate([[0.5]])


def test_summary_marks_forgetting_undefined_for_independent_methods():
    summary = summarize_matrix(A, independent_per_domain=True)
    assert summary["forgetting"] is None and summary["bwt"] is None
    assert summary["final"] == pytest.approx(0.7666666, rel=1e-5)


def test_classification_metrics_by_hand():
    labels = [0, 0, 1, 1, 2, 2]
    preds = [0, 1, 1, 1, 0, 2]
    assert accuracy(labels, preds) == pytest.approx(4 / 6)
    # per-class F1: class0 p=1/2 r=1/2 -> .5; class1 p=2/3 r=1 -> .8; class2 p=1 r=1/2 -> 2/3
    assert macro_f1(labels, preds, 3) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert micro_f1(labels, preds, 3) == pytest.approx(4 / 6)


def test_macro_f1_counts_classes_absent_from_test_as_zero():
    # A 4-label task where label 3 never occurs nor is predicted: it must not be silently dropped.
    scores = classification_scores([0, 1, 2], [0, 1, 2], num_labels=4)
    assert scores["acc"] == 1.0
    assert scores["macro_f1"] == pytest.approx(0.75)
