"""DAS: continual DAP with soft-masking (Ke et al., "Continual Pre-training of Language Models", ICLR 2023).

Per domain t: the gradients of every attention head and FFN neuron (intermediate and output) are
multiplied by (1 - I), where I is the accumulated importance: the element-wise max of the general
knowledge importance (the KL proxy on domain 0, before any training) and the MLM importance of every
earlier domain, each normalised per layer (z-score, tanh, abs). A contrastive loss pulls the full
network's representation of an input towards the same input under another dropout mask and away
from the other inputs and from the o_prev views (the network gated by I). Total loss = MLM +
lambda * contrast.

Defaults follow the paper. Every point where the public reference code behaves differently is a
named switch; ``fidelity="reference"`` turns them all to the code's behaviour
(``docs/das.md`` section 8.1):

=============================  ==================================  ======================================
switch                         paper (default)                     reference code
=============================  ==================================  ======================================
``contrast_pairing``           ``same_input`` (two dropout views)  ``adjacent`` (tiled rows, mispaired)
``kl_proxy``                   ``dropout_vocab`` (train mode)      ``eval_hidden`` (eval mode; KL == 0)
``mlm_importance_input``       ``masked``                          ``unmasked``
``importance_abs``             ``per_example`` (|grad| per input)  ``after_tanh`` (signed mean)
``importance_norm``            ``positive_tanh`` (order kept)      ``abs_tanh`` (|tanh(z)|)
``importance_accumulation``    ``per_batch`` (grads zeroed)        ``cumulative`` (never zeroed)
``qkv_mask_axis``              ``output`` (per-head rows)          ``input`` (columns)
``mask_attn_out_bias``         False                               True (head vector on hidden dims)
``contrast_negatives``         ``micro_batch``                     ``all_processes`` (all-gathered views)
=============================  ==================================  ======================================

``importance_abs=per_batch`` (|grad| of each batch's mean loss) sits between the two.

The reference's KL proxy (``kl_proxy=eval_hidden``) is computed as the reference computes it: two identical
eval-mode passes, ``kl_div(log_softmax(teacher), softmax(student))`` over the token axis of the final hidden
states, summed and divided by the batch size. The two passes are equal, so the loss is zero up to rounding, but
``log(softmax(x))`` and ``log_softmax(x)`` round differently: the gate gradients are rounding noise, and the
reference's normalisation (``importance_norm=abs_tanh``: per-layer z-score without an epsilon, tanh, abs) spreads
that noise over [0, 1). So in reference mode the general-knowledge importance is noise, not zero: it soft-masks
the first domain and floors every later maximum, as in the reference code. ``contrast_negatives=all_processes``
all-gathers the three views of every process as the reference does (the local rows keep their gradient), so its
numbers depend on the process count, which then enters the run id; with one process it is the micro-batch.
``importance_norm=positive_tanh`` is tanh of the per-layer z-score with units below their layer's mean
at 0: the paper's |tanh(z)| on the units that matter, without the abs that makes units far *below* the
mean important too (which leaves almost no rank order between raw and normalised scores).

Beyond the paper: ``mask_target=update`` soft-masks the optimizer's update (the step AdamW took, scaled
by 1 - I) instead of the gradient. Under Adam a constant gradient scale c cancels in m / sqrt(v) unless
c * sqrt(v) approaches eps, so gradient masking damps little; every DAS record carries the measured
damping per importance bin (``domain_report``), the mean |update| relative to the unmasked update of
the same units at the same optimizer state. ``other_params=freeze`` keeps the parameters that no unit
owns (embeddings and the tied decoder, LayerNorms, the MLM head) out of DAP training; the paper and
the reference train them freely (``train``).

On a decoder (GPT-2, Llama/Qwen style) the same algorithm runs on the decoder's units: the query heads (under
grouped-query attention a key/value head takes the smallest keep, 1 - I, of the query heads that read it) and the
FFN neurons (a gated MLP's gate and up rows and down column together). The MLM loss is the next-token loss, the
importance of a domain is its gradient through the unit gates, and the dropout views of the contrastive loss and
the KL proxy use attention dropout 0.1 where the decoder's config has none (``methods/_shared/dropout.py``), so the
two views differ as the paper's encoder views do.

Not reproduced: the reference leaks the importance pass's parameter gradients into the first
update (negligible, and zero with its KL proxy) and trains past its last step with LR 0 (same
weights). Ablation presets (``ablation=``): ``no_init`` (no general-knowledge importance),
``no_softmask`` (the paper's "w/o softmask" row: no mask and no o_prev negatives, so the contrast is
between the two dropout views alone), ``random_importance`` (each source's normalised importance
shuffled within its layers: the same mask strength, no unit information), ``no_contrast``, ``domain_contrast``
(o_prev gated by the earlier domains' importance only, without the general one: our reading of the
paper's "domain-specific" row), ``general_mlm`` / ``general_kl`` (general importance from the
general corpus with the MLM loss or the KL proxy, the paper's Wiki+MLM / Wiki+KL rows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from benchmark.errors import DapbenchError
from benchmark.method import ContinualMethod, DomainContext, MethodConfig, StepContext, StepOutput
from benchmark.modeling import encoder_of, layer_modules, mean_pool
from benchmark.settings import setting
from methods._shared import importance_study
from methods._shared.contrast import gathered, info_nce, reference_pairing
from methods._shared.dropout import dropout_views
from methods._shared.importance import gate_importance, kl_proxy_loss, mlm_importance_loss, reference_kl_proxy_loss
from methods._shared.softmask import (
    NORMALISATIONS,
    MaskedTensor,
    accumulate_importance,
    damping_by_importance,
    importance_histogram,
    mask_gradient,
    masked_tensors,
    normalize_importance,
    shuffle_within_layers,
    soft_mask_updates,
)
from methods._shared.units import UNIT_TYPES, gated, unit_shapes

PAPER = {
    "contrast_pairing": "same_input",
    "kl_proxy": "dropout_vocab",
    "mlm_importance_input": "masked",
    "importance_abs": "per_example",
    "importance_norm": "positive_tanh",
    "importance_accumulation": "per_batch",
    "qkv_mask_axis": "output",
    "mask_attn_out_bias": False,
    "contrast_negatives": "micro_batch",
}
REFERENCE = {
    "contrast_pairing": "adjacent",
    "kl_proxy": "eval_hidden",
    "mlm_importance_input": "unmasked",
    "importance_abs": "after_tanh",
    "importance_norm": "abs_tanh",
    "importance_accumulation": "cumulative",
    "qkv_mask_axis": "input",
    "mask_attn_out_bias": True,
    "contrast_negatives": "all_processes",
}
CHOICES = {
    "contrast_pairing": ("same_input", "adjacent"),
    "kl_proxy": ("dropout_vocab", "eval_hidden"),
    "mlm_importance_input": ("masked", "unmasked"),
    "importance_abs": ("per_example", "per_batch", "after_tanh"),
    "importance_norm": NORMALISATIONS,
    "importance_accumulation": ("per_batch", "cumulative"),
    "qkv_mask_axis": ("output", "input"),
    "mask_attn_out_bias": (False, True),
    "contrast_negatives": ("micro_batch", "all_processes"),
}
PRESETS = {"paper": PAPER, "reference": REFERENCE}
ABLATIONS = (
    "none",
    "no_init",
    "no_softmask",
    "random_importance",
    "no_contrast",
    "domain_contrast",
    "general_mlm",
    "general_kl",
)


@dataclass(frozen=True)
class DASConfig(MethodConfig):
    """DAS options; a switch left at None takes its value from the ``fidelity`` preset."""

    fidelity: str = setting("paper", choices=("paper", "reference"))
    """``paper`` (default) or ``reference`` (the public code's behaviour)."""
    ablation: str = setting("none", choices=ABLATIONS)
    """One of the paper's ablations (``none``: the full method): without the initialisation, the soft-masking, the
    contrast, with random importance, a domain-level contrast, or general importance from the MLM or KL alone."""
    contrast_lambda: float = setting(1.0, low=0, high=1000)
    """The weight of the contrastive loss beside the MLM loss."""
    temperature: float = setting(0.05, low=0, low_open=True, high=100)
    """The contrastive loss's softmax temperature."""
    units: tuple[str, ...] = setting(UNIT_TYPES, choices=UNIT_TYPES)
    """The unit types that get importance and a soft mask (attention heads, intermediate and output neurons)."""
    contrast_pairing: str | None = setting(None, choices=CHOICES["contrast_pairing"])
    """``same_input``: the positive is the same input under another dropout mask (paper); ``adjacent``: tiled rows,
    the positive another input (reference)."""
    kl_proxy: str | None = setting(None, choices=CHOICES["kl_proxy"])
    """The general importance's proxy: ``dropout_vocab``, KL of two dropout passes' MLM distributions (paper);
    ``eval_hidden``, a token-axis softmax of two identical eval-mode passes' hidden states (reference)."""
    mlm_importance_input: str | None = setting(None, choices=CHOICES["mlm_importance_input"])
    """Whether the domain importance's MLM loss reads ``masked`` (paper) or ``unmasked`` (reference) inputs."""
    importance_abs: str | None = setting(None, choices=CHOICES["importance_abs"])
    """Where the absolute value of the gate gradient is taken: ``per_example`` (paper), ``per_batch``, or
    ``after_tanh`` (reference: the signed mean)."""
    importance_norm: str | None = setting(None, choices=CHOICES["importance_norm"])
    """How raw importance becomes a soft mask: ``positive_tanh`` of the per-layer z-score (paper), ``abs_tanh``
    (reference), or another normalisation."""
    importance_accumulation: str | None = setting(None, choices=CHOICES["importance_accumulation"])
    """``per_batch`` (paper) or ``cumulative`` (reference: the gate gradients never zeroed)."""
    qkv_mask_axis: str | None = setting(None, choices=CHOICES["qkv_mask_axis"])
    """Which axis of the query, key and value weights a head's mask scales: ``output`` rows (paper) or ``input``
    columns (reference)."""
    mask_attn_out_bias: bool | None = None
    """Whether the attention output's bias is masked too (reference) or not (paper)."""
    contrast_negatives: str | None = setting(None, choices=CHOICES["contrast_negatives"])
    """The contrast's negatives: the other rows of the process's ``micro_batch`` (paper) or the views of
    ``all_processes``, all-gathered (reference)."""
    mask_target: str = setting("gradient", choices=("gradient", "update"))
    """``gradient`` (the paper: grad *= 1 - I before the optimizer) or ``update`` (beyond the paper: the
    optimizer's step is scaled by 1 - I after it is taken)."""
    other_params: str = setting("train", choices=("train", "freeze"))
    """Parameters no unit owns (embeddings, LayerNorms, MLM head): ``train`` them freely (paper) or ``freeze``."""

    def __post_init__(self):
        super().__post_init__()
        if self.switch("importance_abs") == "per_example" and self.switch("importance_accumulation") == "cumulative":
            raise DapbenchError(
                "importance_abs=per_example cannot accumulate cumulatively (that is the reference's per-batch defect)",
                "use importance_accumulation=per_batch, or importance_abs=per_batch/after_tanh",
            )
        if not self.units or len(set(self.units)) != len(self.units):
            raise DapbenchError(f"invalid units {self.units}", f"name each of {UNIT_TYPES} at most once")

    def switch(self, name: str) -> Any:
        """The effective value of a fidelity switch."""
        value = getattr(self, name)
        return value if value is not None else (PAPER if self.fidelity == "paper" else REFERENCE)[name]

    def canonical_options(self) -> dict[str, Any]:
        """One spelling per behaviour: the switches' effective values against the preset they differ least from
        (``fidelity=reference`` rather than eight reference switches; a switch set to its preset's value is left
        out), then every other option that differs from its default."""
        effective = {name: self.switch(name) for name in PAPER}
        away = {name: sum(effective[k] != preset[k] for k in PAPER) for name, preset in PRESETS.items()}
        preset = min(PRESETS, key=lambda name: (away[name], name != "paper"))
        out: dict[str, Any] = {"fidelity": preset} if preset != "paper" else {}
        for field in dataclasses.fields(self):
            if field.name == "fidelity":
                continue
            if field.name in PAPER:
                if effective[field.name] != PRESETS[preset][field.name]:
                    out[field.name] = effective[field.name]
            elif getattr(self, field.name) != field.default:
                value = getattr(self, field.name)
                out[field.name] = list(value) if isinstance(value, tuple) else value
        return out

    def numerics_depend_on_processes(self) -> bool:
        """All-gathered contrastive negatives make the numbers depend on the process count."""
        return self.switch("contrast_negatives") == "all_processes"


class DAS(ContinualMethod):
    """Soft-masking of units by accumulated importance plus contrastive knowledge integration."""

    name: ClassVar[str] = "das"
    version: ClassVar[int] = 2
    """2: the reference's KL proxy and normalisation as the reference computes them (rounding noise, no epsilon)."""
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = ""
    """Sharded training works: importance is computed on the whole model before and after a domain's updates, and
    the soft masks scale each process's shard of a gradient (or update) by its part of the per-unit factor."""
    comparison_role: ClassVar[str | None] = "proposed"
    config_cls: ClassVar[type[MethodConfig]] = DASConfig
    studies: ClassVar[dict] = {
        "importance-similarity": importance_study.similarity_study,
        "importance-stability": importance_study.stability_study,
    }
    config: DASConfig

    def __init__(self, config: DASConfig, *, env):
        super().__init__(config, env=env)
        self.importance: dict[str, torch.Tensor] | None = None
        """Accumulated normalised importance (general + earlier domains), layers x units, on CPU."""
        self.domain_importance: dict[str, torch.Tensor] | None = None
        """Accumulated importance of the earlier domains only (kept for ``ablation=domain_contrast``)."""
        self._device_importance: dict[str, torch.Tensor] | None = None
        self._generator = torch.Generator().manual_seed(env.seed)
        self._before_step: list[torch.Tensor] | None = None
        self._mask_report: dict[str, Any] = {}

    @property
    def _masks(self) -> bool:
        return self.config.ablation != "no_softmask"

    def trainable_parameters(self, model) -> list[tuple[str, torch.nn.Parameter]]:
        """Every trainable parameter, or with ``other_params=freeze`` only the units' linear layers."""
        params = super().trainable_parameters(model)
        if self.config.other_params == "train":
            return params
        owned = {id(p) for layer in layer_modules(model) for module in layer.projections for p in module.parameters()}
        return [(n, p) for n, p in params if id(p) in owned]

    # -- importance ------------------------------------------------------------------------------
    def before_domain(self, ctx: DomainContext) -> None:
        """Before the first domain, compute the general-knowledge importance."""
        if ctx.index == 0 and self.config.ablation != "no_init" and self._masks:
            self.importance = self._normalised(self._general_importance(ctx), ctx)
        self._device_importance = None
        self._mask_report = {}

    def _general_importance(self, ctx: DomainContext) -> dict[str, torch.Tensor]:
        ablation = self.config.ablation
        if ablation in ("general_mlm", "general_kl"):
            batches = ctx.general_probe()
            if batches is None:
                raise DapbenchError(f"das ablation={ablation} needs a general corpus", "set general_corpus=PATH")
            loss = self._mlm_loss() if ablation == "general_mlm" else kl_proxy_loss
            return self._gate_importance(ctx.model, batches, loss)
        loss = kl_proxy_loss if self.config.switch("kl_proxy") == "dropout_vocab" else reference_kl_proxy_loss
        return self._gate_importance(ctx.model, ctx.probe_loader, loss)

    def after_domain(self, ctx: DomainContext) -> None:
        """Add this domain's MLM importance to the accumulated importance (element-wise max)."""
        if not self._masks:  # the w/o-softmask ablation uses no importance at all
            return
        new = self._normalised(self._gate_importance(ctx.model, ctx.probe_loader, self._mlm_loss()), ctx)
        self.importance = accumulate_importance(self.importance, new)
        self.domain_importance = accumulate_importance(self.domain_importance, new)
        self._device_importance = None

    def _mlm_loss(self):
        return mlm_importance_loss(unmasked=self.config.switch("mlm_importance_input") == "unmasked")

    def _gate_importance(self, model, batches, loss_fn) -> dict[str, torch.Tensor]:
        grain = self.config.switch("importance_abs")
        cumulative = self.config.switch("importance_accumulation") == "cumulative"
        return gate_importance(
            model,
            batches,
            loss_fn,
            tuple(self.config.units),
            absolute=grain != "after_tanh",
            cumulative=cumulative,
            per_example=grain == "per_example",
            per_token=cumulative,  # the reference's accumulation divides by the tokens it saw
        )

    def _normalised(self, raw: dict[str, torch.Tensor], ctx: DomainContext) -> dict[str, torch.Tensor]:
        normalised = {u: normalize_importance(v, self.config.switch("importance_norm")) for u, v in raw.items()}
        if self.config.ablation == "random_importance":
            return {u: shuffle_within_layers(v, self._generator) for u, v in normalised.items()}
        return normalised

    # -- training --------------------------------------------------------------------------------
    def _on_device(self, device) -> dict[str, torch.Tensor] | None:
        if self.importance is None:
            return None
        if self._device_importance is None:
            self._device_importance = {u: v.to(device) for u, v in self.importance.items()}
        return self._device_importance

    def flop_bound(self, encoder_share: float) -> float | None:
        """The MLM update, plus the contrastive term's encoder passes (forward and backward): the two dropout
        views, and the o_prev view through the importance-gated network once an importance exists."""
        if self.config.ablation == "no_contrast" or self.config.contrast_lambda == 0:
            return 1.0
        views = 2 + (1 if self._masks and self._contrast_importance() is not None else 0)
        return 1.0 + views * encoder_share

    def training_loss(
        self, batch: Mapping[str, torch.Tensor], outputs: StepOutput, ctx: StepContext
    ) -> dict[str, torch.Tensor]:
        """The contrastive term on the unmasked batch (skipped while o_prev needs an importance that
        does not exist yet; without soft-masking there is no o_prev)."""
        if self.config.ablation == "no_contrast" or self.config.contrast_lambda == 0:
            return {}
        prev_gates = self._contrast_gates(batch["original_ids"].device) if self._masks else None
        if prev_gates is None and self._masks:
            return {}
        return {"contrast": self.config.contrast_lambda * self._contrast(batch, prev_gates, ctx)}

    def _contrast_importance(self) -> dict[str, torch.Tensor] | None:
        """The importance the o_prev view is gated with: this domain's own under ``domain_contrast``, else the
        accumulated one (None: no o_prev view yet)."""
        return self.domain_importance if self.config.ablation == "domain_contrast" else self.importance

    def _contrast_gates(self, device) -> dict[str, torch.Tensor] | None:
        if self.config.ablation != "domain_contrast":
            return self._on_device(device)  # the accumulated importance, moved to the device once
        importance = self._contrast_importance()
        return None if importance is None else {u: v.to(device) for u, v in importance.items()}

    def _contrast(self, batch, prev_gates, ctx: StepContext) -> torch.Tensor:
        module = ctx.unwrapped_model()
        encoder = encoder_of(module)
        ids, mask = batch["original_ids"], batch.get("attention_mask")
        # Two dropout views of every input in one batched pass (each row gets its own dropout mask).
        mask2 = None if mask is None else torch.cat([mask, mask])
        with dropout_views(module):
            pooled = mean_pool(encoder(input_ids=torch.cat([ids, ids]), attention_mask=mask2).last_hidden_state, mask2)
            first, second = pooled.chunk(2)
            if prev_gates is None:
                prev = first[:0]  # no o_prev negatives
            else:
                with gated(module, prev_gates):
                    prev = mean_pool(encoder(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
        if self.config.switch("contrast_pairing") == "adjacent":
            first, second = reference_pairing(first, second)
        if self.config.switch("contrast_negatives") == "all_processes":
            # The reference all-gathers the views of every process (docs/das.md, section 3.9): N processes
            # then compute another loss than one process accumulating the same micro-batches.
            first, second, prev = (gathered(views) for views in (first, second, prev))
        # By default the negatives are the other rows of this micro-batch, with one process or many: a run over N
        # processes then computes exactly what one process computes with gradient accumulation.
        return info_nce(first, second, prev, self.config.temperature)

    def _masked_tensors(self, model) -> list[MaskedTensor]:
        return masked_tensors(
            layer_modules(model),
            tuple(self.importance or ()),
            unit_shapes(model).head_dim,
            qkv_axis=self.config.switch("qkv_mask_axis"),
            mask_attn_out_bias=self.config.switch("mask_attn_out_bias"),
        )

    def after_backward(self, ctx: StepContext) -> None:
        """Soft-mask the gradients by (1 - accumulated importance), or remember the weights so that
        ``after_optimizer_step`` can scale the step (``mask_target=update``)."""
        model = ctx.unwrapped_model()
        importance = self._on_device(next(model.parameters()).device)
        if importance is None or not self._masks:
            return
        if self.config.mask_target == "update":
            self._before_step = [t.param.detach().clone() for t in self._masked_tensors(model)]
            return
        for tensor in self._masked_tensors(model):
            mask_gradient(tensor, importance)

    def after_optimizer_step(self, ctx: StepContext) -> None:
        """Scale the step just taken (``mask_target=update``); at the domain's last step, measure the damping."""
        model = ctx.unwrapped_model()
        importance = self._on_device(next(model.parameters()).device)
        if importance is None or not self._masks:
            return
        tensors = self._masked_tensors(model)
        if self._before_step is not None:
            soft_mask_updates(tensors, importance, self._before_step)
            self._before_step = None
        if ctx.domain_step == ctx.total_domain_steps - 1 and ctx.optimizer is not None:
            self._mask_report = {
                "target": self.config.mask_target,
                "importance_histogram": importance_histogram(self.importance),
                "damping_per_bin": damping_by_importance(tensors, importance, ctx.optimizer, self.config.mask_target),
            }

    # -- state -----------------------------------------------------------------------------------
    def domain_report(self) -> dict[str, Any]:
        """Per unit type and layer: mean accumulated importance and the share of units above 0.5; the
        mask in force during the domain (importance histogram per unit type, ten bins of [0, 1]) and its
        measured damping per bin (mean |update| relative to the unmasked update of the same units)."""
        if self.importance is None:
            return {}
        report: dict[str, Any] = {
            "importance": {
                unit: {
                    "mean_per_layer": [round(float(v), 5) for v in values.mean(dim=1)],
                    "share_above_half_per_layer": [round(float(v), 5) for v in (values > 0.5).float().mean(dim=1)],
                }
                for unit, values in self.importance.items()
            }
        }
        if self._mask_report:
            report["mask"] = self._mask_report
        return report

    def state_dict(self) -> dict[str, Any]:
        """The accumulated importance tensors (and the domain-only accumulation)."""
        return {
            "importance": self.importance,
            "domain_importance": self.domain_importance,
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the accumulated importance."""
        self.importance = state.get("importance")
        self.domain_importance = state.get("domain_importance")
        if state.get("generator") is not None:
            self._generator.set_state(state["generator"])
        self._device_importance = None
