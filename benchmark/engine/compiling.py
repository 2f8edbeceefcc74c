"""Compiled transformer blocks (``dap.compile``): ``torch.compile`` applied block by block, in place."""

from __future__ import annotations

import torch

from benchmark.config import DapConfig
from benchmark.engine.sharding import shard, transformer_blocks


def prepare_blocks(model, dap: DapConfig, device) -> list | None:
    """The stage's blocks as ``dap`` asks: sharded by FSDP2 (returning the parameters left replicated, else None)
    and/or compiled."""
    replicated = shard(model, device) if dap.sharding == "fsdp" else None
    if dap.compile:
        compile_blocks(model)
    return replicated


COMPILED_VARIANTS = 64
"""Compiled variants of a block kept per run (dynamo's ``recompile_limit``)."""


def compile_blocks(model) -> None:
    """Compile every transformer block of ``model`` in place (``nn.Module.compile``: parameter names, hooks and
    checkpoints unchanged). Blocks of one architecture share one compiled graph (parameters are graph inputs), so
    the compile cost is per block shape and mode, not per block; a block compiled before is left as it is.
    Inductor draws random numbers through torch's generator (``fallback_random``), so the seeded dropout of every
    micro-batch (:mod:`benchmark.data.sampling`) is the eager one; dynamo guards on module hooks, so the unit
    gates methods hook into a block for a pass (:mod:`methods._shared.units`) are traced, not skipped."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True
    dynamo_config.skip_nnmodule_hook_guards = False
    # Each mode (train, eval, no_grad) and each set of hooks is one more compiled variant: more than dynamo's
    # default 8 for the hook-heavy methods, past which it would quietly fall back to eager.
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, COMPILED_VARIANTS)
    # The unit gates' hooks (methods._shared.units) close over their layer's index: specialised, every layer of a
    # gated pass would be a variant of its own (at roberta-base's depth DAS's stage compiled for minutes on an H200,
    # issue #29); unspecialised, the index is a graph input and one variant serves every layer.
    dynamo_config.allow_unspec_int_on_nn_module = True
    every = transformer_blocks(model)
    fresh = [block for block in every if getattr(block, "_compiled_call_impl", None) is None]
    if len(fresh) == len(every):  # a new run's model: the last run's variants are of no use
        torch._dynamo.reset()
    for block in fresh:
        block.compile()
