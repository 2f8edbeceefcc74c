"""How a stage's model runs fast without computing anything else: compiled transformer blocks (``dap.compile``,
``torch.compile`` applied block by block, in place) and, on CUDA, the output projection over an aligned vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmark.acceleration.sharding import shard, transformer_blocks
from benchmark.config import DapConfig


def prepare_blocks(model, dap: DapConfig, device) -> list | None:
    """The stage's blocks as ``dap`` asks: sharded by FSDP2 (returning the parameters left replicated, else None)
    and/or compiled."""
    replicated = shard(model, device) if dap.sharding == "fsdp" else None
    if device.type == "cuda" and replicated is None:
        align_vocabulary(model)
    if dap.compile:
        compile_blocks(model)
    return replicated


COMPILED_VARIANTS = 64
"""Compiled variants of a block kept per run (dynamo's ``recompile_limit``)."""


def compile_blocks(model, keep_variants: bool = False) -> None:
    """Compile every transformer block of ``model`` in place (``nn.Module.compile``: parameter names, hooks and
    checkpoints unchanged). Blocks of one architecture share one compiled graph (parameters are graph inputs), so
    the compile cost is per block shape and mode, not per block; a block compiled before is left as it is. A new
    run's model drops the variants compiled for the last one, unless ``keep_variants`` (a fine-tune's fresh
    classifier, whose blocks are those of the fine-tune before it: a run's 6 to 21 fine-tunes compile once).
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
    if len(fresh) == len(every) and not keep_variants:  # a new run's model: the last run's variants are of no use
        torch._dynamo.reset()
    for block in fresh:
        block.compile()


VOCABULARY_ALIGNMENT = 64
"""The output projection's rows are padded to a multiple of this on CUDA (:func:`align_vocabulary`)."""


class VocabularyAlignedLinear(nn.Linear):
    """An output projection computed over its rows padded with zeros to a multiple of :data:`VOCABULARY_ALIGNMENT`,
    the padded logits cut off: the same logits and gradients, other GEMM kernels. Why: with roberta-base's 50265 rows
    (not a multiple of 8) a bf16 product has no 16-byte-aligned leading dimension, and cuBLAS falls back to pre-Hopper
    kernels: on a lent H200 the MLM head's three products took 11.8 ms of an 80 ms compiled NCL update at 119 TFLOP/s
    (``docs/measurements.md``). The parameters, their names and the state dict are the ``nn.Linear``'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of ``x``: the padded projection's, cut to the vocabulary."""
        pad = -self.out_features % VOCABULARY_ALIGNMENT
        weight = F.pad(self.weight, (0, 0, 0, pad))
        bias = None if self.bias is None else F.pad(self.bias, (0, pad))
        return F.linear(x, weight, bias)[..., : self.out_features]


def align_vocabulary(model: nn.Module) -> None:
    """Compute ``model``'s output projection as :class:`VocabularyAlignedLinear` (in place: the module's class is
    swapped, so copies of the model, its checkpoints and hooks stay as they were) where its vocabulary is not a
    multiple of :data:`VOCABULARY_ALIGNMENT`; used on CUDA only, so CPU numbers are untouched."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is nn.Linear and head.out_features % VOCABULARY_ALIGNMENT:
        head.__class__ = VocabularyAlignedLinear
