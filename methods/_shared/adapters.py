"""Bottleneck adapters after the FFN through peft, and the fine-tune handoff of surgically changed models.

On every model kind the adapter sits on the FFN's last projection (``output.dense``, GPT-2's ``mlp.c_proj``,
Llama's ``down_proj``: :func:`benchmark.modeling.layer_modules`).

The DAS paper's adapter baselines use adapter-transformers' default "pfeiffer" adapter: one
sequential bottleneck (down to hidden/16 = 48 for roberta-base, ReLU, up, residual) after every
layer's FFN output (``docs/das.md`` section 4.6). peft has no sequential bottleneck adapter;
its closest is LoRA on the FFN's second projection (``output.dense``), which we use:

* same place: its output is added to the FFN output before dropout, residual and LayerNorm;
* same rank: ``hidden_size // reduction_factor`` (48 for roberta-base);
* different form: a *parallel linear* bottleneck (no ReLU) that reads the FFN's intermediate
  activation (``intermediate_size`` wide) instead of the FFN output, so it has
  ``r * (intermediate + hidden)`` parameters per layer (2.5x the pfeiffer adapter's ``2 * r * hidden``);
* both start as the identity (LoRA's B is zero; pfeiffer's weights are near zero); ``lora_alpha = r``
  keeps the adapter's scale at 1, as a plain bottleneck has.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from benchmark.errors import DapbenchError
from benchmark.method import FinetuneContext
from benchmark.modeling import encoder_of, layer_modules, mlm_head_of, out_axis, quiet_transformers


def ffn_output_module_names(model: nn.Module) -> list[str]:
    """Full names of every layer's FFN output projection, found through the module map."""
    targets = {id(layer.output) for layer in layer_modules(model)}
    return [name for name, module in model.named_modules() if id(module) in targets]


def inject_ffn_adapters(model: nn.Module, names: list[str], reduction_factor: int) -> nn.Module:
    """Add one LoRA adapter per name (in place, no wrapper) on every FFN output projection."""
    from peft import LoraConfig, inject_adapter_in_model

    rank = model.config.hidden_size // reduction_factor
    if rank < 1:
        raise DapbenchError(
            f"reduction_factor {reduction_factor} leaves no adapter units for hidden size {model.config.hidden_size}",
            "use a smaller reduction_factor",
        )
    conv1d = any(out_axis(layer.output) == 1 for layer in layer_modules(model))  # GPT-2's Conv1D: weight in x out
    config = LoraConfig(
        r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=ffn_output_module_names(model), fan_in_fan_out=conv1d
    )
    with warnings.catch_warnings():
        # peft warns when a second adapter is injected into the same model; several experts are the point.
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        for name in names:
            model = inject_adapter_in_model(config, model, adapter_name=name)
    return model


def activate_adapter(model: nn.Module, name: str) -> None:
    """Route every adapted layer through adapter ``name`` only."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.set_adapter(name)


def activate_adapters(model: nn.Module, names: list[str]) -> None:
    """Route every adapted layer through the adapters ``names`` together (their outputs summed)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.set_adapter(list(names))


def adapter_parameters(model: nn.Module, name: str) -> list[tuple[str, nn.Parameter]]:
    """The named parameters of adapter ``name``."""
    return [(n, p) for n, p in model.named_parameters() if ".lora_" in n and f".{name}." in n]


def head_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The MLM head's own parameters; its decoder weight is tied to the word embeddings and belongs
    to the (frozen) encoder, as in adapter-transformers' ``train_adapter``."""
    prefix = next(name for name, child in model.named_children() if child is mlm_head_of(model))
    return [(n, p) for n, p in model.named_parameters() if n.startswith(prefix + ".")]


def train_only(model: nn.Module, params: list[tuple[str, nn.Parameter]]) -> None:
    """Freeze every parameter except ``params``."""
    keep = {id(p) for _, p in params}
    for param in model.parameters():
        param.requires_grad_(id(param) in keep)


def classifier_with_dap_encoder(ctx: FinetuneContext, prepare: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """A sequence classifier (fresh head) whose encoder has the DAP model's surgery and weights.

    ``from_pretrained`` cannot read method-added tensors into a plain classifier, so the classifier
    is built, ``prepare`` applies the same surgery (adapters, prompts), and the whole encoder state is
    copied from the DAP model. Only the classifier's pooler, absent from masked LMs, may stay new.
    """
    from transformers import AutoModelForSequenceClassification

    with quiet_transformers():
        model = AutoModelForSequenceClassification.from_pretrained(
            ctx.checkpoint_dir, num_labels=ctx.num_labels, dtype=torch.float32
        )  # fp32 as in DAP, whatever the checkpoint stores
    model = prepare(model)
    missing, unexpected = encoder_of(model).load_state_dict(encoder_of(ctx.model).state_dict(), strict=False)
    missing = [name for name in missing if not name.startswith("pooler.")]
    if missing or unexpected:
        raise DapbenchError(
            f"the classifier's encoder does not match the DAP model: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}",
            "make finetune_model apply the same surgery as setup",
        )
    for param in model.parameters():
        param.requires_grad_(True)
    return model
