"""Whether an optimizer step runs fused: one kernel per parameter group on CUDA."""

from __future__ import annotations

import torch


def fused_adamw(device: torch.device | str, mixed_precision: str = "no") -> bool:
    """Whether AdamW runs fused: on CUDA, as transformers' ``Trainer`` defaults to (``adamw_torch_fused``), one
    kernel per parameter group instead of a chain of elementwise launches per update; but not under fp16, whose
    gradient scaler then always calls the fused step (it skips an overflowed update inside the kernel), so accelerate
    could no longer report a skipped step and the schedule would not wait for it. On CPU the default (for-each)
    implementation stays, so CPU numbers, and the records made there, keep their numerics."""
    return torch.device(device).type == "cuda" and mixed_precision != "fp16"
