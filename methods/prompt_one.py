"""Prompt-ONE: a soft prompt per domain on the frozen base model (DAS paper baseline, Ke et al. 2023,
Table 1; reference ``prompt_one``, which crashes as released, ``docs/das.md`` section 4.9).

Every domain starts from the base model (``independent_per_domain``) with 100 new prompt vectors
prepended to the input (the paper's ``n_tokens``); during DAP only the prompt trains (the reference
freezes everything else, LM head included). At fine-tuning the trained prompt is loaded (the
reference re-initialises it) and prompt plus model train with a fresh classifier, as in the paper.
Initialisation: peft's ``SAMPLE_VOCAB`` (prompt vectors copied from randomly drawn vocabulary
embeddings), the sampled-vocabulary initialisation of the prompt-tuning paper (Lester et al. 2021);
the reference copies the first 100 rows of the embedding matrix, which in BERT vocabularies are
unused placeholder tokens. Prompt + input must fit in the model's positions (100 + 128 <= 512 for
BERT and roberta-base).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from benchmark.method import Capabilities, ContinualMethod, FinetuneContext, MethodConfig, ParameterGroup
from benchmark.settings import setting
from methods._shared.adapters import classifier_with_dap_encoder, train_only
from methods._shared.prompts import attach_prompt, prompt_parameters

INITS = ("SAMPLE_VOCAB", "RANDOM")


@dataclass(frozen=True)
class PromptConfig(MethodConfig):
    """Prompt options."""

    num_tokens: int = setting(100, low=1, high=4096)
    """Prompt vectors per domain (the paper's n_tokens)."""
    init: str = setting("SAMPLE_VOCAB", choices=INITS)
    """peft's ``PromptTuningInit``: ``SAMPLE_VOCAB`` or ``RANDOM``."""
    prompt_lr: float | None = setting(0.003, low=0, low_open=True, high=10)
    """Peak rate of the prompt vectors (None: ``dap.lr``, the setting of version 1). The prompt-tuning paper trains
    them at 0.3 with Adafactor; ``dapbench tune`` at the ``mini`` budget chose 0.003 of 0.003, 0.03 and 0.3 under
    Adafactor, which also beat AdamW at the DAP rate 1e-4 on the same validation slices (``tuning/mini/``)."""
    prompt_optimizer: str = setting("adafactor", choices=("adamw", "adafactor"))
    """The prompt vectors' optimiser: the paper's Adafactor (fixed rate, no parameter scaling; the default since
    version 2), or the DAP AdamW."""

    def extra_positions(self) -> int:
        """The prompt vectors take positions in front of every DAP chunk and end-task input."""
        return self.num_tokens


class PromptONE(ContinualMethod):
    """One soft prompt per domain, trained with the language model frozen."""

    name: ClassVar[str] = "prompt_one"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = "its prompt hooks on the embedding module are not verified under FSDP2 yet"
    config_cls: ClassVar[type[MethodConfig]] = PromptConfig
    capabilities: ClassVar[Capabilities] = Capabilities(independent_per_domain=True)
    version: ClassVar[int] = 2
    """2: the prompt vectors train with Adafactor at 0.003 (chosen by ``dapbench tune``), no longer in the DAP AdamW at
    1e-4, where they moved about 1% of their norm per domain and every domain's loss rose above the base model's."""
    config: PromptConfig

    def flop_bound(self, encoder_share: float) -> float | None:
        """Not declared: the frozen base needs input gradients only, so the bound depends on which products
        have trainable weights (peft's layout); bench reports the counted FLOPs without a ratio."""
        return None

    def setup(self, model: nn.Module) -> nn.Module:
        """Attach a fresh prompt and freeze everything else."""
        model = attach_prompt(model, self.config.num_tokens, self.config.init)
        train_only(model, prompt_parameters(model))
        return model

    def parameter_groups(self, model: nn.Module) -> list[ParameterGroup]:
        """The prompt vectors, at ``prompt_lr`` with ``prompt_optimizer`` (so their update size is recorded apart)."""
        optimizer = self.config.prompt_optimizer
        return [ParameterGroup("prompts", prompt_parameters(model), self.config.prompt_lr, optimizer=optimizer)]

    def finetune_model(self, ctx: FinetuneContext) -> nn.Module:
        """Classifier whose encoder carries the trained prompt; prompt and model all trainable."""
        return classifier_with_dap_encoder(ctx, lambda model: attach_prompt(model, self.config.num_tokens, "RANDOM"))
