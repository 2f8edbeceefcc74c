"""DGA: domain-adaptive pre-training with general-knowledge preservation (Ke et al., EMNLP 2022).

The single-domain predecessor of DAS, run ONE-style: every domain starts from the base model.
Before training on a domain, the importance of every attention head for general knowledge is the
KL proxy on that domain's probe subset; head gradients are soft-masked by (1 - importance), and
the same contrastive loss as DAS contrasts the full network with the network gated by that
importance (o_prev). Heads only; there is no MLM importance after the domain. The fidelity
switches are DAS's (``methods/das.py``). DGA's original code also gated the embeddings; the issue
and the DAS paper's description of DGA use heads only, and so do we.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from benchmark.method import Capabilities, DomainContext, MethodConfig
from benchmark.settings import setting
from methods._shared.units import UNIT_TYPES
from methods.das import DAS, DASConfig


@dataclass(frozen=True)
class DGAConfig(DASConfig):
    """DAS's options, restricted to attention heads."""

    units: tuple[str, ...] = setting(("head",), choices=UNIT_TYPES)


class DGA(DAS):
    """Head soft-masking by the KL-proxy importance, per domain, from the base model."""

    name: ClassVar[str] = "dga"
    multi_process: ClassVar[bool] = True
    config_cls: ClassVar[type[MethodConfig]] = DGAConfig
    capabilities: ClassVar[Capabilities] = Capabilities(independent_per_domain=True)

    def before_domain(self, ctx: DomainContext) -> None:
        """General-knowledge head importance on this domain's data (the model is the base model)."""
        self.importance = self._normalised(self._general_importance(ctx), ctx)
        self._device_importance = None

    def after_domain(self, ctx: DomainContext) -> None:
        """DGA computes no importance after training."""
