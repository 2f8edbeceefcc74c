"""Pure metric functions on predictions and on the end-task matrix A[t][k].

A[t][k] is the score of the checkpoint after domain t fine-tuned on the end task of domain k
(k <= t; entries above the diagonal, and entries not computed with ``--matrix final``, are NaN).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


# ----------------------------------------------------------------------------------------------
# Loss-based continual metrics on the held-out MLM-loss matrix L[t][k]
# ----------------------------------------------------------------------------------------------
LOSS_METRICS = ("plasticity", "forgetting", "max_forgetting", "final_gain", "general_rise")
"""The loss-based metrics of one run, in nats (see :func:`loss_metrics`)."""


def loss_metrics(
    base: Mapping[str, float],
    after_domain: Sequence[Mapping[str, float] | None],
    domains: Sequence[str],
    *,
    independent_per_domain: bool = False,
    final_row_only: bool = False,
    general: str = "general",
) -> dict[str, float | None]:
    """Continual metrics of the held-out MLM loss, in nats, from L[t][k] = the loss on domain k's held-out
    text after stage t (``after_domain[t][domains[k]]``) and the base model's losses ``base``.

    * ``plasticity`` = mean_k (base[k] - L[k][k]): how much each domain's loss fell when it was learned.
    * ``forgetting`` = mean_{k<T-1} (L[T-1][k] - L[k][k]): how much of that the final model gave back.
    * ``max_forgetting`` = max over stages t >= 1 of mean_{k<t} (L[t][k] - L[k][k]): the worst forgetting
      at any point of the sequence (forgetting that later domains undo still shows here).
    * ``final_gain`` = mean_k (base[k] - L_final[k]): what the end of the sequence kept over the base model.
    * ``general_rise`` = L_final[general] - base[general]: general knowledge lost (positive = lost).

    L_final is the last row, except for per-domain methods (``independent_per_domain``: domain k's model
    is the one trained on k alone), whose final model for k is row k and whose general rise is the mean
    over their per-domain models. Forgetting is undefined (None) for them, for joint training
    (``final_row_only``: no model after the earlier domains, so no plasticity either) and for T < 2.
    """
    losses = _loss_matrix(after_domain, [*domains, general])
    start = np.asarray([[base[d] for d in domains] + [base.get(general, np.nan)]], dtype=float)
    arrays = loss_metric_arrays(
        start,
        losses[None],
        independent_per_domain=independent_per_domain,
        final_row_only=final_row_only,
        has_general=general in base,
    )
    return {name: None if value is None else float(value[0]) for name, value in arrays.items()}


def loss_metric_arrays(
    base: np.ndarray,
    losses: np.ndarray,
    *,
    independent_per_domain: bool = False,
    final_row_only: bool = False,
    has_general: bool = True,
) -> dict[str, np.ndarray | None]:
    """:func:`loss_metrics` over a leading axis of B replicates (the report's bootstrap over held-out chunks):
    ``base`` is B x (K + 1) and ``losses`` B x T x (K + 1), the last column the general text; each metric is a
    length-B array, or None where it is undefined."""
    t_count = losses.shape[1]
    diagonal = losses[:, np.arange(t_count), np.arange(t_count)]
    start = base[:, :t_count]
    final = diagonal if independent_per_domain else losses[:, -1, :t_count]
    out: dict[str, np.ndarray | None] = {name: None for name in LOSS_METRICS}
    out["final_gain"] = np.mean(start - final, axis=-1)
    if not final_row_only:
        out["plasticity"] = np.mean(start - diagonal, axis=-1)
    if t_count >= 2 and not (independent_per_domain or final_row_only):
        stages = np.stack([np.mean(losses[:, t, :t] - diagonal[:, :t], axis=-1) for t in range(1, t_count)], axis=-1)
        out["forgetting"] = stages[:, -1]
        out["max_forgetting"] = np.max(stages, axis=-1)
    if has_general:
        general_after = np.mean(losses[:, :, t_count], axis=-1) if independent_per_domain else losses[:, -1, t_count]
        out["general_rise"] = general_after - base[:, t_count]
    return out


def record_loss_metrics(record: Mapping) -> dict[str, float | None]:
    """:func:`loss_metrics` of a run record, from its raw held-out losses and capabilities (older records too)."""
    losses, caps = record["mlm_loss"], record["capabilities"]
    return loss_metrics(
        losses["base"],
        losses["after_domain"],
        record["sequence"],
        independent_per_domain=caps.get("independent_per_domain", False),
        final_row_only=caps.get("joint_training", False),
    )


def _loss_matrix(after_domain: Sequence[Mapping[str, float] | None], columns: Sequence[str]) -> np.ndarray:
    """Stages x columns; a stage without a model (joint training's earlier stages) or a missing column is NaN."""
    return np.asarray(
        [[np.nan if row is None else row.get(c, np.nan) for c in columns] for row in after_domain], dtype=float
    )


# ----------------------------------------------------------------------------------------------
# Representation drift: features of the same held-out inputs under the base and the current model
# ----------------------------------------------------------------------------------------------
def mean_cosine(before: np.ndarray, after: np.ndarray) -> float:
    """Mean over inputs i of cos(before_i, after_i): 1 = every input's feature kept its direction."""
    a, b = _unit_rows(before), _unit_rows(after)
    return float(np.mean(np.sum(a * b, axis=1)))


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear centred kernel alignment (Kornblith et al. 2019) of two feature matrices (inputs x dims):
    ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F), invariant to rotation and isotropic scaling; 1 = same
    geometry of the inputs."""
    xc, yc = (np.asarray(m, dtype=np.float64) - np.mean(m, axis=0) for m in (x, y))
    cross = np.linalg.norm(yc.T @ xc) ** 2
    return float(cross / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc)))


def anisotropy(features: np.ndarray) -> float:
    """Mean cosine between the features of two different inputs (Ethayarajh 2019): near 1 = every input
    points the same way, so the features tell inputs apart only in a narrow cone."""
    unit = _unit_rows(features)
    n = unit.shape[0]
    if n < 2:
        raise ValueError("anisotropy needs at least two inputs")
    total = np.sum(unit @ unit.T) - n  # drop the n self-similarities of 1
    return float(total / (n * (n - 1)))


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    m = np.asarray(matrix, dtype=np.float64)
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)


UNTRAINED_BELOW = 1e-3
"""A parameter group whose relative update size stays below this in every domain did not train at this budget (the
report marks its row). Measured on the mini profile (small BERT, 24 AdamW updates of 16 x 64 tokens at lr 1e-4 per
domain): the DAP-trained weights move 0.0086 of their norm in a domain; the HAT task embeddings that ContinualLM's
code trains inside that AdamW move about 1e-3 (issue #45)."""

GATES_UNLEARNED_BELOW = 0.05
"""A gated method whose gate decisions (a unit kept or shut at evaluation) changed for fewer than this share of its
units in every domain serves masks that are mostly their random start: the report marks its row."""

GATE_DECISIONS = "gate decisions"
"""How :func:`untrained_groups` names a gated method's masks (from ``method_report.gate_decisions_changed``)."""


def largest_update_sizes(domains: list[dict]) -> dict[str, float]:
    """Per parameter group, the largest relative update size of any of ``domains`` (stages of records; groups that
    started at zero and stages made before update sizes were recorded are left out)."""
    largest: dict[str, float] = {}
    for stage in domains:
        for group, size in (stage.get("update_sizes") or {}).items():
            if size.get("relative") is not None:
                largest[group] = max(largest.get(group, 0.0), size["relative"])
    return largest


def untrained_groups(domains: list[dict]) -> dict[str, float]:
    """What a record's stages did not train: each parameter group whose relative update size stayed below
    :data:`UNTRAINED_BELOW` in every trained domain, and :data:`GATE_DECISIONS` where a gated method changed fewer than
    :data:`GATES_UNLEARNED_BELOW` of its gate decisions in every domain; each with the largest value it reached (empty
    where the record holds no sizes or gate reports)."""
    stalled = {group: value for group, value in largest_update_sizes(domains).items() if value < UNTRAINED_BELOW}
    changed = [s["method_report"]["gate_decisions_changed"] for s in domains
               if "gate_decisions_changed" in (s.get("method_report") or {})]  # fmt: skip
    if changed and max(changed) < GATES_UNLEARNED_BELOW:
        stalled[GATE_DECISIONS] = max(changed)
    return stalled
