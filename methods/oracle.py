"""Oracle: at every stage t, the base model pre-trained jointly on domains 0..t with the budget a continual run has
spent by then (TiC-LM, Li et al., ACL 2025: the reference that continual methods' regret is measured against).

Stage t starts from the base model and takes (t + 1) x ``dap.steps`` updates of ``dap.batch_size`` chunks drawn
uniformly from the union of the training chunks of domains 0..t (the runner's ``Capabilities.retrains_on_seen``
path): as many tokens as a continual run has trained on after domain t, over the same data, but without an order.
Each stage is a run of its own (its schedule spans its own updates). Its held-out loss matrix L*[t][k] is what the
report's regret compares every row's L[t][k] with, paired by seed; its whole cost is about (T + 1) / 2 times a
continual run's DAP.
"""

from typing import ClassVar

from benchmark.method import Capabilities, ContinualMethod


class Oracle(ContinualMethod):
    """Plain DAP of the base model on the union of the domains seen so far, re-trained at every stage."""

    name: ClassVar[str] = "oracle"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = "it has not been run through the sharded equivalence test (tests/test_sharding.py)"
    capabilities: ClassVar[Capabilities] = Capabilities(retrains_on_seen=True)
