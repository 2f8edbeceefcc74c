"""LoRA merge: one LoRA module per domain, each trained on the frozen base model alone, and the model evaluated after
domain t is the base plus PEFT's weighted merge of the t + 1 modules trained so far (issue #50: merging of
independently adapted models as an alternative to sequential training; the adapter counterpart of ``merge``, whose
per-domain models are whole).

Training is DoMIX's (:mod:`methods.domix`): domain t's module (rank ``rank``, scale ``alpha / rank``, on every
projection of every layer) trains alone on the frozen base, MLM head frozen, so it does not depend on the earlier
domains. After the domain, PEFT's ``LoraModel.add_weighted_adapter`` merges ``domain0`` .. ``domain<t>`` into one
adapter by ``how``:

- ``cat``: the modules side by side, so the merged update is exactly ``sum_k w_k s_k B_k A_k`` (task arithmetic on
  the modules' weight updates; PEFT: exact, its rank the sum of theirs);
- ``linear``: ``A = sum_k sqrt(w_k s_k) A_k`` and ``B = sum_k sqrt(w_k s_k) B_k`` (PEFT: "a very rough
  approximation": cross terms ``B_j A_k`` enter);
- ``svd``: the exact update truncated by SVD to rank ``rank``;
- ``ties``, ``dare_linear``, ``dare_ties``, ``magnitude_prune``: PEFT's TIES, DARE and magnitude pruning applied to
  the ``A`` and ``B`` factors (``density``, ``majority_sign``), and their ``*_svd`` forms, applied to the full
  updates and truncated to rank ``rank``.

``scale`` is every module's weight w_k; None makes the merge a mean: w_k = 1 / (t + 1), except for the TIES merges,
whose disjoint mean already averages (w_k = 1). PEFT writes the merge as a new adapter (rank: the sum of the modules'
for ``cat``, ``rank`` otherwise; scale 1); its factors are copied, zero-padded, into a ``merged`` adapter of rank
``num_domains * rank`` that every model of the method carries, so the checkpoint keeps the merge and the base
weights are never changed. After a domain only ``merged`` is on: the held-out losses, the checkpoint and the end
tasks (the classifier with the same adapters, ``merged`` on, everything but the domain modules fine-tuned, as a
merged model is) see base + merge; while domain t trains only its module is on. With one module every merge is
PEFT's ``linear`` of one adapter: that domain's own model. DARE's random drop draws from a generator seeded by the
run seed and the domain.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from benchmark.method import DomainContext, FinetuneContext, MethodConfig
from benchmark.settings import setting
from methods._shared.adapters import adapter_parameters, classifier_with_dap_encoder, train_only
from methods.domix import DoMIX, DoMIXConfig, domain_lora_config, module_name

MERGES = (
    "cat",
    "linear",
    "svd",
    "ties",
    "ties_svd",
    "dare_linear",
    "dare_linear_svd",
    "dare_ties",
    "dare_ties_svd",
    "magnitude_prune",
    "magnitude_prune_svd",
)
"""PEFT's ``add_weighted_adapter`` combination types (``lora_merge.how``)."""
MERGED = "merged"
"""The adapter every model of the method carries for the merge (rank ``num_domains * rank``, scale 1)."""
SCRATCH = "merging"
"""The adapter PEFT writes a merge into before it is copied into :data:`MERGED` (then deleted)."""


def inject_modules(model: nn.Module, cfg: LoraMergeConfig, num_domains: int):
    """A PEFT ``LoraModel`` over ``model`` (adapted in place) with a module per domain and the :data:`MERGED` adapter
    (zero update at start), only :data:`MERGED` on; returns the tuner, which merges."""
    from peft.tuners.lora import LoraModel

    lora = domain_lora_config(model, cfg)
    tuner = LoraModel(model, lora, module_name(0))
    width = num_domains * cfg.rank
    configs = {module_name(k): lora for k in range(1, num_domains)}
    configs[MERGED] = dataclasses.replace(lora, r=width, lora_alpha=width)
    for name, config in configs.items():
        tuner.peft_config[name] = config
        tuner.inject_adapter(model, name)
    tuner.set_adapter(MERGED)
    return tuner


@dataclass(frozen=True)
class LoraMergeConfig(DoMIXConfig):
    """LoRA merge options (``rank``, ``alpha`` and ``lora_lr`` of every domain module are DoMIX's; ``rank`` is also
    the rank of the ``*_svd`` merges)."""

    @classmethod
    def section(cls) -> str:
        """Errors name these options as the method is named (``lora_merge.how``)."""
        return "lora_merge"

    how: str = setting("cat", choices=MERGES)
    """PEFT's combination type (see the module docstring); ``cat`` is the exact weighted sum of the updates."""
    scale: float | None = setting(None, low=0, low_open=True, high=100)
    """Every module's weight w_k; None: the merge is a mean (see the module docstring)."""
    density: float = setting(0.2, low=0, low_open=True, high=1)
    """TIES, DARE and magnitude pruning: the share of each factor's (or update's) entries kept."""
    majority_sign: str = setting("total", choices=("total", "frequency"))
    """TIES: how the sign of every entry is elected."""


