"""The paper's end-task protocol: fine-tune the whole classifier the method builds (a fresh head on checkpoint t)
and score the test split once after the last epoch."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader

from benchmark.acceleration.compiling import compile_blocks
from benchmark.acceleration.fused import fused_adamw
from benchmark.data.endtasks import EncodedTask, validation_split
from benchmark.errors import DapbenchError, NonFiniteError
from benchmark.metrics import classification_scores
from benchmark.protocols.base import EndTaskProtocol, ScoringSettings, test_sizes
from benchmark.protocols.registry import register_protocol

MIN_FINETUNE_EPOCHS = 1.0
"""Passes over its training examples every fine-tuned end task gets at least (``finetune.epochs`` x
``finetune.epoch_scale``): less leaves the head close to its random start, and the score measures that start."""


MIN_VALIDATION_EXAMPLES = 10
"""The fewest validation examples an epoch is chosen on (``finetune.validation_share``), as the test split's floor:
fewer, and one example moves the validation macro-F1 by whole points."""


@dataclass(frozen=True)
class FinetuneSettings(ScoringSettings):
    """What a fine-tune reads: its optimiser, epochs, batches, validation split and compilation (the sample sizes and
    sequence length are the end-task data's, read where the data is prepared)."""

    lr: float
    batch_size: int
    weight_decay: float
    adam_eps: float
    epochs: dict[str, float]
    default_epochs: float
    epoch_scale: float
    validation_share: float
    group_by_length: bool
    compile: bool


@register_protocol
class FineTune(EndTaskProtocol):
    """Train the whole classifier (the paper's protocol, AdamW with linear decay, no model selection)."""

    name = "finetune"
    words = "fine-tune"
    short = "fine-tuned"
    trains = True
    settings = FinetuneSettings

    def describe(self, ft: dict) -> str:
        """Epochs, scale, rate and sample sizes."""
        epochs = sorted(set(ft["epochs"].values())) or [ft["default_epochs"]]
        scale = ft.get("epoch_scale", 1.0)
        share = ft.get("validation_share") or 0.0
        chosen = f", the epoch chosen on a {100 * share:g}% validation split" if share else ""
        chosen += f", the mean of {ft['seeds']} fine-tunes" if ft.get("seeds", 1) > 1 else ""
        return (
            f"fine-tuning {'/'.join(f'{e:g}' for e in epochs)} epochs x {scale:g}, lr {ft['lr']}{chosen},"
            f" {test_sizes(ft)}"
        )

    def check(self, config, data) -> None:
        """Every end task gets at least one pass over its training examples, and a validation split (where asked
        for) of at least :data:`MIN_VALIDATION_EXAMPLES` examples to choose its epoch on."""
        ft = config.finetune
        for task in data.tasks.values():
            held = len(validation_split(task.train, ft.validation_share, f"{task.name}/validation")[1])
            if ft.validation_share and held < MIN_VALIDATION_EXAMPLES:
                raise DapbenchError(
                    f"end task {task.name}'s validation split would hold {held} example(s)"
                    f" (finetune.validation_share={ft.validation_share:g} of {len(task.train)}): too few to choose an"
                    " epoch on",
                    f"raise finetune.validation_share or finetune.max_train_examples (to {MIN_VALIDATION_EXAMPLES}"
                    " validation examples), or set finetune.validation_share=0",
                )
            epochs = ft.epochs.get(task.name, ft.default_epochs) * ft.epoch_scale
            if epochs < MIN_FINETUNE_EPOCHS:
                raise DapbenchError(
                    f"end task {task.name} would be fine-tuned for {epochs:g} epoch(s) (finetune.epochs x"
                    f" finetune.epoch_scale): under one pass its score measures the untrained head",
                    f"raise finetune.epoch_scale (or finetune.epochs.{task.name}) to give it at least one epoch",
                )

    def evaluate(self, model, task, tokenizer, cfg, seed, accelerator) -> dict:
        """Fine-tune, then score the test split (:func:`finetune_and_evaluate`)."""
        return finetune_and_evaluate(model, task, tokenizer, cfg, seed, accelerator)


def finetune_and_evaluate(
    model: nn.Module,
    task: EncodedTask,
    tokenizer,
    cfg: FinetuneSettings,
    seed: int,
    accelerator,
    after_update: Callable[[], None] = lambda: None,
) -> dict:
    """Fine-tune ``model`` (a sequence classifier with a fresh head) and evaluate once on the test set
    after the last epoch (no model selection, as in the paper). Returns scores and timings. ``after_update`` is
    called after every update (``dapbench bench --finetune`` marks the time there)."""
    from transformers import DataCollatorWithPadding, set_seed

    set_seed(seed)
    collator = DataCollatorWithPadding(tokenizer)
    train, validation = validation_split(task.train, cfg.validation_share, f"{task.name}/validation")
    loader = _train_loader(train, cfg, collator)
    epochs = cfg.epochs.get(task.name, cfg.default_epochs) * cfg.epoch_scale
    total_steps = max(1, math.ceil(epochs * len(loader)))
    optimizer, scheduler = _optimizer(model, cfg, accelerator, total_steps)
    # One fine-tune is one process's work, also in a multi-process run (each process takes whole fine-tunes):
    # the model gets mixed precision but no DDP, the loader is not sharded, the schedule steps once per update.
    if cfg.compile:  # an update is a few hundred small kernels: on a GPU their launches set its pace
        compile_blocks(model, keep_variants=True)
    model = accelerator.prepare_model(model, evaluation_mode=True)
    optimizer, device = accelerator.prepare_optimizer(optimizer), accelerator.device
    start = time.perf_counter()
    best = BestEpoch(validation, task.num_labels, collator, cfg.eval_batch_size, accelerator)
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
            after_update()
            if step >= total_steps:
                break
        _check_finite_steps(first_bad, task.name, cfg)
        best.score(model, step / len(loader))
        model.train()
    train_seconds = time.perf_counter() - start
    best.restore(model)
    predictions = predict(model, task.test, collator, cfg.eval_batch_size, accelerator)
    scores = classification_scores(task.test_labels, predictions, task.num_labels)
    accelerator.free_memory()
    return {
        **scores,
        "predictions": predictions,
        "n_train": len(train),
        "n_test": len(task.test),
        "epochs": epochs,
        "steps": total_steps,
        **best.summary(),
        "train_seconds": round(train_seconds, 3),
        "eval_seconds": round(time.perf_counter() - start - train_seconds, 3),
    }


class BestEpoch:
    """Model selection on a validation split (``finetune.validation_share``): after every pass over the training
    examples the validation macro-F1 is measured, and the weights of the best pass are kept (a copy on the host) to
    score the test split with. Without a validation split it keeps nothing and the last weights are scored."""

    def __init__(self, validation: list[dict], num_labels: int, collator, batch_size: int, accelerator):
        """``validation``: the encoded validation examples (empty: no selection)."""
        self.validation, self.num_labels = validation, num_labels
        self.collator, self.batch_size, self.accelerator = collator, batch_size, accelerator
        self.scores: list[tuple[float, float]] = []
        self.best_state: dict[str, torch.Tensor] | None = None

    def score(self, model: nn.Module, epoch: float) -> None:
        """Score the validation split after ``epoch`` passes; keep the weights where it is the best so far (the
        earliest of equal scores: fewer passes, the same validation result)."""
        if not self.validation:
            return
        labels = [f["labels"] for f in self.validation]
        predicted = predict(model, self.validation, self.collator, self.batch_size, self.accelerator)
        value = classification_scores(labels, predicted, self.num_labels)["macro_f1"]
        if not self.scores or value > max(score for _, score in self.scores):
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        self.scores.append((round(epoch, 4), value))

    def restore(self, model: nn.Module) -> None:
        """Load the best epoch's weights into ``model`` (nothing without a validation split)."""
        if self.best_state is not None:
            model.load_state_dict(self.best_state)

    def summary(self) -> dict:
        """The validation examples, the macro-F1 after each pass and the pass chosen (nothing without a split)."""
        if not self.validation:
            return {}
        chosen = max(self.scores, key=lambda item: item[1])  # max keeps the first of equal scores
        return {
            "n_validation": len(self.validation),
            "validation_macro_f1": [score for _, score in self.scores],
            "selected_epoch": chosen[0],
        }


def _optimizer(model: nn.Module, cfg: FinetuneSettings, accelerator, total_steps: int) -> tuple:
    """AdamW over every trainable parameter (the reference decays biases and LayerNorms too; fused on CUDA) and its
    linear decay to zero over ``total_steps``, without warm-up."""
    from transformers import get_linear_schedule_with_warmup

    params = [p for p in model.parameters() if p.requires_grad]
    fused = fused_adamw(accelerator.device, accelerator.mixed_precision) or None
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, eps=cfg.adam_eps, fused=fused)
    return optimizer, get_linear_schedule_with_warmup(optimizer, 0, total_steps)


