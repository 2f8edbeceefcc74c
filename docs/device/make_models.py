"""Random-init models of roberta-base's and GPT-2 small's shapes, for `dapbench bench` on a machine that reaches no
model hub (issue #29's lent GPUs). Usage: ``python make_models.py OUT TOKENIZER_DIR``: writes ``OUT/rb`` (RoBERTa
MLM, 12 x 768, vocabulary 50265) and ``OUT/gpt2s`` (GPT-2 LM, 12 x 768, vocabulary 50257), each with the given
tokenizer (the carried kit uses ``../shared/models/roberta-tiny``'s byte-level BPE). ``SMALL=1`` (and ``LAYERS=N``)
make toy shapes for a dry run on a CPU; ``MODELS=rb`` writes only the encoder. Throughput needs the shapes, not
trained weights."""

import os
import sys

import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, RobertaConfig, RobertaForMaskedLM


def main(out: str, tokenizer_dir: str) -> None:
    """Write both models (seeded random weights) and the tokenizer under ``out``."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    small = os.environ.get("SMALL") == "1"
    layers, hidden, heads, ffn = (int(os.environ.get("LAYERS", 2)), 64, 4, 128) if small else (12, 768, 12, 3072)
    roberta = RobertaConfig(
        vocab_size=50265,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        max_position_embeddings=514,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        architectures=["RobertaForMaskedLM"],
    )
    gpt2 = GPT2Config(
        vocab_size=50257,
        n_positions=1024,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        architectures=["GPT2LMHeadModel"],
    )
    torch.manual_seed(0)
    wanted = os.environ.get("MODELS", "rb,gpt2s").split(",")  # MODELS=rb: only the encoder
    makers = {"rb": lambda: RobertaForMaskedLM(roberta), "gpt2s": lambda: GPT2LMHeadModel(gpt2)}
    for name in wanted:
        model = makers[name]()
        model.save_pretrained(f"{out}/{name}")
        tokenizer.save_pretrained(f"{out}/{name}")
        print(name, sum(p.numel() for p in model.parameters()) / 1e6, "M params")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
