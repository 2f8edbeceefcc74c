"""Pure metric functions on predictions and on the end-task matrix A[t][k].

A[t][k] is the score of the checkpoint after domain t fine-tuned on the end task of domain k
(k <= t; entries above the diagonal, and entries not computed with ``--matrix final``, are NaN).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import accuracy_score, f1_score

from benchmark.plugins import Registry, named_entry


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
    # converted once, not by each of the three scikit-learn calls: a third less time for the same numbers, which
    # matters when every committed record's cells are re-scored on load (benchmark.records.checks)
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    return {
        "acc": accuracy(labels, predictions),
        "macro_f1": macro_f1(labels, predictions, num_labels),
        "micro_f1": micro_f1(labels, predictions, num_labels),
    }


MIN_CLASS_SHARE = 0.5
"""A cell measures the backbone only if its classifier predicts at least this share of the classes in its test set
(issue #86: a fine-tuned head that predicts 2 of 6 classes measures its own collapse, not the model under it)."""


def majority_macro_f1(labels: Sequence[int], num_labels: int) -> float:
    """The macro-F1 of always predicting the most frequent test label (:func:`macro_f1`'s classes)."""
    labels = np.asarray(labels)
    return macro_f1(labels, np.full_like(labels, np.bincount(labels).argmax()), num_labels)


def backbone_problem(labels: Sequence[int], predictions: Sequence[int], num_labels: int) -> str | None:
    """Why one end-task cell does not measure the backbone, or None where it does: its classifier predicts fewer
    than :data:`MIN_CLASS_SHARE` of the classes in the test set, or its macro-F1 is at or below the majority
    class's (issue #86). The report states no verdict from a cell so flagged."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    present, predicted = len(np.unique(labels)), len(np.unique(predictions))
    if predicted < MIN_CLASS_SHARE * present:
        return f"predicts {predicted} of the {present} classes in its test set"
    score, majority = macro_f1(labels, predictions, num_labels), majority_macro_f1(labels, num_labels)
    if score <= majority + 1e-9:
        return f"macro-F1 {100 * score:.2f} is at or below the majority class's {100 * majority:.2f}"
    return None


def backbone_flags(
    predictions: Mapping[str, Sequence[int]],
    test_labels: Mapping[str, Mapping],
    end_tasks: Sequence[str],
    seed_predictions: Mapping[str, Sequence[Sequence[int]]] | None = None,
) -> dict[str, str]:
    """Every cell (``"t/k"``) of one protocol's ``predictions`` that does not measure the backbone, with why
    (:func:`backbone_problem`); ``test_labels`` per end task holds ``labels`` and ``classes`` as a record keeps them. A
    cell fine-tuned several times (``seed_predictions``: the later fine-tunes') is flagged where any of its
    classifiers is, named by its fine-tune."""
    flags = {}
    for cell, predicted in predictions.items():
        task = test_labels[end_tasks[int(cell.split("/")[1])]]
        for i, guesses in enumerate([predicted, *(seed_predictions or {}).get(cell, [])]):
            problem = backbone_problem(task["labels"], guesses, task["classes"])
            if problem is not None:
                flags[cell] = problem if i == 0 else f"fine-tune {i + 1}: {problem}"
                break
    return flags


def record_backbone_flags(record: Mapping, beside: str | None = None) -> dict[str, str]:
    """The cells of a record's own protocol (or of the protocol ``beside`` it) that do not measure the backbone: as
    kept in the record, else derived from its predictions (records made before the flags were kept); empty where the
    record holds no predictions."""
    cells = record if beside is None else record["end_tasks_beside"][beside]
    if "backbone_flags" in cells:
        return dict(cells["backbone_flags"])
    if not cells.get("predictions") or not record.get("test_labels"):
        return {}
    return backbone_flags(
        cells["predictions"], record["test_labels"], record["end_tasks"], cells.get("seed_predictions")
    )


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
@dataclass(frozen=True)
class LossMetric:
    """A continual metric of the held-out loss matrix, registered with :func:`register_loss_metric`: its name in
    records, its leaderboard column, its direction and how it is computed over B replicates (None: undefined)."""

    name: str
    title: str
    higher_is_better: bool
    compute: Callable[[LossView], np.ndarray | None]


class LossView:
    """What a loss metric sees, over a leading axis of B replicates: the base losses ``start`` (B x T, the domains'
    columns), ``losses`` (B x T x (K + 1), the last column general text), their ``diagonal`` and ``final`` row, and
    the run's shape (per-domain models, joint training, general text measured)."""

    def __init__(
        self,
        base: np.ndarray,
        losses: np.ndarray,
        independent_per_domain: bool,
        final_row_only: bool,
        has_general: bool,
    ) -> None:
        self.base, self.losses, self.t_count = base, losses, losses.shape[1]
        self.independent_per_domain, self.final_row_only, self.has_general = (
            independent_per_domain,
            final_row_only,
            has_general,
        )
        self.diagonal = losses[:, np.arange(self.t_count), np.arange(self.t_count)]
        self.start = base[:, : self.t_count]
        self.final = self.diagonal if independent_per_domain else losses[:, -1, : self.t_count]

    @functools.cached_property
    def stage_forgetting(self) -> np.ndarray | None:
        """B x (T - 1): mean_{k<t} (L[t][k] - L[k][k]) after each stage t >= 1; None where forgetting is undefined
        (T < 2, per-domain models, joint training)."""
        if self.t_count < 2 or self.independent_per_domain or self.final_row_only:
            return None
        losses, diagonal = self.losses, self.diagonal
        return np.stack([np.mean(losses[:, t, :t] - diagonal[:, :t], axis=-1) for t in range(1, self.t_count)], -1)


LOSS_METRIC_REGISTRY: Registry[LossMetric] = Registry(
    "loss metric",
    "dapbench.loss_metrics",
    "a plugin registers its own with benchmark.metrics.register_loss_metric or the entry-point group"
    " dapbench.loss_metrics",
    load=named_entry("loss metric", LossMetric),
)
"""Every registered loss metric by name, in registration order (the continual table's column order)."""


def register_loss_metric(name: str, title: str, higher_is_better: bool):
    """Register the decorated ``compute(view) -> array | None`` as the loss metric ``name``: every record made from
    then on stores it, and the leaderboard shows it (for older records, computed from their stored losses)."""

    def add(compute: Callable[[LossView], np.ndarray | None]):
        LOSS_METRIC_REGISTRY.add(name, LossMetric(name, title, higher_is_better, compute))
        return compute

    return add


@register_loss_metric("plasticity", "plasticity", True)
def _plasticity(v: LossView) -> np.ndarray | None:
    return None if v.final_row_only else np.mean(v.start - v.diagonal, axis=-1)


@register_loss_metric("forgetting", "forgetting", False)
def _forgetting(v: LossView) -> np.ndarray | None:
    return None if v.stage_forgetting is None else v.stage_forgetting[:, -1]


@register_loss_metric("max_forgetting", "max forgetting", False)
def _max_forgetting(v: LossView) -> np.ndarray | None:
    return None if v.stage_forgetting is None else np.max(v.stage_forgetting, axis=-1)


@register_loss_metric("final_gain", "final gain", True)
def _final_gain(v: LossView) -> np.ndarray | None:
    return np.mean(v.start - v.final, axis=-1)


@register_loss_metric("general_rise", "general rise", False)
def _general_rise(v: LossView) -> np.ndarray | None:
    if not v.has_general:
        return None
    t = v.t_count
    after = np.mean(v.losses[:, :, t], axis=-1) if v.independent_per_domain else v.losses[:, -1, t]
    return after - v.base[:, t]


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
    view = LossView(base, losses, independent_per_domain, final_row_only, has_general)
    return {name: metric.compute(view) for name, metric in LOSS_METRIC_REGISTRY.items()}


def record_loss_metrics(record: Mapping) -> dict[str, float | None]:
    """:func:`loss_metrics` of a run record, from its raw held-out losses and capabilities (older records too)."""
    losses, caps = record["lm_loss"], record["capabilities"]
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
    changed = [
        s["method_report"]["gate_decisions_changed"]
        for s in domains
        if "gate_decisions_changed" in (s.get("method_report") or {})
    ]
    if changed and max(changed) < GATES_UNLEARNED_BELOW:
        stalled[GATE_DECISIONS] = max(changed)
    return stalled


def served_losses(after: np.ndarray, independent_per_domain: bool) -> np.ndarray:
    """(B x) T x T: the loss of domain k of the model that serves it after stage t, from ``after`` (L[t][k], NaN where
    unmeasured): ``after`` itself, or for a per-domain method domain k's own model, L[k][k], at every t >= k (NaN
    above the diagonal)."""
    if not independent_per_domain:
        return after
    size = after.shape[-1]
    diagonal = after[..., np.arange(size), np.arange(size)]
    lower = np.tril(np.ones((size, size))) > 0
    return np.where(lower, diagonal[..., None, :], np.nan)


def mean_regret(after: np.ndarray, oracle_after: np.ndarray) -> np.ndarray:
    """Mean regret against the oracle (TiC-LM): the mean over the cells L[t][k], k <= t, that both loss matrices hold,
    of L[t][k] - L*[t][k], the loss after stage t minus the oracle's (trained on domains 0..t with the same budget).
    ``after`` and ``oracle_after`` are (B x) T x K domain-column losses (NaN where a matrix has no cell)."""
    rows, columns = np.tril_indices(after.shape[-2], m=after.shape[-1])
    cells = (after - oracle_after)[..., rows, columns]
    return np.nanmean(cells, axis=-1)


GAP_PARTS = ("earlier", "general")
"""The held-out sets a stability gap is read on: the earlier domains' (their mean loss) and general text."""

GAP_SUMMARY = tuple(
    f"{part}_{field}" for part in GAP_PARTS for field in ("depth", "won_back", "half_recovery_updates", "unrecovered")
)
"""The run-level fields of :func:`stability_gap` (its ``stages`` aside), in the order tables show them."""


def stability_gap(record: Mapping) -> dict | None:
    """The stability gap of a run measured with continual evaluation (``dap.eval_every``), from each domain's curve
    (``domains[t].curve``), in nats; None for a record without curves.

    Per stage t >= 1 and for the earlier domains' held-out sets (their mean) and the general text: ``start``, the
    loss before the stage's first update; ``worst``, the highest loss measured during the stage (De Lange et al.'s
    worst case, in loss); ``end``, after its last update; ``depth`` = worst - start, the dip; ``recovered`` =
    worst - end, how much of it the stage won back; ``dip_step``, the update count where it was worst;
    ``half_recovery_updates``, the updates from the worst point until the loss first measured at or below the dip's
    midpoint (worst - depth / 2): the updates to recover, None where the stage never won back half of its dip (0
    where it had none). The summary, per part (``earlier``, ``general``): ``{part}_depth``, the depths' mean over the
    stages that have it; ``{part}_won_back``, the share of the dips won back by the stages' ends (their recovered
    over their depth, summed over the stages with a dip; above 1 where the stages ended below where they started);
    ``{part}_half_recovery_updates``, the mean updates to recover half of a dip over the stages that did (None where
    none did), and ``{part}_unrecovered``, how many stages with a dip never did."""
    stages = []
    for t, domain in enumerate(record["domains"]):
        curve = domain.get("curve")
        if not curve or t == 0:
            continue
        sets = {"earlier": [name for name in record["sequence"][:t] if name in curve["losses"]]}
        sets["general"] = ["general"] if "general" in curve["losses"] else []
        stage = {"stage": t}
        for part, names in sets.items():
            if names:
                stage[part] = _dip(np.mean([curve["losses"][name] for name in names], axis=0), curve["steps"])
        stages.append(stage)
    if not stages:
        return None
    summary = {}
    for part in GAP_PARTS:
        dips = [s[part] for s in stages if part in s]
        if dips:
            summary.update(_dip_summary(part, dips))
    return {**summary, "stages": stages}


def _dip_summary(part: str, dips: list[dict]) -> dict:
    """One part's mean depth, share won back and updates to recover half (:func:`stability_gap`)."""
    dipped = [d for d in dips if d["depth"] > 0]
    recovered = [d["half_recovery_updates"] for d in dipped if d["half_recovery_updates"] is not None]
    return {
        f"{part}_depth": float(np.mean([d["depth"] for d in dips])),
        # the dips' total won back over their total depth: a mean of per-stage ratios would be ruled by shallow dips
        f"{part}_won_back": sum(d["recovered"] for d in dipped) / sum(d["depth"] for d in dipped) if dipped else None,
        f"{part}_half_recovery_updates": float(np.mean(recovered)) if recovered else None,
        f"{part}_unrecovered": len(dipped) - len(recovered),
    }


def _dip(losses: np.ndarray, steps: Sequence[int]) -> dict[str, float | int]:
    """Start, worst, end, depth, recovered, the step of the worst point and the updates from it until half of the dip
    was won back, of one loss curve."""
    worst = int(np.argmax(losses))
    start, peak, end = float(losses[0]), float(losses[worst]), float(losses[-1])
    midpoint = peak - (peak - start) / 2
    back = next((i for i in range(worst, len(losses)) if losses[i] <= midpoint), None) if peak > start else worst
    return {
        "start": round(start, 5),
        "worst": round(peak, 5),
        "end": round(end, 5),
        "depth": round(peak - start, 5),
        "recovered": round(peak - end, 5),
        "dip_step": int(steps[worst]),
        "half_recovery_updates": None if back is None else int(steps[back] - steps[worst]),
    }
