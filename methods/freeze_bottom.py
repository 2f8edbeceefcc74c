"""Freeze-the-bottom: naive continual DAP with the input embeddings and the bottom k transformer layers frozen
(Zheng et al., "Spurious Forgetting in Continual Learning of Language Models", ICLR 2025).

Zheng et al. find that much of what continual training "forgets" is task alignment held in the lower layers, not
knowledge, and that freezing the bottom layers is a strong baseline against it. Here every parameter of the token
embeddings (and of the LM head tied to them, which is the same tensor) and of transformer layers 0..k-1 is left out
of the DAP optimizer; everything above trains as in NCL. The record's trainable-parameter count says how much
trains. ``layers`` must leave at least one layer training (checked against the model when the run starts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from benchmark.errors import DapbenchError
from benchmark.method import ContinualMethod, MethodConfig
from benchmark.modeling import encoder_of, layer_paths
from benchmark.settings import setting


@dataclass(frozen=True)
class FreezeBottomConfig(MethodConfig):
    """Freeze-the-bottom options."""

    layers: int = setting(1, low=1, high=1000)
    """k: the bottom transformer layers frozen (with the input embeddings)."""

    def check_model(self, model_config) -> None:
        """At least one of the model's layers is left to train."""
        _check_layers(self.layers, getattr(model_config, "num_hidden_layers", None))


class FreezeBottom(ContinualMethod):
    """Sequential DAP with the embeddings and the bottom ``layers`` transformer layers frozen."""

    name: ClassVar[str] = "freeze_bottom"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = "it has not been run through the sharded equivalence test (tests/test_sharding.py)"
    config_cls: ClassVar[type[MethodConfig]] = FreezeBottomConfig
    config: FreezeBottomConfig

    def trainable_parameters(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """Every parameter that requires grad but those of the embeddings and the bottom ``layers`` layers."""
        frozen = {id(p) for p in frozen_parameters(model, self.config.layers)}
        return [(n, p) for n, p in super().trainable_parameters(model) if id(p) not in frozen]


def frozen_parameters(model: nn.Module, layers: int) -> list[nn.Parameter]:
    """The input embeddings' parameters and those of transformer layers ``0..layers-1`` of ``model`` (a named error
    where ``layers`` would freeze every layer, or the architecture has no layer map)."""
    try:
        paths = layer_paths(model.config.model_type)
    except DapbenchError as exc:
        raise DapbenchError(f"freeze_bottom: {exc.problem}", exc.fix) from None
    stack = encoder_of(model).get_submodule(paths["layers"])
    _check_layers(layers, len(stack))
    modules = [model.get_input_embeddings(), *list(stack)[:layers]]
    return [p for module in modules for p in module.parameters()]


def _check_layers(layers: int, available: int | None) -> None:
    """A named error where freezing ``layers`` would leave none of the model's ``available`` layers training."""
    if available is not None and layers >= available:
        raise DapbenchError(
            f"freeze_bottom.layers={layers} freezes every one of the model's {available} layers",
            f"set --set freeze_bottom.layers= to at most {available - 1}",
        )
