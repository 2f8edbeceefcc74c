"""ONE: every domain is DAP-trained separately from the base model (DAS paper baseline).

Each end task is scored with its own domain's model, so the final average is the diagonal of
A[t][k] and forgetting is undefined (``independent_per_domain``), as in the reference's result
tools.
"""

from typing import ClassVar

from benchmark.method import Capabilities, ContinualMethod


class ONE(ContinualMethod):
    """One independently DAP-trained model per domain."""

    name: ClassVar[str] = "one"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities(independent_per_domain=True)
