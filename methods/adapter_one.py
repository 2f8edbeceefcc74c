"""Adapter-ONE: a fresh bottleneck adapter per domain on the frozen base model (DAS paper baseline,
Ke et al. 2023, Table 1; reference ``adapter_one``).

Every domain starts from the base model with a new adapter (``independent_per_domain``), so each end
task is scored with its own domain's adapter and forgetting is undefined. Training and fine-tuning
are those of :mod:`methods.adapter_ncl` (adapter + MLM head during DAP, adapter + model at
fine-tuning). The reference would re-create (re-initialise) the adapter at fine-tuning or crash
(``docs/das.md`` section 4.6); we load the trained one, as the paper intends.
"""

from __future__ import annotations

from typing import ClassVar

from benchmark.method import Capabilities
from methods.adapter_ncl import AdapterNCL


class AdapterONE(AdapterNCL):
    """One adapter per domain, each trained from the base model."""

    name: ClassVar[str] = "adapter_one"
    multi_process: ClassVar[bool] = True
    capabilities: ClassVar[Capabilities] = Capabilities(independent_per_domain=True)
