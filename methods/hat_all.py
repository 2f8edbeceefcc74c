"""HAT-All: HAT during DAP, the full network at fine-tuning (the DAS paper's "HAT-All" baseline).

DAP is exactly :mod:`methods.hat` (task-gated heads and FFN neurons, annealed hard attention,
attention regulariser, gradient blocking by the cumulative mask). The end task is then fine-tuned
on the whole network without any mask, so no domain id is needed; the held-out MLM loss is likewise
measured with the full network.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from benchmark.method import Capabilities, ContinualMethod, FinetuneContext
from methods.hat import HAT


class HATAll(HAT):
    """HAT training, full-network fine-tuning."""

    name: ClassVar[str] = "hat_all"
    multi_process: ClassVar[bool] = True
    capabilities: ClassVar[Capabilities] = Capabilities()
    full_network_after_domain: ClassVar[bool] = True
    leaderboard_note: ClassVar[str] = "held-out losses of every column use the full network, as it fine-tunes."

    def finetune_model(self, ctx: FinetuneContext) -> nn.Module:
        """A fresh-head classifier on the checkpoint, without gates."""
        return ContinualMethod.finetune_model(self, ctx)
