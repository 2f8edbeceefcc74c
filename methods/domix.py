"""DoMIX: one LoRA module per domain, trained independently of the others, mixed for each end task by a learned
bridge matrix (Kim, Kang and Moon, ACL 2025; public code github.com/dohoonkim-ai/DoMIX).

Pre-training (where we follow the paper). Domain t gets a LoRA module of its own (rank ``rank``, scale
``alpha / rank``) on every projection of every layer (query, key, value or GPT-2's fused ``c_attn``, attention
output, FFN input(s) and output: :attr:`benchmark.modeling.LayerModules.projections`). Only that module trains, on
top of the frozen base model with no other module active, so what it learns does not depend on the earlier domains
or their order, and an earlier module never changes again: the training is order-free and could run in parallel.
The MLM head stays frozen (only LoRA weights train).

Fine-tuning (the paper's bridge). For an end task after domain t, every adapted projection computes
``W x + s * B M A x`` with ``A`` the row-wise concatenation of the t + 1 modules' ``A_k`` (r(t+1) x in), ``B`` the
column-wise concatenation of their ``B_k`` (out x r(t+1)) and ``M`` a trainable r(t+1) x r(t+1) bridge, initialised
to the identity (diagonal): at the start of fine-tuning the model is the base plus the sum of every seen domain's
module, and fine-tuning learns how the modules' subspaces mix for the task. The bridge, the base model and the
classifier train; the domain modules ``A_k``, ``B_k`` stay fixed. The record keeps, per end-task cell, each
layer-averaged block norm of the learned bridge (``finetune_reports``).

Where the public code differs or is silent: its fine-tuning has many variants (``train_Mixer``, ``Mixer2``, merge
ratios, sign merging) selected by flags, and which parameters train beside the mixer depends on them; we implement
the single mixer ``B M A`` of the paper's method. Its roberta code adapts the same projections. Under the
``linear_probe`` end-task protocol nothing is trained at fine-tuning, so the bridge stays the identity and the
probe measures the sum of the modules: the bridge's learning is measured only under ``finetune.protocol=finetune``.

Held-out losses after domain t are measured with the bridge's starting point (every trained module active, summed,
no domain id), so the general-text loss says what the modules together cost the base model's knowledge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from benchmark.method import ContinualMethod, DomainContext, FinetuneContext, MethodConfig, ParameterGroup
from benchmark.modeling import layer_modules, out_axis
from benchmark.settings import setting
from methods._shared.adapters import activate_adapters, adapter_parameters, classifier_with_dap_encoder, train_only


def module_name(index: int) -> str:
    """The LoRA adapter name of domain ``index``."""
    return f"domain{index}"


@dataclass(frozen=True)
class DoMIXConfig(MethodConfig):
    """DoMIX options."""

    rank: int = setting(8, low=1, high=1024)
    """LoRA rank of every domain module."""
    alpha: float = setting(16.0, low=0, low_open=True, high=1e4)
    """LoRA scale numerator: the modules' updates are multiplied by ``alpha / rank``."""
    lora_lr: float | None = setting(None, low=0, low_open=True, high=1)
    """Peak rate of the domain modules during DAP (None: ``dap.lr``; the LoRA paper trains RoBERTa-base's modules at
    4e-4 to 5e-4; ``dapbench tune`` chooses at a profile's budget)."""


def domain_lora_config(model: nn.Module, config: DoMIXConfig):
    """The PEFT ``LoraConfig`` of one domain module: rank ``config.rank``, scale ``alpha / rank``, no dropout, on every
    projection of every layer of ``model``."""
    from peft import LoraConfig

    targets = {id(m): out_axis(m) for layer in layer_modules(model) for m in layer.projections}
    names = [name for name, module in model.named_modules() if id(module) in targets]
    conv1d = 1 in targets.values()  # GPT-2's Conv1D projections keep weights as in x out
    return LoraConfig(
        r=config.rank, lora_alpha=config.alpha, lora_dropout=0.0, target_modules=names, fan_in_fan_out=conv1d
    )


def inject_domain_modules(model: nn.Module, count: int, config: DoMIXConfig) -> nn.Module:
    """Add ``count`` LoRA modules (``domain0`` ...) on every projection of every layer, in place, none active."""
    import warnings

    from peft import inject_adapter_in_model

    lora = domain_lora_config(model, config)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        for index in range(count):
            model = inject_adapter_in_model(lora, model, adapter_name=module_name(index))
    return model


def lora_layers(model: nn.Module) -> list[nn.Module]:
    """Every peft LoRA layer of ``model``, in module order."""
    from peft.tuners.lora import LoraLayer

    return [module for module in model.modules() if isinstance(module, LoraLayer)]


