"""Causal LMs (GPT-2, Llama, Qwen, Mistral: ``AutoModelForCausalLM``): they predict every next token. Nothing is
masked: the loss reads every position but each chunk's last, its target the next token; each document ends with the
end-of-sequence token, which marks document boundaries once documents are packed; a small one is a Llama with
grouped-query attention and a byte-level BPE tokenizer."""

from __future__ import annotations

import torch

from benchmark.errors import DapbenchError
from benchmark.families.base import ModelFamily

EOS = "<|endoftext|>"
"""The one special token of a tokenizer trained by :meth:`CausalLM.train_tokenizer`: it ends documents and pads."""


_GPT2 = {
    "layers": "h",
    "qkv": "attn.c_attn",
    "attn_out": "attn.c_proj",
    "intermediate": "mlp.c_fc",
    "output": "mlp.c_proj",
}
"""Where GPT-2 keeps its layers and each layer's units (one fused query-key-value projection)."""
_LLAMA_LIKE = {
    "layers": "layers",
    "query": "self_attn.q_proj",
    "key": "self_attn.k_proj",
    "value": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "intermediate": "mlp.up_proj",
    "output": "mlp.down_proj",
}
"""Where Llama-style decoders keep their layers and each layer's units (a gated MLP)."""


class CausalLM(ModelFamily):
    """A causal LM (decoder): next-token prediction at every position, scored left to right."""

    name = "causal"
    auto_class_name = "AutoModelForCausalLM"
    architecture_suffixes = ("ForCausalLM", "LMHeadModel")
    loss_name = "next-token"
    heldout_reading = ("held-out next-token loss", "nats per token")
    scores_continuations = True
    cache_tag = "|causal"
    unit_maps = {"gpt2": _GPT2, **{name: _LLAMA_LIKE for name in ("llama", "mistral", "qwen2", "qwen3")}}

    def check_tokenizer(self, tokenizer) -> None:
        """Documents are separated by the end-of-sequence token: the tokenizer must define one."""
        if tokenizer.eos_token_id is None:
            raise DapbenchError(
                f"tokenizer {type(tokenizer).__name__} has no end-of-sequence token to mark document boundaries",
                "use a causal LM's tokenizer (it defines eos_token)",
            )

    def encode_documents(self, tokenizer, lines: list[str]) -> dict[str, list[list[int]]]:
        """Each line's tokens followed by the end-of-sequence token (no padding, no start token)."""
        self.check_tokenizer(tokenizer)
        encoded = tokenizer(lines, add_special_tokens=False, verbose=False)["input_ids"]
        ids = [row + [tokenizer.eos_token_id] for row in encoded]
        return {"input_ids": ids, "special_tokens_mask": [[0] * (len(row) - 1) + [1] for row in ids]}

    def batch(self, chunks, special, *, mask_token_id, vocab_size, probability, generator) -> dict[str, torch.Tensor]:
        """Nothing drawn: the chunks as they are (:func:`next_token_batch`)."""
        return next_token_batch(chunks)

    def heldout_draws(self, requested: int) -> int:
        """One: a causal LM's evaluation has nothing to draw."""
        return 1

    def train_tokenizer(self, lines: list[str], vocab_size: int, max_length: int):
        """A byte-level BPE tokenizer (the GPT-2 / Llama recipe) whose one special token ends documents and pads."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        tok.train_from_iterator(lines, trainer)
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, model_max_length=max_length)

    def new_model(self, sizes: dict[str, int], tokenizer, kv_heads: int = 0):
        """A Llama decoder with ``kv_heads`` key/value heads (0: one per query head) and tied embeddings."""
        from transformers import LlamaConfig, LlamaForCausalLM

        eos = tokenizer.eos_token_id
        return LlamaForCausalLM(
            LlamaConfig(
                **sizes,
                num_key_value_heads=kv_heads or sizes["num_attention_heads"],
                tie_word_embeddings=True,
                pad_token_id=eos,
                bos_token_id=eos,
                eos_token_id=eos,
            )
        )


def next_token_batch(chunks: torch.Tensor) -> dict[str, torch.Tensor]:
    """A causal LM's batch of packed chunks in the common format: the loss reads every position but each chunk's
    last (``mlm_positions``, flat) and its target is the next token (``mlm_targets``)."""
    rows, length = chunks.shape
    positions = (torch.arange(rows)[:, None] * length + torch.arange(length - 1)).reshape(-1)
    return {
        "input_ids": chunks,
        "mlm_positions": positions,
        "mlm_targets": chunks[:, 1:].reshape(-1),
        "original_ids": chunks,
    }
