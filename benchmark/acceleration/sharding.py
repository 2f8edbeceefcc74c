"""Sharded DAP training (``--set dap.sharding=fsdp``): parameters, gradients and optimizer state split over the
processes with torch's FSDP2 (``fully_shard``), for models that do not fit one device.

accelerate enables FSDP only for GPU-class distributed types, so the engine applies ``fully_shard`` itself: every
transformer block over a one-dimensional device mesh of the run's processes (gloo on CPU, NCCL on GPUs); what lies
outside the blocks (embeddings, final norm, LM head: a small share of a large model, and the embedding is tied to the
head) stays replicated, its gradients averaged over the processes after each update's backward passes, as DDP would.
The blocks' gradients are reduce-scattered and averaged, micro-batches accumulate without synchronisation until an
update's last, and the run computes what one process computes up to the order of floating-point sums (tested:
``tests/test_sharding.py``). After a stage's updates the full weights are gathered
into an unsharded model for the method's after-domain work, the held-out evaluation and the checkpoint.

A method trains sharded only if its hooks act on shards (``ContinualMethod.fsdp_refusal`` is empty); the others
are refused by name before any work, with their reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from benchmark.modeling import encoder_of, layer_modules

SHARDINGS = ("none", "fsdp")


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks (the parents of its unit modules), each a unit of sharding."""
    from benchmark.modeling import layer_paths

    layer_modules(model)  # an architecture without a module map is a named error here
    return list(encoder_of(model).get_submodule(layer_paths(model.config.model_type)["layers"]))


def shard(model: nn.Module, device: torch.device) -> list[nn.Parameter]:
    """Apply FSDP2 to every transformer block over all processes; return the parameters left replicated (outside
    the blocks), whose gradients :func:`average_replicated` synchronises."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size() if dist.is_initialized() else 1,))
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh)
    return [p for p in model.parameters() if p.requires_grad and not is_sharded(p)]


def average_replicated(params: list[nn.Parameter]) -> None:
    """Average the gradients of the replicated parameters over the processes (what DDP does for them)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for param in params:
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.AVG if dist.get_backend() != "gloo" else dist.ReduceOp.SUM)
            if dist.get_backend() == "gloo":  # gloo has no average
                param.grad.div_(dist.get_world_size())


@contextlib.contextmanager
def accumulating(model: nn.Module) -> Iterator[None]:
    """Inside the block a sharded model accumulates gradients without reduce-scattering them (the micro-batches of
    an update but its last)."""
    blocks = transformer_blocks(model)
    for block in blocks:
        block.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        for block in blocks:
            block.set_requires_gradient_sync(True)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of a sharded model, gathered to full tensors on every process."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a sharded parameter (a DTensor) of a model trained with FSDP."""
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def local_part(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The part of the full tensor ``full`` that this process holds of the sharded parameter ``like``."""
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None).to_local()


def summed_over_processes(local: torch.Tensor) -> torch.Tensor:
    """A per-process partial sum whose value is the sum over every process and whose gradient stays this process's
    own (a penalty on the shards each process holds: FSDP adds each shard's gradient where it lives)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return local
    total = local.detach().clone()
    dist.all_reduce(total)
    return local + (total - local.detach())
