"""Run under ``torchrun --nproc_per_node 2``: the reference's all-gathered contrastive negatives
(``methods._shared.contrast.gathered``) against the loss over the concatenation of every process's views."""

import json
import sys

import torch
import torch.distributed as dist

from methods._shared.contrast import gathered, info_nce


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(rank)
    views = [torch.randn(8, 16, generator=generator, requires_grad=True) for _ in range(3)]
    micro = info_nce(*views, temperature=0.05)
    everything = info_nce(*(gathered(v) for v in views), temperature=0.05)
    everything.backward()
    parts = [[torch.empty(8, 16) for _ in range(world)] for _ in views]
    for part, view in zip(parts, views, strict=True):
        dist.all_gather(part, view.detach())
    union = info_nce(*(torch.cat(part) for part in parts), temperature=0.05)
    result = {
        "rank": rank,
        "micro": float(micro),
        "all_processes": float(everything),
        "union": float(union),
        "local_grad": all(v.grad is not None and v.grad.abs().sum() > 0 for v in views),
    }
    with open(f"{out}-{rank}.json", "w") as handle:
        json.dump(result, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
