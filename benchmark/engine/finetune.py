"""End-task evaluation of one DAP checkpoint on one end task: fine-tuning (the paper's protocol) or a
linear probe on frozen features (the cheap protocol of small budgets)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from benchmark.config import FinetuneConfig
from benchmark.data.endtasks import EncodedTask
from benchmark.engine.optimizers import fused_adamw
from benchmark.errors import NonFiniteError
from benchmark.metrics import classification_scores


def finetune_and_evaluate(
    model: nn.Module, task: EncodedTask, tokenizer, cfg: FinetuneConfig, seed: int, accelerator
) -> dict:
    """Fine-tune ``model`` (a sequence classifier with a fresh head) and evaluate once on the test set
    after the last epoch (no model selection, as in the paper). Returns scores and timings."""
    from transformers import DataCollatorWithPadding, get_linear_schedule_with_warmup, set_seed

    set_seed(seed)
    collator = DataCollatorWithPadding(tokenizer)
    loader = _train_loader(task.train, cfg, collator)
    epochs = cfg.epochs.get(task.name, cfg.default_epochs) * cfg.epoch_scale
    total_steps = max(1, math.ceil(epochs * len(loader)))
    # The reference applies weight decay to every parameter (biases and LayerNorms too).
    params = [p for p in model.parameters() if p.requires_grad]
    fused = fused_adamw(accelerator.device, accelerator.mixed_precision) or None
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, eps=cfg.adam_eps, fused=fused)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, total_steps)
    # One fine-tune is one process's work, also in a multi-process run (each process takes whole fine-tunes):
    # the model gets mixed precision but no DDP, the loader is not sharded, the schedule steps once per update.
    model = accelerator.prepare_model(model, evaluation_mode=True)
    optimizer, device = accelerator.prepare_optimizer(optimizer), accelerator.device
    start = time.perf_counter()
    model.train()
    step = 0
    # First step whose loss was not finite (-1: none), kept on the device: checked once per epoch, no sync per step.
    first_bad = torch.full((), -1, dtype=torch.long, device=device)
    while step < total_steps:
        for batch in loader:
            loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
            first_bad = torch.where((first_bad < 0) & ~torch.isfinite(loss.detach()), step + 1, first_bad)
            accelerator.backward(loss)
            optimizer.step()
            if not accelerator.optimizer_step_was_skipped:  # fp16 overflow: the schedule waits
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step >= total_steps:
                break
        _check_finite_steps(first_bad, task.name, cfg)
    train_seconds = time.perf_counter() - start
    predictions = predict(model, task.test, collator, cfg.eval_batch_size, accelerator)
    scores = classification_scores(task.test_labels, predictions, task.num_labels)
    accelerator.free_memory()
    return {
        **scores,
        "predictions": predictions,
        "n_train": len(task.train),
        "n_test": len(task.test),
        "epochs": epochs,
        "steps": total_steps,
        "train_seconds": round(train_seconds, 3),
        "eval_seconds": round(time.perf_counter() - start - train_seconds, 3),
    }


def _check_finite_steps(first_bad: torch.Tensor, task: str, cfg: FinetuneConfig) -> None:
    bad = int(first_bad)
    if bad >= 0:
        raise NonFiniteError(
            f"fine-tuning on {task}: the loss became non-finite at step {bad} (lr {cfg.lr})",
            "lower finetune.lr (the paper's is 3e-5) or check the checkpoint for NaN weights",
        )


def _train_loader(features: list[dict], cfg: FinetuneConfig, collator) -> DataLoader:
    """Uniformly shuffled batches, or length-grouped ones (``cfg.group_by_length``); both draw from the
    global torch RNG, which the caller seeds."""
    if not cfg.group_by_length:
        return DataLoader(features, batch_size=cfg.batch_size, shuffle=True, collate_fn=collator)
    from transformers.trainer_pt_utils import LengthGroupedSampler

    lengths = [len(f["input_ids"]) for f in features]
    sampler = LengthGroupedSampler(cfg.batch_size, lengths=lengths)
    return DataLoader(features, batch_size=cfg.batch_size, sampler=sampler, collate_fn=collator)


def _length_sorted_batches(features: list[dict], collator, batch_size: int, device) -> Iterator[tuple[list[int], dict]]:
    """Inference batches of similar length (minimal padding), each with the indices of its examples in
    ``features`` so that callers can put results back in the original order. Labels are left out."""
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = collator([{k: v for k, v in features[i].items() if k != "labels"} for i in chunk])
        yield chunk, {k: v.to(device) for k, v in batch.items()}


@torch.no_grad()
def predict(model: nn.Module, features: list[dict], collator, batch_size: int, accelerator) -> list[int]:
    """Argmax predictions in the original order; batches are length-sorted to minimise padding. Predictions stay
    on the device until the end: one host synchronisation, not one per batch."""
    model.eval()
    order, argmaxes = [], []
    finite = torch.ones((), dtype=torch.bool, device=accelerator.device)
    for chunk, batch in _length_sorted_batches(features, collator, batch_size, accelerator.device):
        logits = model(**batch).logits
        finite &= torch.isfinite(logits).all()
        order += chunk
        argmaxes.append(logits.argmax(-1))
    predictions = [0] * len(features)
    for i, pred in zip(order, torch.cat(argmaxes).tolist() if argmaxes else [], strict=True):
        predictions[i] = pred
    if not bool(finite):  # an argmax over NaN logits is class 0: a silent majority-class "score"
        raise NonFiniteError(
            "the classifier's test logits are not finite", "lower finetune.lr or check the checkpoint for NaN weights"
        )
    return predictions


def evaluate_end_task(
    model: nn.Module, task: EncodedTask, tokenizer, cfg: FinetuneConfig, seed: int, accelerator
) -> dict:
    """Score ``model`` on one end task by the configured protocol: a linear probe of frozen features, or
    fine-tuning (the paper's protocol)."""
    if cfg.protocol == "linear_probe":
        return probe_and_evaluate(model, task, tokenizer, cfg, accelerator)
    return finetune_and_evaluate(model, task, tokenizer, cfg, seed, accelerator)


def probe_and_evaluate(model: nn.Module, task: EncodedTask, tokenizer, cfg: FinetuneConfig, accelerator) -> dict:
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
    for chunk, batch in _length_sorted_batches(features, collator, batch_size, device):
        hidden = encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        out[chunk] = ((hidden * mask).sum(1) / mask.sum(1)).float().cpu().numpy()
    return out