class Bridge(nn.Module):
    """The bridge of one adapted projection: ``s * B M A x`` added to its output, ``M`` trainable (identity at
    start), the domain modules' ``A_k``, ``B_k`` read from the layer (frozen)."""

    def __init__(self, layer: nn.Module, names: list[str]):
        super().__init__()
        self.names = names
        self.scale = float(layer.scaling[names[0]])
        width = sum(layer.lora_A[n].weight.shape[0] for n in names)
        self.matrix = nn.Parameter(torch.eye(width, device=layer.lora_A[names[0]].weight.device))

    def delta(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``s * B M A x`` for the layer's input ``x``."""
        a = torch.cat([layer.lora_A[n].weight for n in self.names], dim=0)
        b = torch.cat([layer.lora_B[n].weight for n in self.names], dim=1)
        return ((x.to(a.dtype) @ a.T) @ self.matrix.T) @ b.T * self.scale


def attach_bridges(model: nn.Module, names: list[str]) -> list[Bridge]:
    """Replace every LoRA layer's own adapter sum by a bridge over ``names`` (returned in module order)."""
    bridges = []
    for layer in lora_layers(model):
        bridge = Bridge(layer, names)
        layer.domix_bridge = bridge  # a submodule: its matrix is a parameter of the model
        layer.enable_adapters(False)  # the layer computes its base projection only; the bridge adds the rest
        layer.register_forward_hook(lambda module, args, out: out + module.domix_bridge.delta(module, args[0]))
        bridges.append(bridge)
    return bridges


def bridge_summary(bridges: list[Bridge], rank: int) -> dict[str, Any]:
    """The learned mixing, averaged over the bridges: the Frobenius norm of every (from, to) block of ``M`` divided
    by that of the identity's block (1 on the diagonal at start, 0 off it), and the largest change from the start."""
    count = len(bridges[0].names)
    blocks = torch.zeros(count, count)
    change = 0.0
    for bridge in bridges:
        m = bridge.matrix.detach().float().cpu()
        blocks += m.reshape(count, rank, count, rank).pow(2).sum(dim=(1, 3)).sqrt() / rank**0.5
        change = max(change, float((m - torch.eye(m.shape[0])).abs().max()))
    mean = blocks / len(bridges)
    return {"block_norms": [[round(float(v), 5) for v in row] for row in mean], "max_change": round(change, 6)}


class DoMIX(ContinualMethod):
    """Per-domain LoRA modules trained independently, mixed per end task by a learned bridge matrix."""

    name: ClassVar[str] = "domix"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = "peft's injected LoRA modules are not verified under FSDP2 yet"
    config_cls: ClassVar[type[MethodConfig]] = DoMIXConfig
    config: DoMIXConfig

    def __init__(self, config: DoMIXConfig, *, env):
        super().__init__(config, env=env)
        self.trained = 0
        """How many domain modules are trained (the next one to train is ``domain<trained>``)."""
        self._bridges: list[Bridge] = []

    def flop_bound(self, encoder_share: float) -> float | None:
        """Not declared: the frozen base needs input gradients only (as the peft variants)."""
        return None

    def setup(self, model: nn.Module) -> nn.Module:
        """Inject a module per domain; the trained ones are active (summed), as after a domain."""
        model = inject_domain_modules(model, self.env.num_domains, self.config)
        self._activate_trained(model)
        return model

    def _activate_trained(self, model: nn.Module) -> None:
        activate_adapters(model, [module_name(k) for k in range(max(1, self.trained))])
        train_only(model, [])

    def before_domain(self, ctx: DomainContext) -> None:
        """Train this domain's module alone on the frozen base (no earlier module active)."""
        model = ctx.unwrapped_model()
        activate_adapters(model, [module_name(ctx.index)])
        train_only(model, adapter_parameters(model, module_name(ctx.index)))

    def trainable_parameters(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """The module of the domain being trained."""
        return adapter_parameters(model, module_name(self.trained))

    def parameter_groups(self, model: nn.Module) -> list[ParameterGroup]:
        """The module of the domain being trained, at ``lora_lr``."""
        return [ParameterGroup("lora", self.trainable_parameters(model), self.config.lora_lr)]

    def after_domain(self, ctx: DomainContext) -> None:
        """Freeze the new module; every trained module is active for evaluation and the next checkpoint."""
        self.trained = ctx.index + 1
        self._activate_trained(ctx.unwrapped_model())

    def finetune_model(self, ctx: FinetuneContext) -> nn.Module:
        """A classifier whose adapted projections mix the trained modules through identity-initialised bridges;
        bridges, base model and classifier train, the modules stay fixed."""
        names = [module_name(k) for k in range(self.trained)]
        model = classifier_with_dap_encoder(ctx, lambda m: inject_domain_modules(m, self.env.num_domains, self.config))
        self._bridges = attach_bridges(model, names)
        lora = {id(p) for n, p in model.named_parameters() if ".lora_" in n}
        for param in model.parameters():
            param.requires_grad_(id(param) not in lora)
        return model

    def finetune_report(self, model: nn.Module) -> dict[str, Any]:
        """The bridge the end task learned (:func:`bridge_summary`)."""
        return bridge_summary(self._bridges, self.config.rank) if self._bridges else {}

    def state_dict(self) -> dict[str, Any]:
        """How many domain modules are trained."""
        return {"trained": self.trained}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.trained = int(state["trained"])
