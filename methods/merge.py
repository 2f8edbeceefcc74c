"""Merge: every domain is pre-trained from the base model on its own, and the model evaluated after domain t is the
merge of the t + 1 per-domain models trained so far (issue #50: merging of independently adapted models as an
alternative to sequential training, e.g. Ilharco et al. 2023, task arithmetic; Yadav et al. 2023, TIES; Yu et al.
2024, DARE; merging continually pre-trained experts, arXiv 2511.02451).

Each domain's task vector is tau_k = theta_k - theta_base over every trained parameter. After domain t the merged
model is ``theta_base + merge(tau_0 .. tau_t)``, with ``merge`` one of PEFT's tensor merges
(``peft.utils.merge_utils``), applied to each weight tensor as PEFT and mergekit do:

- ``task_arithmetic``: sum_k w_k tau_k;
- ``ties``: each tau_k trimmed to its ``density`` largest magnitudes, the sign of every entry elected (``total``: the
  sign of the sum; ``frequency``: the more frequent sign), then the mean of the weighted entries that agree with it;
- ``dare_linear``: each tau_k with entries dropped at random (kept with probability ``density``) and rescaled by
  1 / density, then summed with weights;
- ``dare_ties``: DARE's random drop, then TIES' sign election and disjoint mean.

``scale`` is every task vector's weight w_k; None makes the merge a mean: w_k = 1 / (t + 1) for the summing merges
(the merged model of one domain is then that domain's model, and later ones average the per-domain models) and
w_k = 1 for the TIES merges, whose disjoint merge already averages. DARE's random drop is seeded by the run seed
and the domain, apart from the run's random streams. The merged weights are what the held-out losses measure, the
checkpoint keeps and the end tasks start from; the next domain starts from the base model again. The task vectors
are the method's state (one model's worth of float32 per domain seen).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from benchmark.errors import DapbenchError
from benchmark.method import ContinualMethod, DomainContext, MethodConfig
from benchmark.modeling import load_lm
from benchmark.settings import setting

MERGES = ("task_arithmetic", "ties", "dare_linear", "dare_ties")
"""The merges of PEFT's ``merge_utils`` the method offers (``merge.how``)."""
DISJOINT = ("ties", "dare_ties")
"""Merges whose last step is a disjoint mean (their default weight is 1, not 1 / n)."""


@dataclass(frozen=True)
class MergeConfig(MethodConfig):
    """Merge options."""

    how: str = setting("task_arithmetic", choices=MERGES)
    """The merge of the per-domain task vectors."""
    scale: float | None = setting(None, low=0, low_open=True, high=100)
    """The weight of every task vector (the papers' lambda); None: the merge is a mean (see the module docstring)."""
    density: float = setting(0.2, low=0, low_open=True, high=1)
    """TIES and DARE: the share of each task vector's entries kept (TIES keeps the top 20% in its paper)."""
    majority_sign: str = setting("total", choices=("total", "frequency"))
    """TIES: how the sign of every entry is elected."""

    def check_model(self, model_config) -> None:
        """A trimming or dropping merge keeps, in expectation, at least one entry of the model's smallest merged
        tensors (a layer's bias or norm, ``hidden_size`` entries): below that it keeps nothing (TIES) or rescales
        by ``1 / density`` past any float (DARE)."""
        width = getattr(model_config, "hidden_size", None)
        if self.how != "task_arithmetic" and width and self.density * width < 1:
            raise DapbenchError(
                f"merge.density={self.density:g} keeps less than one of the {width} entries of this model's smallest"
                " tensors: the merge would keep nothing of them, or rescale them past any float",
                f"set merge.density to at least {1 / width:.2g}",
            )


class Merge(ContinualMethod):
    """Per-domain DAP from the base model; the evaluated model merges the per-domain models seen so far."""

    name: ClassVar[str] = "merge"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = "its merge reads whole weight tensors, which FSDP2 shards"
    config_cls: ClassVar[type[MethodConfig]] = MergeConfig
    config: MergeConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.task_vectors: list[dict[str, torch.Tensor]] = []
        self._base: dict[str, torch.Tensor] | None = None

    def before_domain(self, ctx: DomainContext) -> None:
        """Start the domain from the base weights (the model holds the previous domain's merge)."""
        model = ctx.unwrapped_model()
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(self._base_weights()[name])

    def after_domain(self, ctx: DomainContext) -> None:
        """Keep the domain's task vector and put the merge of every task vector so far into the model."""
        model, base = ctx.unwrapped_model(), self._base_weights()
        with torch.no_grad():
            self.task_vectors.append({n: p.detach().float().cpu() - base[n] for n, p in model.named_parameters()})
            merged = merge_task_vectors(self.task_vectors, self.config, seed=self.env.seed * 1000 + ctx.index)
            for name, param in model.named_parameters():
                param.copy_((base[name] + merged[name]).to(param.dtype))

    def domain_report(self) -> dict[str, Any]:
        """How many per-domain models the evaluated one merges."""
        return {"models_merged": len(self.task_vectors)}

    def _base_weights(self) -> dict[str, torch.Tensor]:
        """The base model's parameters (float32, CPU), read once from ``env.base_model``."""
        if self._base is None:
            base, _ = load_lm(self.env.base_model)
            self._base = {n: p.detach().float().cpu() for n, p in base.named_parameters()}
        return self._base

    def state_dict(self) -> dict[str, Any]:
        """Every task vector so far."""
        return {f"tau{k}/{name}": t for k, vector in enumerate(self.task_vectors) for name, t in vector.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the task vectors."""
        vectors: dict[int, dict[str, torch.Tensor]] = {}
        for key, tensor in state.items():
            index, name = key.split("/", 1)
            vectors.setdefault(int(index[3:]), {})[name] = tensor
        self.task_vectors = [vectors[k] for k in sorted(vectors)]


def merge_task_vectors(vectors: list[dict[str, torch.Tensor]], cfg: MergeConfig, seed: int) -> dict[str, torch.Tensor]:
    """PEFT's ``cfg.how`` merge of ``vectors`` (name -> tensor, one dict per domain), tensor by tensor."""
    from peft.utils import merge_utils

    n = len(vectors)
    scale = cfg.scale if cfg.scale is not None else (1.0 if cfg.how in DISJOINT else 1.0 / n)
    weights = torch.full((n,), scale)
    merged = {}
    with torch.random.fork_rng(
        devices=[]
    ):  # DARE draws its drops from the global RNG: seeded here, the run's streams untouched
        torch.manual_seed(seed)
        for name in vectors[0]:
            tensors = [vector[name] for vector in vectors]
            if cfg.how == "task_arithmetic":
                merged[name] = merge_utils.task_arithmetic(tensors, weights)
            elif cfg.how == "ties":
                merged[name] = merge_utils.ties(tensors, weights, cfg.density, cfg.majority_sign)
            elif cfg.how == "dare_linear":
                merged[name] = merge_utils.dare_linear(tensors, weights, cfg.density)
            else:
                merged[name] = merge_utils.dare_ties(tensors, weights, cfg.density, cfg.majority_sign)
    return merged
