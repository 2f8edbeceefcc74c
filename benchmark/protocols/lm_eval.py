"""lm-evaluation-harness as the end-task protocol of decoders (issue #48): every end task becomes an lm-eval task
(a YAML over a local JSONL file, so it runs offline), scored zero-shot through lm-eval's own model class (``HFLM``
around the stage's model, no copy on disk) and evaluator (``simple_evaluate``).

The task: ``{text}\\nAnswer:`` followed by each label word (lm-eval's default ``" "`` delimiter), multiple choice by
log-likelihood; the prediction is the label word of highest log-likelihood, lm-eval's ``acc`` (unnormalised: a label
word of more tokens is not favoured or penalised beyond its probability). The cell keeps every test prediction, so
macro-F1 and the report's bootstrap over test examples work as for the other protocols, and the accuracy lm-eval
reports is checked against the one computed from them. Label words are the task's label names in lower-case words
(``CompareOrContrast`` -> ``compare or contrast``, ``USED-FOR`` -> ``used for``; the ``+``/``-`` of the camera and
phone tasks read ``positive``/``negative``).

Nothing is trained, so the cell has no seed noise. Masked LMs are not what lm-eval's log-likelihood model scores:
the check refuses them before the run trains (use ``linear_probe`` or ``finetune``).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from benchmark.errors import DapbenchError, NonFiniteError
from benchmark.method import LANGUAGE_MODEL
from benchmark.metrics import classification_scores
from benchmark.protocols.base import EndTaskProtocol
from benchmark.protocols.registry import register_protocol

SYMBOL_WORDS = {"+": "positive", "-": "negative"}
"""Label names that are symbols, in words (the camera and phone aspect-sentiment tasks)."""
PROMPT = "{{text}}\nAnswer:"
"""lm-eval's ``doc_to_text`` of every end task (Jinja)."""


@register_protocol
class LmEval(EndTaskProtocol):
    """Zero-shot multiple choice over the label words, scored by lm-evaluation-harness on the stage's decoder."""

    name = "lm_eval"
    words = "lm-eval"
    short = "lm-eval zero-shot"
    scores = LANGUAGE_MODEL

    def describe(self, ft: dict) -> str:
        """The scoring and the test sample size (nothing is trained on the training split)."""
        tests = ft["max_test_examples"] or "all"
        return f"lm-evaluation-harness, zero-shot multiple choice over the label words, <= {tests} test examples"

    def check(self, config, data) -> None:
        """A decoder, lm-eval installed, and label words that tell every task's labels apart."""
        if not data.family.scores_continuations:
            raise DapbenchError(
                f"finetune.protocol=lm_eval scores a decoder's log-likelihoods; model {config.model!r} is a"
                f" {data.family.name} LM, which does not score text left to right",
                "use finetune.protocol=linear_probe or finetune for a masked LM, or pass --model a causal LM",
            )
        try:
            import lm_eval  # noqa: F401
        except ImportError as exc:
            raise DapbenchError(
                "finetune.protocol=lm_eval needs lm-evaluation-harness, which is not installed",
                "pip install 'dapbench[lm-eval]' (or pip install lm-eval)",
            ) from exc
        for task in data.tasks.values():
            label_words(task.name, task.labels)

    def evaluate(self, model, task, tokenizer, cfg, seed, accelerator) -> dict:
        """Score the test split (:func:`lm_eval_scores`)."""
        return lm_eval_scores(model, task, tokenizer, cfg.eval_batch_size, accelerator.device)


def label_words(task: str, labels: tuple[str, ...]) -> list[str]:
    """Each label name in lower-case words; a named error if two labels read the same."""
    words = [SYMBOL_WORDS.get(label) or _words(label) for label in labels]
    if len(set(words)) < len(words) or not all(words):
        raise DapbenchError(
            f"end task {task}: its labels {list(labels)} do not read as distinct label words ({words})",
            "rename the task's labels in its YAML so that each reads as its own word(s)",
        )
    return words


def _words(label: str) -> str:
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", label)
    return " ".join(re.split(r"[-_\s]+", spaced)).strip().lower()


def write_task(folder: Path, task) -> str:
    """Write ``task``'s test split as an lm-eval task (``<name>.yaml`` over ``<name>.jsonl`` in ``folder``);
    returns the lm-eval task name."""
    name = f"dapbench_{re.sub(r'[^A-Za-z0-9_]', '_', task.name)}"
    rows = [{"text": text, "label": label} for text, label in zip(task.test_texts, task.test_labels, strict=True)]
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    spec = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(folder / f"{name}.jsonl")}, "cache_dir": str(folder / "cache")},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": PROMPT,
        "doc_to_choice": label_words(task.name, task.labels),
        "doc_to_target": "label",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return name


@contextlib.contextmanager
def _lm_eval_bars_held_back():
    """lm-eval draws its own progress bars on stderr whatever its verbosity; the run shows the cell as one phase of
    its own progress, so they are held back, and written out if scoring fails (nothing a user needs is lost)."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise


def lm_eval_scores(model, task, tokenizer, batch_size: int, device) -> dict:
    """lm-eval's zero-shot scores of ``model`` on ``task``'s test split: the cell's scores, its predictions (label of
    highest log-likelihood per test example) and lm-eval's own accuracy, which must agree with them."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    devices = [device] if torch.device(device).type == "cuda" else []
    with tempfile.TemporaryDirectory(prefix="dapbench-lm-eval-") as folder, torch.random.fork_rng(devices=devices):
        name = write_task(Path(folder), task)
        lm = HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size, device=str(device))
        with _lm_eval_bars_held_back():
            out = lm_eval.simple_evaluate(
                model=lm,
                tasks=[name],
                task_manager=TaskManager(include_path=folder),
                num_fewshot=0,
                log_samples=True,
                bootstrap_iters=0,
                random_seed=None,
                numpy_random_seed=None,
                torch_random_seed=None,
                fewshot_random_seed=None,
                verbosity="ERROR",
            )
    samples = sorted(out["samples"][name], key=lambda sample: sample["doc_id"])
    loglik = [[float(choice[0]) for choice in sample["filtered_resps"]] for sample in samples]
    if not all(math.isfinite(value) for row in loglik for value in row):
        raise NonFiniteError(
            f"lm-eval on {task.name}: a label word's log-likelihood is not finite",
            "the DAP checkpoint holds NaN or infinite weights: lower dap.lr or check the method",
        )
    predictions = [max(range(len(row)), key=row.__getitem__) for row in loglik]
    scores = classification_scores(task.test_labels, predictions, len(task.labels))
    reported = out["results"][name]["acc,none"]
    if len(predictions) != len(task.test_labels) or abs(reported - scores["acc"]) > 1e-9:
        raise DapbenchError(
            f"lm-eval on {task.name}: its accuracy {reported} is not the {scores['acc']} of its own log-likelihoods",
            "report this with the installed lm-eval version (dapbench reads its per-sample log-likelihoods)",
        )
    return {
        **scores,
        "predictions": predictions,
        "n_test": len(predictions),
        "protocol": "lm_eval",
        "lm_eval_version": lm_eval.__version__,
        "score_seconds": round(time.perf_counter() - start, 3),
    }
