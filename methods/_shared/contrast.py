"""The DAS/DGA contrastive knowledge-integration loss (InfoNCE with cosine similarity)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def info_nce(anchor: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor, temperature: float) -> torch.Tensor:
    """Cross-entropy over [cos(anchor_i, positive_j)]_j ++ [cos(anchor_i, negatives_k)]_k, target j = i.

    Row i's positive is ``positive[i]``; every other row of ``positive`` and every row of
    ``negatives`` (the o_prev views) are its negatives.
    """
    a, p, n = (F.normalize(x.float(), dim=-1) for x in (anchor, positive, negatives))
    logits = torch.cat([a @ p.T, a @ n.T], dim=1) / temperature
    return F.cross_entropy(logits, torch.arange(a.shape[0], device=a.device))


def reference_pairing(first: torch.Tensor, second: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference code's pairing defect, for comparison only (``docs/das.md`` section 3.9).

    It stacks the two views as the tiled batch [x_1..x_B, x_1..x_B], reshapes to (-1, 2) and takes
    the two columns, so the "positive" of an anchor is a *different* input; the callee then swaps
    the roles (anchor = odd rows, positive = even rows).
    """
    tiled = torch.cat([first, second], dim=0)
    return tiled[1::2], tiled[0::2]


def gathered(rows: torch.Tensor) -> torch.Tensor:
    """Every process's ``rows`` in rank order, this process's own keeping their gradient and the others' carrying
    none: the reference's all-gather of the contrastive views (``docs/das.md`` section 3.9). Without a
    process group, or with one process, ``rows`` as they are."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return rows
    parts = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, rows.detach().contiguous())
    parts[dist.get_rank()] = rows
    return torch.cat(parts)
