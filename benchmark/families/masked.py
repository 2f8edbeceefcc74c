"""Masked LMs (BERT, RoBERTa, ELECTRA, DeBERTa: ``AutoModelForMaskedLM``): they predict masked tokens from both sides.
Their batches mask 15% of the non-special tokens with BERT's 80/10/10 rule; their documents carry the tokenizer's
``[CLS] ... [SEP]``; a small one is a BERT with an uncased WordPiece tokenizer."""

from __future__ import annotations

import torch

from benchmark.errors import DapbenchError
from benchmark.families.base import ModelFamily

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
"""The special tokens of a WordPiece tokenizer trained by :meth:`MaskedLM.train_tokenizer`, in id order."""


_BERT_LIKE = {
    "layers": "encoder.layer",
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attn_out": "attention.output.dense",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
}
"""Where BERT-like encoders keep their layers and each layer's units."""


class MaskedLM(ModelFamily):
    """A masked LM: the loss reads the masked positions, the targets are the original tokens."""

    name = "masked"
    auto_class_name = "AutoModelForMaskedLM"
    architecture_suffixes = ("ForMaskedLM",)
    model_types = ("bert", "roberta", "xlm-roberta", "electra", "distilbert", "deberta", "deberta-v2", "camembert")
    loss_name = "mlm"
    heldout_reading = ("held-out loss", "nats")
    unit_maps = {name: _BERT_LIKE for name in ("bert", "roberta", "xlm-roberta", "electra", "camembert")}

    def check_tokenizer(self, tokenizer) -> None:
        """A masked LM's batches replace tokens by the mask token: its tokenizer must have one."""
        if tokenizer.mask_token_id is None:
            raise DapbenchError(
                f"tokenizer {type(tokenizer).__name__} has no mask token", "use a masked LM's tokenizer"
            )

    def encode_documents(self, tokenizer, lines: list[str]) -> dict[str, list[list[int]]]:
        """Each line with the tokenizer's special tokens (``[CLS] ... [SEP]``) and their marks."""
        return tokenizer(lines, return_special_tokens_mask=True, verbose=False)

    def batch(self, chunks, special, *, mask_token_id, vocab_size, probability, generator) -> dict[str, torch.Tensor]:
        """BERT's masking of the chunks (:func:`mask_tokens`) and the masked positions with their original tokens."""
        inputs, labels = mask_tokens(
            chunks,
            special,
            mask_token_id=mask_token_id,
            vocab_size=vocab_size,
            probability=probability,
            generator=generator,
        )
        flat_labels = labels.reshape(-1)
        positions = (flat_labels != -100).nonzero().squeeze(1)
        if positions.numel() == 0:  # a batch with nothing masked would give a NaN mean loss
            positions = torch.zeros(1, dtype=torch.long)
            flat_labels = flat_labels.clone()
            flat_labels[0] = chunks.reshape(-1)[0]
        return {
            "input_ids": inputs,
            "mlm_positions": positions,
            "mlm_targets": flat_labels[positions],
            "original_ids": chunks,
        }

    def train_tokenizer(self, lines: list[str], vocab_size: int, max_length: int):
        """An uncased WordPiece tokenizer (the BERT recipe), the same one from the same lines in every process."""
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
        from transformers import PreTrainedTokenizerFast

        normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
        # Why the continuation symbols are declared: the trainer numbers each "##c" when it first meets it while
        # walking a hash map, in an order that changes from one process to the next, and breaks ties between
        # equally frequent merges by those numbers, so the same lines learned other merges (other tokens) each
        # time. Declared first, in character order, they have the same numbers every time, and so do the merges.
        alphabet = sorted({c for c in normalizer.normalize_str("\n".join(lines)) if not c.isspace()})
        continuations = [f"##{c}" for c in alphabet]
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=[*SPECIAL_TOKENS, *continuations], initial_alphabet=alphabet
        )
        learner = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        learner.normalizer, learner.pre_tokenizer = normalizer, pre_tokenizer
        learner.train_from_iterator(lines, trainer)
        # WordPiece matches tokens by their text, never by id: numbered in a fixed order, with only the real special
        # tokens special (the continuation symbols were declared special only to fix their numbers).
        learned = sorted(t for t in learner.get_vocab() if t not in SPECIAL_TOKENS)
        vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *learned])}
        tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
        tok.add_special_tokens(SPECIAL_TOKENS)
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            unk_token="[UNK]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
            model_max_length=max_length,
        )

    def new_model(self, sizes: dict[str, int], tokenizer, kv_heads: int = 0):
        """A BERT masked LM (``kv_heads`` does not apply: every head has its own keys and values)."""
        from transformers import BertConfig, BertForMaskedLM

        return BertForMaskedLM(BertConfig(**sizes, pad_token_id=tokenizer.pad_token_id))


def mask_tokens(
    input_ids: torch.Tensor,
    special_tokens_mask: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking (Devlin et al. 2019): select each non-special token with ``probability``; of the
    selected, 80% become the mask token, 10% a uniformly random token, 10% stay. Returns the masked input
    and the labels (the original id at selected positions, -100 elsewhere).

    The draws are made on the CPU in a fixed order (selection, mask, random-vs-keep, random ids), so one
    ``generator`` state gives the same masks on every device. The order is the one transformers' MLM
    collator uses, so masks drawn with the same seed equal the ones that collator drew.
    """
    shape = input_ids.shape
    chance = torch.full(shape, float(probability)).masked_fill_(special_tokens_mask.bool(), 0.0)
    selected = torch.bernoulli(chance, generator=generator).bool()
    labels = input_ids.masked_fill(~selected, -100)
    to_mask = torch.bernoulli(torch.full(shape, 0.8), generator=generator).bool() & selected
    # Half of the remaining 20% of the selected tokens become random tokens, the other half stay.
    to_random = torch.bernoulli(torch.full(shape, 0.5), generator=generator).bool() & selected & ~to_mask
    random_ids = torch.randint(vocab_size, shape, dtype=torch.long, generator=generator)
    inputs = input_ids.masked_fill(to_mask, mask_token_id)
    inputs = torch.where(to_random, random_ids, inputs)
    return inputs, labels