def _check_finite_steps(first_bad: torch.Tensor, task: str, cfg: FinetuneSettings) -> None:
    bad = int(first_bad)
    if bad >= 0:
        raise NonFiniteError(
            f"fine-tuning on {task}: the loss became non-finite at step {bad} (lr {cfg.lr})",
            "lower finetune.lr (the paper's is 3e-5) or check the checkpoint for NaN weights",
        )


def _train_loader(features: list[dict], cfg: FinetuneSettings, collator) -> DataLoader:
    """Uniformly shuffled batches, or length-grouped ones (``cfg.group_by_length``); both draw from the
    global torch RNG, which the caller seeds."""
    if not cfg.group_by_length:
        return DataLoader(features, batch_size=cfg.batch_size, shuffle=True, collate_fn=collator)
    from transformers.trainer_pt_utils import LengthGroupedSampler

    lengths = [len(f["input_ids"]) for f in features]
    sampler = LengthGroupedSampler(cfg.batch_size, lengths=lengths)
    return DataLoader(features, batch_size=cfg.batch_size, sampler=sampler, collate_fn=collator)


def length_sorted_batches(features: list[dict], collator, batch_size: int, device) -> Iterator[tuple[list[int], dict]]:
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
    for chunk, batch in length_sorted_batches(features, collator, batch_size, accelerator.device):
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
