"""Pool: one model DAP-trained on the union of every domain's corpus (the non-continual reference row
of the DAS paper, Ke et al. 2023, Table 1).

It is the upper reference that continual methods are compared with: no domain order, so nothing to
forget. The runner's joint-training path (``Capabilities.joint_training``) samples batches from the
union of all training chunks for ``T x dap.steps`` updates, the token budget of a whole continual
run, and fine-tunes the single final model on every end task. Only the last row of A[t][k] exists,
so forgetting is undefined; the held-out MLM-loss matrix likewise has only its last row.
"""

from typing import ClassVar

from benchmark.method import Capabilities, ContinualMethod


class Pool(ContinualMethod):
    """Plain MLM on the union of all domain corpora, trained once."""

    name: ClassVar[str] = "pool"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities(joint_training=True)