class LoraMerge(DoMIX):
    """Per-domain LoRA modules on the frozen base, trained as DoMIX's; the evaluated model is the base plus their
    PEFT merge (no bridge)."""

    name: ClassVar[str] = "lora_merge"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = "its merge reads whole weight tensors, which FSDP2 shards"
    config_cls: ClassVar[type[MethodConfig]] = LoraMergeConfig
    config: LoraMergeConfig

    _tuner = None
    """The PEFT ``LoraModel`` over the model of the last ``setup`` (it merges)."""

    def setup(self, model: nn.Module) -> nn.Module:
        """Inject a module per domain and the merged adapter (:func:`inject_modules`, only ``merged`` on: a loaded
        checkpoint is base + merge); nothing trains yet."""
        self._tuner = inject_modules(model, self.config, self.env.num_domains)
        train_only(model, [])
        return model

    def before_domain(self, ctx: DomainContext) -> None:
        """Train this domain's module alone on the base weights (the merge off)."""
        model = ctx.unwrapped_model()
        self._tuner.set_adapter(module_name(ctx.index))
        train_only(model, adapter_parameters(model, module_name(ctx.index)))

    def after_domain(self, ctx: DomainContext) -> None:
        """Merge every module trained so far into the ``merged`` adapter and switch it on alone."""
        self.trained = ctx.index + 1
        model = ctx.unwrapped_model()
        merge_modules(self._tuner, self.trained, self.config, seed=self.env.seed * 1000 + ctx.index)
        train_only(model, [])

    def finetune_model(self, ctx: FinetuneContext) -> nn.Module:
        """A classifier with the same adapters, ``merged`` on; everything but the domain modules trains (the merged
        model fully fine-tuned)."""
        model = classifier_with_dap_encoder(ctx, lambda m: inject_modules(m, self.config, self.env.num_domains).model)
        for name, param in model.named_parameters():
            param.requires_grad_(".lora_" not in name or f".{MERGED}." in name)
        return model

    def finetune_report(self, model: nn.Module) -> dict[str, Any]:
        """Nothing: the merge has no bridge to report."""
        return {}

    def domain_report(self) -> dict[str, Any]:
        """How many per-domain modules the evaluated model merges."""
        return {"modules_merged": self.trained}


def merge_modules(tuner, count: int, cfg: LoraMergeConfig, seed: int) -> None:
    """Merge modules ``domain0`` .. ``domain<count - 1>`` of ``tuner`` (a PEFT ``LoraModel``) by ``cfg.how`` with
    PEFT's ``add_weighted_adapter``, copy the merge into the :data:`MERGED` adapter (zero-padded to its rank) and switch
    that adapter on alone."""
    from peft.tuners.lora import LoraLayer

    names = [module_name(k) for k in range(count)]
    scale = cfg.scale if cfg.scale is not None else (1.0 if "ties" in cfg.how else 1.0 / count)
    options = {"density": cfg.density} if cfg.how not in ("cat", "linear", "svd") else {}
    device = next(tuner.model.parameters()).device
    # DARE's random drop draws on the modules' device: that generator (and the CPU's) is seeded for the merge and
    # put back after it, so the run's own streams are as they were.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        tuner.add_weighted_adapter(
            names,
            [scale] * count,
            SCRATCH,
            combination_type=cfg.how,
            svd_rank=cfg.rank,
            majority_sign_method=cfg.majority_sign,
            **options,
        )
    with torch.no_grad():
        for layer in tuner.model.modules():
            if isinstance(layer, LoraLayer) and SCRATCH in layer.lora_A:
                _copy_padded(layer, SCRATCH, MERGED)
    tuner.delete_adapter(SCRATCH)
    tuner.set_adapter(MERGED)


def _copy_padded(layer, source: str, target: str) -> None:
    """Adapter ``source``'s factors into ``target``'s, whose rank is at least as large (the rest zero), rescaled so
    that ``target`` computes ``source``'s update."""
    a, b = layer.lora_A[source].weight, layer.lora_B[source].weight
    ratio = layer.scaling[source] / layer.scaling[target]
    into_a, into_b = layer.lora_A[target].weight, layer.lora_B[target].weight
    into_a.zero_()
    into_b.zero_()
    into_a[: a.shape[0]] = a
    into_b[:, : b.shape[1]] = b * ratio
