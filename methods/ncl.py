"""NCL: naive continual learning, plain MLM through the domain sequence (DAS paper baseline).

No regulariser and no masking: every hook keeps its default, which is why NCL is the empty
subclass. Domain t starts from the checkpoint after domain t-1.
"""

from typing import ClassVar

from benchmark.method import ContinualMethod


class NCL(ContinualMethod):
    """Sequential MLM training with nothing to prevent forgetting."""

    name: ClassVar[str] = "ncl"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = ""
    comparison_role: ClassVar[str | None] = "naive_continual"
