"""Soft prompts (Lester et al., EMNLP 2021) prepended to a Hugging Face encoder's input, via peft's
``PromptEmbedding`` and two hooks on the stock encoder module (no wrapper, no copied model code).

The pre-hook turns ``input_ids`` into word embeddings with the prompt vectors in front and extends
the attention mask (and token types); the forward hook drops the prompt positions from the last
hidden state (and recomputes BERT's pooler from the real first token), so everything downstream
(the MLM head at the collator's masked positions, a classifier's first-token head) sees the
original sequence, which attended to the prompt. Position ids run over prompt + text, as in the
reference's prepending (``docs/das.md`` section 4.9). ``hidden_states``/``attentions`` outputs,
if requested, still contain the prompt positions.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from benchmark.errors import DapbenchError
from benchmark.modeling import encoder_of

PROMPT_MODULE = "dapbench_prompt"
"""Attribute of the encoder that holds the prompt (so it is saved with the encoder's weights)."""


def attach_prompt(model: nn.Module, num_tokens: int, init: str = "SAMPLE_VOCAB") -> nn.Module:
    """Give ``model``'s encoder a prompt of ``num_tokens`` vectors and the hooks that prepend it."""
    from peft import PromptTuningConfig
    from peft.tuners.prompt_tuning import PromptEmbedding

    encoder = encoder_of(model)
    word_embeddings = encoder.get_input_embeddings()
    config = PromptTuningConfig(
        num_virtual_tokens=num_tokens,
        token_dim=word_embeddings.embedding_dim,
        num_transformer_submodules=1,
        prompt_tuning_init=init,
    )
    prompt = PromptEmbedding(config, word_embeddings).to(word_embeddings.weight.device)
    encoder.add_module(PROMPT_MODULE, prompt)
    limit = getattr(model.config, "max_position_embeddings", None)
    signature = inspect.signature(encoder.forward)
    var_keyword = [p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]

    def prepend(module, args, kwargs):
        bound = dict(signature.bind_partial(*args, **kwargs).arguments)
        for name in var_keyword:  # flatten **kwargs back into keywords
            bound.update(bound.pop(name, {}))
        input_ids = bound.pop("input_ids", None)
        if input_ids is None:
            raise DapbenchError("a prompted encoder needs input_ids", "call it with input_ids")
        batch = input_ids.shape[0]
        if limit is not None and input_ids.shape[1] + num_tokens > limit:
            raise DapbenchError(
                f"{num_tokens} prompt tokens + {input_ids.shape[1]} input tokens exceed the model's {limit} positions",
                "lower the sequence length (dap.seq_len / finetune.max_length) or the prompt length",
            )
        vectors = prompt(torch.arange(num_tokens, device=input_ids.device)).to(word_embeddings.weight.dtype)
        bound["inputs_embeds"] = torch.cat([vectors.expand(batch, -1, -1), word_embeddings(input_ids)], dim=1)
        mask = bound.get("attention_mask")
        if mask is not None:  # without one (full chunks) every position, prompts included, is attended
            bound["attention_mask"] = torch.cat([mask.new_ones(batch, num_tokens), mask], dim=1)
        if bound.get("token_type_ids") is not None:
            types = bound["token_type_ids"]
            bound["token_type_ids"] = torch.cat([types.new_zeros(batch, num_tokens), types], dim=1)
        return (), bound

    def strip(module, args, kwargs, output):
        output["last_hidden_state"] = output["last_hidden_state"][:, num_tokens:]
        pooler = getattr(module, "pooler", None)
        if pooler is not None and output.get("pooler_output") is not None:
            output["pooler_output"] = pooler(output["last_hidden_state"])
        return output

    encoder.register_forward_pre_hook(prepend, with_kwargs=True)
    encoder.register_forward_hook(strip, with_kwargs=True)
    return model


def prompt_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The prompt vectors of a prompted model."""
    return [(n, p) for n, p in model.named_parameters() if f".{PROMPT_MODULE}." in n]
