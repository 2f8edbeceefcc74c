"""The linear-probe end-task protocol: a logistic regression on the frozen model's mean-pooled features (cheap and
seed-free: what DAP left in the representations, on budgets where fine-tuning a small model stays at the majority
class)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from benchmark.data.endtasks import EncodedTask
from benchmark.errors import NonFiniteError
from benchmark.metrics import classification_scores
from benchmark.protocols.base import EndTaskProtocol, ScoringSettings, test_sizes
from benchmark.protocols.finetune import length_sorted_batches
from benchmark.protocols.registry import register_protocol


@dataclass(frozen=True)
class ProbeSettings(ScoringSettings):
    """The probe's settings: the inverse L2 strength of its logistic regression."""

    probe_c: float


@register_protocol
class LinearProbe(EndTaskProtocol):
    """Freeze the method's classifier, mean-pool its encoder's last hidden states, fit a logistic regression."""

    name = "linear_probe"
    words = "linear probe"
    short = "probe"
    caveat = (
        "End tasks are scored by a linear probe on the frozen model's mean-pooled features: a base model whose"
        " pooled features suit the probe can lose probe accuracy to DAP's drift (CKA to base) even where the"
        " held-out losses show domain knowledge gained. Read the end-task table with the continual table."
    )
    reads = ("protocol", "probe_c", "max_length", "max_train_examples", "max_test_examples", "eval_batch_size")
    settings = ProbeSettings

    def describe(self, ft: dict) -> str:
        """The probe's features and regularisation, and the sample sizes."""
        return (
            "linear probe (frozen model, mean-pooled last hidden states, standardised, logistic regression"
            f" C={ft.get('probe_c', 1.0)}), {test_sizes(ft)}"
        )

    def evaluate(self, model, task, tokenizer, cfg, seed, accelerator) -> dict:
        """Fit and score the probe (:func:`probe_and_evaluate`; no seed: lbfgs is deterministic)."""
        return probe_and_evaluate(model, task, tokenizer, cfg, accelerator)


def probe_and_evaluate(model: nn.Module, task: EncodedTask, tokenizer, cfg, accelerator) -> dict:
    """Linear probe: freeze ``model`` (the method's fine-tuning model), take the mean of its encoder's last
    hidden states over non-padding tokens, fit a logistic regression on the training split and score the
    test split. The classifier head of ``model`` is not used."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from transformers import DataCollatorWithPadding

    collator = DataCollatorWithPadding(tokenizer)
    model = model.to(accelerator.device)
    start = time.perf_counter()
    train_x = encoder_features(model, task.train, collator, cfg.eval_batch_size, accelerator.device)
    test_x = encoder_features(model, task.test, collator, cfg.eval_batch_size, accelerator.device)
    feature_seconds = time.perf_counter() - start
    if not (np.isfinite(train_x).all() and np.isfinite(test_x).all()):
        raise NonFiniteError(
            f"linear probe on {task.name}: the frozen model's features are not finite",
            "the DAP checkpoint holds NaN or infinite weights: lower dap.lr or check the method",
        )
    # lbfgs on standardised features is deterministic: the probe adds no seed noise of its own.
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=cfg.probe_c, max_iter=2000))
    probe.fit(train_x, [f["labels"] for f in task.train])
    predictions = probe.predict(test_x).tolist()
    scores = classification_scores(task.test_labels, predictions, task.num_labels)
    return {
        **scores,
        "predictions": [int(p) for p in predictions],
        "n_train": len(task.train),
        "n_test": len(task.test),
        "protocol": "linear_probe",
        "feature_seconds": round(feature_seconds, 3),
        "fit_seconds": round(time.perf_counter() - start - feature_seconds, 3),
    }


@torch.no_grad()
def encoder_features(model: nn.Module, features: list[dict], collator, batch_size: int, device) -> np.ndarray:
    """Mean-pooled last hidden states of ``model.base_model`` (eval mode), in the order of ``features``."""
    model.eval()
    encoder = model.base_model
    out = np.zeros((len(features), model.config.hidden_size), dtype=np.float32)
    for chunk, batch in length_sorted_batches(features, collator, batch_size, device):
        hidden = encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        out[chunk] = ((hidden * mask).sum(1) / mask.sum(1)).float().cpu().numpy()
    return out
