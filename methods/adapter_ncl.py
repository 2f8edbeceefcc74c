"""Adapter-NCL: one shared bottleneck adapter trained continually through the sequence, base model
frozen (DAS paper baseline "Adapter", Ke et al. 2023, Table 1).

During DAP only the adapter and the MLM head's own parameters train (as adapter-transformers'
``train_adapter`` does in the reference: the head lies outside the frozen base model; its decoder
weight is tied to the frozen word embeddings). At fine-tuning the adapter and the whole model train
with a fresh classifier, as in the paper. The adapter is LoRA on the FFN output projection with rank
``hidden // reduction_factor`` (48 for roberta-base), peft's closest match to the paper's pfeiffer
adapter; ``methods/_shared/adapters.py`` states the differences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from benchmark.method import ContinualMethod, FinetuneContext, MethodConfig, ParameterGroup
from benchmark.settings import setting
from methods._shared.adapters import (
    adapter_parameters,
    classifier_with_dap_encoder,
    head_parameters,
    inject_ffn_adapters,
    train_only,
)

ADAPTER = "adapter"


@dataclass(frozen=True)
class AdapterConfig(MethodConfig):
    """Adapter options."""

    reduction_factor: int = setting(16, low=1, high=4096)
    """Adapter rank = hidden_size // reduction_factor (the reference's default 16: 48 for roberta-base)."""
    adapter_lr: float | None = setting(None, low=0, low_open=True, high=1)
    """Peak rate of the adapter weights (None: ``dap.lr``, the reference's one rate; the adapter paper, Houlsby et
    al. 2019, chooses per task from 3e-5, 3e-4, 3e-3; ``dapbench tune`` chooses at a profile's budget)."""


class AdapterNCL(ContinualMethod):
    """A single adapter (plus MLM head) trained through every domain on a frozen base model."""

    name: ClassVar[str] = "adapter_ncl"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = "peft's injected adapter modules are not verified under FSDP2 yet"
    config_cls: ClassVar[type[MethodConfig]] = AdapterConfig
    config: AdapterConfig

    def flop_bound(self, encoder_share: float) -> float | None:
        """Not declared: the frozen base needs input gradients only, so the bound depends on which products
        have trainable weights (peft's layout); bench reports the counted FLOPs without a ratio."""
        return None

    def setup(self, model: nn.Module) -> nn.Module:
        """Inject the adapter and freeze everything but the adapter and the MLM head."""
        model = inject_ffn_adapters(model, [ADAPTER], self.config.reduction_factor)
        train_only(model, adapter_parameters(model, ADAPTER) + head_parameters(model))
        return model

    def parameter_groups(self, model: nn.Module) -> list[ParameterGroup]:
        """The adapter weights, at ``adapter_lr`` in the DAP AdamW (the MLM head stays at ``dap.lr``)."""
        return [ParameterGroup("adapter", adapter_parameters(model, ADAPTER), self.config.adapter_lr)]

    def finetune_model(self, ctx: FinetuneContext) -> nn.Module:
        """Classifier with the trained adapter; adapter and model all trainable."""
        return classifier_with_dap_encoder(
            ctx, lambda model: inject_ffn_adapters(model, [ADAPTER], self.config.reduction_factor)
        )
