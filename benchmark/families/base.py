"""What a model family is: the one object that says how a kind of language model reads text, what it is trained to
predict, how its held-out loss reads, and how a small one of its kind is made from scratch."""

from __future__ import annotations

from typing import Any, ClassVar

import torch


class ModelFamily:
    """A kind of language model (masked, causal, ...). The data, the engine, the records and the report ask the run's
    family instead of testing a flag; a new kind is one module that subclasses this and registers an instance
    (:func:`benchmark.families.register_family`).

    A batch of every family has the same format (see :mod:`benchmark.modeling`): ``input_ids``, ``original_ids``,
    and the positions whose outputs the loss reads (``mlm_positions``, flat indices) with their targets
    (``mlm_targets``), so one forward, every method and every evaluation serve all families alike.
    """

    name: ClassVar[str]
    """The kind's name, stored in every record as ``model_kind``."""
    auto_class_name: ClassVar[str]
    """The transformers auto class that loads a model of the kind (e.g. ``AutoModelForMaskedLM``)."""
    architecture_suffixes: ClassVar[tuple[str, ...]] = ()
    """Endings of a configuration's ``architectures`` entries that name the kind (``ForMaskedLM``)."""
    model_types: ClassVar[tuple[str, ...]] = ()
    """Model types of the kind, for a configuration that names no architecture."""
    loss_name: ClassVar[str]
    """The language-model loss term's name on the progress bar (the record keeps the key ``mlm`` for every kind)."""
    heldout_reading: ClassVar[tuple[str, str]]
    """What the held-out loss measures and its unit, as the leaderboard says them."""
    scores_continuations: ClassVar[bool] = False
    """Whether the model scores text continuations left to right (what lm-evaluation-harness's log-likelihood
    multiple choice asks of a model)."""
    unit_maps: ClassVar[dict[str, dict[str, str]]] = {}
    """Per model type of the family: attribute paths of where its layers are (``layers``, below the base model) and
    of the unit-bearing modules of one layer (``query``, ``key``, ``value`` or ``qkv``, ``attn_out``, ``gate``,
    ``intermediate``, ``output``), which DAS, HAT, freezing and sharding act on."""
    cache_tag: ClassVar[str] = ""
    """Appended to the keys of packed-text cache entries, which differ per kind (empty for the masked kind, whose
    entries keep the keys they had before other kinds existed)."""

    def auto_class(self):
        """The transformers auto class of the kind."""
        import transformers

        return getattr(transformers, self.auto_class_name)

    def claims(self, model_config: Any) -> bool | None:
        """True where the configuration names one of the kind's architectures, None where it names none of them
        but its type is one of the kind's, else False."""
        for architecture in getattr(model_config, "architectures", None) or ():
            if architecture.endswith(self.architecture_suffixes):
                return True
        return None if model_config.model_type in self.model_types else False

    def check_tokenizer(self, tokenizer) -> None:
        """Raise a named error when the tokenizer lacks a token the kind's batches need."""

    def encode_documents(self, tokenizer, lines: list[str]) -> dict[str, list[list[int]]]:
        """Token ids (``input_ids``) and special-token marks (``special_tokens_mask``) of each line, as packed chunks
        of the kind are cut from them."""
        raise NotImplementedError

    def batch(
        self,
        chunks: torch.Tensor,
        special: torch.Tensor,
        *,
        mask_token_id: int | None,
        vocab_size: int,
        probability: float,
        generator: torch.Generator | None,
    ) -> dict[str, torch.Tensor]:
        """One training or evaluation batch of packed ``chunks`` (rows x length; ``special`` marks special tokens):
        the inputs, and the positions the loss reads with their targets. A kind that draws (which tokens to mask)
        draws from ``generator`` (None: the global RNG) with ``probability`` per token."""
        raise NotImplementedError

    def heldout_draws(self, requested: int) -> int:
        """How many times the held-out chunks are drawn (``dap.heldout_mask_draws`` asks; a kind that draws
        nothing evaluates once)."""
        return requested

    def train_tokenizer(self, lines: list[str], vocab_size: int, max_length: int):
        """A new tokenizer of the kind's recipe trained on ``lines`` (``dapbench pretrain-base``)."""
        raise NotImplementedError

    def new_model(self, sizes: dict[str, int], tokenizer, kv_heads: int = 0):
        """A freshly initialised small model of the kind (``dapbench pretrain-base``): ``sizes`` holds the
        vocabulary, hidden, layer, head, intermediate and position sizes in transformers' names."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<model family {self.name}>"
