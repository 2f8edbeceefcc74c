import dataclasses
import random

import numpy as np
import torch

from benchmark.config import FinetuneConfig
from benchmark.data.endtasks import EncodedTask
from benchmark.protocols.finetune import _train_loader
from benchmark.protocols.linear_probe import encoder_features, probe_and_evaluate


def _features(n: int) -> list[dict]:
    rng = random.Random(0)
    return [{"input_ids": [1] * rng.randint(5, 120), "index": i} for i in range(n)]


def _padded_tokens(loader) -> int:
    return sum(max(len(f["input_ids"]) for f in batch) * len(batch) for batch in loader)


def test_length_grouped_batches_cover_every_example_once_and_pad_less():
    features = _features(240)
    cfg = FinetuneConfig(batch_size=16)

    def epoch(grouped: bool) -> list[list[dict]]:
        torch.manual_seed(7)
        loader = _train_loader(features, dataclasses.replace(cfg, group_by_length=grouped), collator=list)
        return list(loader)

    uniform, grouped = epoch(False), epoch(True)
    assert sorted(f["index"] for batch in grouped for f in batch) == list(range(240))
    assert [len(b) for b in grouped] == [len(b) for b in uniform]
    # Similar lengths per batch: well under the padding of uniformly shuffled batches.
    assert _padded_tokens(grouped) < 0.8 * _padded_tokens(uniform)
    # Seeded by the global RNG like the uniform loader: the same seed gives the same batches.
    assert [[f["index"] for f in b] for b in epoch(True)] == [[f["index"] for f in b] for b in grouped]


def _pad(batch: list[dict]) -> dict:
    width = max(len(f["input_ids"]) for f in batch)
    ids = [f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in batch]
    mask = [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in batch]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def _classifier():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24, num_labels=2
    )
    return BertForSequenceClassification(config)


def test_probe_features_ignore_padding_and_keep_the_input_order():
    model = _classifier()
    features = [{"input_ids": [2, 7, 9, 3]}, {"input_ids": [2] + [11] * 20 + [3]}, {"input_ids": [2, 5, 3]}]
    together = encoder_features(model, features, _pad, batch_size=3, device="cpu")
    alone = np.stack([encoder_features(model, [f], _pad, batch_size=1, device="cpu")[0] for f in features])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_linear_probe_separates_a_separable_task_and_leaves_the_model_untouched(tiny_model):
    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=2)
    before = {n: p.clone() for n, p in model.state_dict().items()}

    def examples(n: int) -> list[dict]:
        # class 0 repeats one word, class 1 another: mean-pooled features are linearly separable
        rng = random.Random(n)
        out = []
        for i in range(n):
            word = "alpha" if i % 2 == 0 else "beta"
            ids = tokenizer(" ".join([word] * rng.randint(3, 8)))["input_ids"]
            out.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": i % 2})
        return out

    train, test = examples(40), examples(20)
    task = EncodedTask("toy", 2, train, test, [f["labels"] for f in test])
    result = probe_and_evaluate(model, task, tokenizer, FinetuneConfig(protocol="linear_probe"), Accelerator(cpu=True))
    assert result["acc"] == 1.0 and result["protocol"] == "linear_probe"
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())


def test_an_end_task_classifier_is_fp32_even_from_a_bf16_checkpoint(tiny_model, tmp_path):
    import shutil

    from transformers import AutoModelForMaskedLM

    from benchmark.modeling import classifier_from_checkpoint

    stored = tmp_path / "bf16"
    shutil.copytree(tiny_model, stored)
    AutoModelForMaskedLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(stored)
    assert AutoModelForMaskedLM.from_pretrained(stored).dtype == torch.bfloat16  # what transformers 5 loads by itself
    classifier = classifier_from_checkpoint(stored, num_labels=3)
    assert {p.dtype for p in classifier.parameters()} == {torch.float32}  # fine-tuned in fp32, as DAP trains
