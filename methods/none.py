"""No DAP: fine-tune the base model directly on every end task (the paper's "RoBERTa" row).

The runner skips pre-training (``pretrains=False``); since every row of A[t][k] would fine-tune
the same base model with the same seed, each end task is fine-tuned once and its score fills
its column.
"""

from typing import ClassVar

from benchmark.method import Capabilities, ContinualMethod


class NoDap(ContinualMethod):
    """The base model without domain-adaptive pre-training."""

    name: ClassVar[str] = "none"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = ""
    comparison_role: ClassVar[str | None] = "no_dap"
    capabilities: ClassVar[Capabilities] = Capabilities(pretrains=False)
