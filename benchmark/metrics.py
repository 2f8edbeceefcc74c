"""Pure metric functions on predictions and on the end-task matrix A[t][k].

A[t][k] is the score of the checkpoint after domain t fine-tuned on the end task of domain k
(k <= t; entries above the diagonal, and entries not computed with ``--matrix final``, are NaN).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.metrics import accuracy_score, f1_score


def accuracy(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """Share of correct predictions."""
    return float(accuracy_score(labels, predictions))


def macro_f1(labels: Sequence[int], predictions: Sequence[int], num_labels: int) -> float:
    """Unweighted mean of per-class F1 over every class of the task (absent classes count as 0)."""
    return float(f1_score(labels, predictions, labels=list(range(num_labels)), average="macro", zero_division=0))


def micro_f1(labels: Sequence[int], predictions: Sequence[int], num_labels: int) -> float:
    """Micro-F1 (equals accuracy for single-label data; the paper's ChemProt column)."""
    return float(f1_score(labels, predictions, labels=list(range(num_labels)), average="micro", zero_division=0))


def classification_scores(labels: Sequence[int], predictions: Sequence[int], num_labels: int) -> dict[str, float]:
    """Accuracy, macro-F1 and micro-F1 of one evaluation."""
    return {
        "acc": accuracy(labels, predictions),
        "macro_f1": macro_f1(labels, predictions, num_labels),
        "micro_f1": micro_f1(labels, predictions, num_labels),
    }


def _as_matrix(matrix: Sequence[Sequence[float]]) -> np.ndarray:
    a = np.asarray(matrix, dtype=float)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"expected a square T x T matrix, got shape {a.shape}")
    return a


def final_average(matrix: Sequence[Sequence[float]], independent_per_domain: bool = False) -> float:
    """Mean over tasks of the final model's scores (last row); the diagonal for ONE-style methods,
    whose model for task k is the one trained on domain k alone."""
    a = _as_matrix(matrix)
    values = np.diag(a) if independent_per_domain else a[-1]
    return float(np.mean(values))


def forgetting_rate(matrix: Sequence[Sequence[float]]) -> float:
    """``1/(T-1) * sum_{k<T-1} (A[k][k] - A[T-1][k])``: the score lost on earlier tasks by the end.

    Positive means forgetting. Defined for T >= 2.
    """
    a = _as_matrix(matrix)
    t = a.shape[0]
    if t < 2:
        raise ValueError("forgetting needs at least two domains")
    return float(np.mean([a[k, k] - a[t - 1, k] for k in range(t - 1)]))


def backward_transfer(matrix: Sequence[Sequence[float]]) -> float:
    """``1/(T-1) * sum_{k<T-1} (A[T-1][k] - A[k][k])`` (Lopez-Paz & Ranzato 2017): minus forgetting."""
    return -forgetting_rate(matrix)


def summarize_matrix(
    matrix: Sequence[Sequence[float]], independent_per_domain: bool = False, final_row_only: bool = False
) -> dict[str, float | None]:
    """Final average, forgetting and backward transfer of one matrix.

    Forgetting is undefined (None) for a single domain, for independent-per-domain methods (their
    model for a task never sees later domains) and for a matrix with only its final row (joint
    training: there is no model after the earlier domains).
    """
    a = _as_matrix(matrix)
    out: dict[str, float | None] = {"final": final_average(a, independent_per_domain)}
    defined = a.shape[0] >= 2 and not independent_per_domain and not final_row_only
    out["forgetting"] = forgetting_rate(a) if defined else None
    out["bwt"] = backward_transfer(a) if defined else None
    return out
