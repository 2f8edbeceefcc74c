"""DEMIX: one expert adapter per domain, each new expert initialised from the nearest earlier one
(DEMix layers, Gururangan et al., NAACL 2022; the adapter form of the DAS paper's baseline,
``docs/das.md`` section 4.8, which the reference leaves unimplemented).

Before domain t > 0, every earlier expert k is scored on the new domain's fixed probe subset (eval
mode, no dropout) by its MLM perplexity exp(mean loss); expert t starts as a copy of the expert with
the lowest perplexity (the DEMix paper adapts to a new domain from its most similar expert). Only
expert t and the MLM head's own parameters train; the base model and earlier experts stay frozen,
so an earlier expert is never changed again. At fine-tuning the end task's own domain expert is
active (the method needs the domain id: task-incremental information) and the expert plus the model
train with a fresh classifier. The held-out MLM-loss matrix is measured with the newest expert.

Experts are the adapters of :mod:`methods.adapter_ncl` (LoRA on the FFN output, rank
hidden // reduction_factor); the DEMix paper replaced whole FFNs by experts, the DAS paper's
baseline uses adapters, which we follow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from benchmark.errors import DapbenchError
from benchmark.method import Capabilities, ContinualMethod, DomainContext, FinetuneContext, MethodConfig
from methods._shared.adapters import (
    activate_adapter,
    adapter_parameters,
    classifier_with_dap_encoder,
    head_parameters,
    inject_ffn_adapters,
    train_only,
)
from methods.adapter_ncl import AdapterConfig


def expert_name(index: int) -> str:
    """The adapter name of domain ``index``'s expert."""
    return f"expert{index}"


@torch.no_grad()
def expert_perplexities(
    model: nn.Module,
    experts: list[str],
    batches: Iterable[Mapping[str, torch.Tensor]],
    loss_fn: Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor],
) -> dict[str, float]:
    """exp(mean MLM loss) of ``model`` on ``batches`` with each expert active (eval mode)."""
    was_training = model.training
    model.eval()
    out = {}
    for expert in experts:
        activate_adapter(model, expert)
        losses = [float(loss_fn(model, batch)) for batch in batches]
        out[expert] = math.exp(sum(losses) / len(losses))
    model.train(was_training)
    return out


def nearest_expert(perplexities: Mapping[str, float]) -> str:
    """The expert with the lowest perplexity (ties: the earliest)."""
    return min(perplexities, key=lambda name: perplexities[name])


def copy_adapter(model: nn.Module, source: str, target: str) -> None:
    """Overwrite adapter ``target``'s weights with adapter ``source``'s."""
    sources = dict(adapter_parameters(model, source))
    with torch.no_grad():
        for name, param in adapter_parameters(model, target):
            param.copy_(sources[name.replace(f".{target}.", f".{source}.")])


class DEMIX(ContinualMethod):
    """Per-domain expert adapters, each new one copied from the lowest-perplexity earlier expert."""

    name: ClassVar[str] = "demix"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = "peft's injected expert modules are not verified under FSDP2 yet"
    config_cls: ClassVar[type[MethodConfig]] = AdapterConfig
    capabilities: ClassVar[Capabilities] = Capabilities(needs_domain_id_at_finetune=True)
    config: AdapterConfig

    def flop_bound(self, encoder_share: float) -> float | None:
        """Not declared: the base is frozen and only the expert adapter and the head train, as in the peft
        variants (input gradients only through the base)."""
        return None

    def __init__(self, config: AdapterConfig, *, env):
        super().__init__(config, env=env)
        self.current = 0
        self.initialised_from: dict[int, dict[str, Any]] = {}

    def _experts(self) -> list[str]:
        return [expert_name(t) for t in range(self.env.num_domains)]

    def setup(self, model: nn.Module) -> nn.Module:
        """Inject one expert per domain; the current domain's expert is the active one."""
        model = inject_ffn_adapters(model, self._experts(), self.config.reduction_factor)
        self._activate(model, self.current)
        return model

    def _activate(self, model: nn.Module, index: int) -> None:
        activate_adapter(model, expert_name(index))
        train_only(model, adapter_parameters(model, expert_name(index)) + head_parameters(model))

    def before_domain(self, ctx: DomainContext) -> None:
        """Initialise this domain's expert from the nearest earlier one and make it the trained one."""
        model = ctx.unwrapped_model()
        self.current = ctx.index
        if ctx.index > 0:
            earlier = [expert_name(k) for k in range(ctx.index)]
            perplexities = expert_perplexities(model, earlier, ctx.probe_loader, ctx.mlm_loss)
            source = nearest_expert(perplexities)
            copy_adapter(model, source, expert_name(ctx.index))
            self.initialised_from[ctx.index] = {"expert": source, "perplexities": perplexities}
        self._activate(model, ctx.index)

    def trainable_parameters(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """The current domain's expert and the MLM head."""
        return adapter_parameters(model, expert_name(self.current)) + head_parameters(model)

    def finetune_model(self, ctx: FinetuneContext) -> nn.Module:
        """Classifier with every expert loaded and the end task's domain expert active."""
        if ctx.task_domain_index is None:
            raise DapbenchError("demix needs the end task's domain id at fine-tuning", "declare the capability")
        index = ctx.task_domain_index

        def prepare(model: nn.Module) -> nn.Module:
            return inject_ffn_adapters(model, self._experts(), self.config.reduction_factor)

        model = classifier_with_dap_encoder(ctx, prepare)
        activate_adapter(model, expert_name(index))
        others = {
            id(p)
            for k in range(self.env.num_domains)
            if k != index
            for _, p in adapter_parameters(model, expert_name(k))
        }
        for param in model.parameters():
            param.requires_grad_(id(param) not in others)
        return model

    def state_dict(self) -> dict[str, Any]:
        """The current domain and, per domain, which expert it was initialised from (and why)."""
        return {"current": self.current, "initialised_from": dict(self.initialised_from)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.current = state["current"]
        self.initialised_from = dict(state["initialised_from"])
