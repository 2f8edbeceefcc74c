"""EWC: elastic weight consolidation for continual DAP (Kirkpatrick et al. 2017; DAS paper baseline).

After each domain the diagonal Fisher of the MLM loss is computed on the domain's probe subset
(batch-mean gradient squared times the batch size, as the reference) and merged with the earlier
domains' Fisher as a running average; the weights at that point are the anchor. During later
domains every step adds ``strength / 2 * sum F (theta - theta*)^2`` over all trainable parameters.
strength = 5000 is the reference's value. Unlike the reference, the Fisher is taken of the MLM loss
alone (the reference's includes the EWC penalty itself, and crashes; ``docs/das.md`` 4.4).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from benchmark.acceleration.sharding import is_sharded, local_part, summed_over_processes
from benchmark.method import ContinualMethod, DomainContext, MethodConfig, StepContext, StepOutput
from benchmark.modeling import mlm_loss
from benchmark.settings import setting
from methods._shared.ewc import diagonal_fisher, ewc_penalty, merge_fisher


@dataclass(frozen=True)
class EWCConfig(MethodConfig):
    """EWC options."""

    strength: float = setting(5000.0, low=0, high=1e12)
    """lambda of the penalty (the reference's value; its comments mention a 500..50000 grid)."""


class EWC(ContinualMethod):
    """MLM plus a quadratic penalty that anchors parameters important to earlier domains."""

    name: ClassVar[str] = "ewc"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = ""
    config_cls: ClassVar[type[MethodConfig]] = EWCConfig
    config: EWCConfig

    def __init__(self, config: EWCConfig, *, env):
        super().__init__(config, env=env)
        self.fisher: dict[str, torch.Tensor] | None = None
        self.anchor: dict[str, torch.Tensor] | None = None
        self._on_device: tuple[dict, dict] | None = None

    def after_domain(self, ctx: DomainContext) -> None:
        """Fisher on the probe subset, merged with the earlier domains'; anchor the current weights."""
        model = ctx.unwrapped_model()
        named = self.trainable_parameters(model)
        new = diagonal_fisher(named, ctx.probe_loader, lambda batch: mlm_loss(model, batch))
        self.fisher = merge_fisher(self.fisher, new, ctx.index)
        self.anchor = {name: p.detach().float().cpu().clone() for name, p in named}
        self._on_device = None

    def training_loss(
        self, batch: Mapping[str, torch.Tensor], outputs: StepOutput, ctx: StepContext
    ) -> dict[str, torch.Tensor]:
        """The EWC penalty (from the second domain on)."""
        if self.fisher is None:
            return {}
        named = self.trainable_parameters(ctx.model)
        if self._on_device is None:  # once per domain: the Fisher and anchor where the parameters live
            self._on_device = tuple(
                {n: _placed(v[n], p) for n, p in named if n in v} for v in (self.fisher, self.anchor)
            )
        fisher, anchor = self._on_device
        shards = [(n, p.to_local()) for n, p in named if is_sharded(p)]
        whole = [(n, p) for n, p in named if not is_sharded(p)]
        penalty = ewc_penalty(whole, fisher, anchor, self.config.strength) if whole else 0
        if shards:
            # Sharded (dap.sharding=fsdp): each process's penalty of the shards it holds; its value is the sum over
            # processes and each shard's gradient stays where FSDP keeps it.
            penalty = penalty + summed_over_processes(ewc_penalty(shards, fisher, anchor, self.config.strength))
        return {"ewc": penalty}

    def state_dict(self) -> dict[str, Any]:
        """Merged Fisher and anchor weights."""
        return {"fisher": self.fisher, "anchor": self.anchor}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore Fisher and anchor."""
        self.fisher, self.anchor = state.get("fisher"), state.get("anchor")
        self._on_device = None


def _placed(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``full`` on the parameter's device, or this process's part of it for a sharded parameter."""
    return local_part(full, param) if is_sharded(param) else full.to(param.device)
