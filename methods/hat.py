"""HAT: hard attention to the task on every attention head and FFN neuron (Serra et al., ICML 2018;
the DAS paper's "HAT" baseline, Ke et al. 2023; transformer-level design of the DGA code,
``docs/das.md`` section 4.7).

Each domain t has task embeddings e_t for the same units as DAS (heads, FFN intermediate, FFN
output); the runner's forward is gated by sigmoid(s * e_t), with s annealed linearly from 1/smax to
smax over the domain's updates (the reference anneals within each epoch; a DAP domain here is one
pass of ``dap.steps`` updates). Loss = MLM + lambda * attention regulariser. After backward (t > 0)
weight gradients are scaled by 1 - min(m_<t(out), m_<t(in)); the embedding gradient is compensated for
the annealing, embeddings are clamped to +-6 after each step. After the domain,
m_<t+1 = max(m_<t, sigmoid(smax * e_t)). Embeddings, LayerNorms and the LM head carry no gate and are
trained freely (as in the reference), so earlier domains are protected only where gates exist.

``hat`` fine-tunes the end task's domain with that domain's near-binary mask (s = smax) applied in
the forward (it needs the domain id); ``hat_all`` (:mod:`methods.hat_all`) fine-tunes the full
network. The held-out MLM loss after domain t is measured with domain t's mask for ``hat`` and with
the full network for ``hat_all``, matching what each fine-tunes (see below). Task embeddings start N(0, 1) like
the HAT code's ``nn.Embedding``.

How the embeddings train (``fidelity``). The HAT paper trains them with plain SGD at lr 0.05, the rate its
gradient compensation (smax/s x cosh ratio) is designed for. ``fidelity="paper"`` (the default) does that: the
embeddings are a parameter group of their own (SGD at ``embedding_lr``, with the stage's schedule shape, outside the
gradient-norm clipping, which the compensated gradients, scaled by up to smax/s, would otherwise turn on every
weight). ``fidelity="reference"`` is ContinualLM's code, which puts them in the one AdamW of the model at the DAP
rate (``utils/optimize.py``): Adam normalises each step, so the compensation no longer acts, and at lr 1e-4 an
embedding moves about 1e-3 in 24 updates against a typical size of 0.8, so every mask stays the sign of its random
start (issue #45). Each domain's report says how far the mask learned: the share of gate decisions (gate > 0.5 at
s = smax) that changed during the domain, and the share of units it keeps open.

Held-out evaluation (``heldout_view``): HAT serves domain k through domain k's mask, so ``hat`` measures
domain k's held-out text after stage t with mask k (k <= t), as it fine-tunes task k. Text it has no mask
for (the general corpus, domains not trained yet) is measured with the full network (all gates open: the
units no domain used still hold the base model's weights). Measuring every column through the newest
domain's mask, as earlier records did, judged general and earlier-domain text through a mask made for
another domain, which is not how HAT would serve them. ``hat_all`` measures every column with the full
network, as it fine-tunes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from benchmark.errors import DapbenchError
from benchmark.method import (
    Capabilities,
    ContinualMethod,
    DomainContext,
    FinetuneContext,
    MethodConfig,
    ParameterGroup,
    StepContext,
    StepOutput,
)
from benchmark.modeling import encoder_of, layer_modules
from benchmark.settings import setting
from methods._shared.hat import (
    anneal_s,
    attention_regularizer,
    compensate_embedding_gradient,
    hat_gates,
    mask_hat_gradients,
)
from methods._shared.softmask import accumulate_importance
from methods._shared.units import UNIT_TYPES, attach_gates, unit_shapes

EMBEDDINGS = "dapbench_hat"
"""Attribute of the encoder that holds the task embeddings (saved with the checkpoint)."""


@dataclass(frozen=True)
class HATConfig(MethodConfig):
    """HAT options (defaults: the HAT paper and the reference)."""

    fidelity: str = setting("paper", choices=("paper", "reference"))
    """``paper``: the task embeddings train by SGD at ``embedding_lr`` (the HAT paper); ``reference``: in the
    model's AdamW at ``dap.lr`` (ContinualLM's code)."""
    embedding_lr: float = setting(0.05, low=0, low_open=True, high=100)
    """The task embeddings' SGD rate under ``fidelity="paper"`` (the HAT paper's 0.05)."""
    smax: float = setting(400.0, low=1, low_open=True, high=1e6)
    """The largest scale of the gates' sigmoid, annealed to over each domain (HAT's s_max)."""
    reg_lambda: float = setting(0.75, low=0, high=1000)
    """The weight of the regulariser that keeps each domain's gates sparse (HAT's c)."""
    thres_cosh: float = setting(50.0, low=0, low_open=True, high=1000)
    """The clamp of the scaled embedding in the gradient compensation's cosh (HAT's code)."""
    thres_emb: float = setting(6.0, low=0, low_open=True, high=1000)
    """The clamp of the task embeddings after each update (HAT's code)."""
    units: tuple[str, ...] = setting(UNIT_TYPES, choices=UNIT_TYPES)
    """The unit types that get gates (attention heads, intermediate and output neurons)."""

    def __post_init__(self):
        super().__post_init__()
        if not self.units or len(set(self.units)) != len(self.units):
            raise DapbenchError(f"invalid units {self.units}", f"name each of {UNIT_TYPES} at most once")


class TaskEmbeddings(nn.Module):
    """One embedding table per unit type: domains x layers x units."""

    def __init__(self, model: nn.Module, num_domains: int, units: tuple[str, ...]):
        super().__init__()
        shapes = unit_shapes(model)
        device = next(model.parameters()).device
        self.tables = nn.ParameterDict(
            {u: nn.Parameter(torch.randn(num_domains, *shapes.shape(u), device=device)) for u in units}
        )

    def of(self, domain: int) -> dict[str, torch.Tensor]:
        """Domain ``domain``'s embeddings per unit type (layers x units)."""
        return {u: table[domain] for u, table in self.tables.items()}


class HAT(ContinualMethod):
    """Task-gated units with hard attention masks; fine-tunes with the end task's domain mask."""

    name: ClassVar[str] = "hat"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = ""
    config_cls: ClassVar[type[MethodConfig]] = HATConfig
    capabilities: ClassVar[Capabilities] = Capabilities(needs_domain_id_at_finetune=True)
    leaderboard_note: ClassVar[str] = (
        "held-out losses of domain k use domain k's task mask (how HAT serves domain k); the general column"
        " and untrained domains use the full network, which HAT has no mask for."
    )
    version: ClassVar[int] = 2
    """2: the task embeddings train by SGD at the HAT paper's rate (``fidelity="paper"``); 1 trained them in the DAP
    AdamW, as ``fidelity="reference"`` still does."""
    config: HATConfig
    full_network_after_domain: ClassVar[bool] = False
    """Evaluate (held-out MLM loss) with the full network instead of the domain's mask."""

    def __init__(self, config: HATConfig, *, env):
        super().__init__(config, env=env)
        self.domain = 0
        self.s = config.smax
        self.gating = True
        self.previous: dict[str, torch.Tensor] | None = None
        """Cumulative mask m_<t of the finished domains (layers x units), on CPU."""
        self._embeddings: TaskEmbeddings | None = None
        self._device_previous: dict[str, torch.Tensor] | None = None
        self._decisions_before: dict[str, torch.Tensor] | None = None
        self._report: dict[str, float] = {}

    # -- model -----------------------------------------------------------------------------------
    def setup(self, model: nn.Module) -> nn.Module:
        """Add the task embeddings and gate every forward by the current domain's mask."""
        self._embeddings = TaskEmbeddings(model, self.env.num_domains, tuple(self.config.units))
        encoder_of(model).add_module(EMBEDDINGS, self._embeddings)
        attach_gates(model, tuple(self.config.units), self._gate)
        return model

    def parameter_groups(self, model: nn.Module) -> list[ParameterGroup]:
        """Under ``fidelity="paper"`` the task embeddings, trained by SGD at ``embedding_lr`` outside the clipping;
        under ``reference`` none (they train in the model's AdamW)."""
        if self.config.fidelity != "paper":
            return []
        tables = [(f"{EMBEDDINGS}.{unit}", table) for unit, table in self._embeddings.tables.items()]
        return [ParameterGroup("task_embeddings", tables, self.config.embedding_lr, optimizer="sgd", clip=False)]

    def _decisions(self, domain: int) -> dict[str, torch.Tensor]:
        """Domain ``domain``'s gate decisions at s = smax: which units its mask keeps (gate > 0.5, i.e. e > 0)."""
        return {u: (e > 0).detach().cpu() for u, e in self._embeddings.of(domain).items()}

    def _gate(self, unit: str, layer: int) -> torch.Tensor | None:
        if not self.gating:
            return None
        return torch.sigmoid(self.s * self._embeddings.tables[unit][self.domain, layer])

    # -- per domain ------------------------------------------------------------------------------
    def before_domain(self, ctx: DomainContext) -> None:
        """Gate with this domain's embeddings, starting the annealing at s = 1/smax."""
        self.domain, self.gating = ctx.index, True
        self.s = anneal_s(0, 2, self.config.smax)
        self._device_previous = None
        self._decisions_before = self._decisions(ctx.index)

    def after_domain(self, ctx: DomainContext) -> None:
        """Fold this domain's binary-ish mask into the cumulative mask; set the evaluation view."""
        with torch.no_grad():
            mask = {u: g.detach().cpu() for u, g in hat_gates(self._embeddings.of(ctx.index), self.config.smax).items()}
        self.previous = accumulate_importance(self.previous, mask)
        self.s, self.gating = self.config.smax, not self.full_network_after_domain
        self._device_previous = None
        after, before = self._decisions(ctx.index), self._decisions_before
        units = sum(d.numel() for d in after.values())
        changed = sum(int((after[u] != before[u]).sum()) for u in after)
        self._report = {
            "gate_decisions_changed": round(changed / units, 6),
            "gates_open": round(sum(int(d.sum()) for d in after.values()) / units, 6),
        }

    def domain_report(self) -> dict[str, Any]:
        """How the domain's mask learned: the share of gate decisions that changed during the domain and the share
        of units the mask keeps open (both at s = smax)."""
        return dict(self._report)

    # -- evaluation ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def heldout_view(self, model: nn.Module, domain_index: int | None) -> Iterator[None]:
        """Domain k's mask for a trained domain k (``hat``); the full network otherwise and for ``hat_all``."""
        saved = self.domain, self.gating
        known = domain_index is not None and domain_index <= self.domain
        self.gating = known and not self.full_network_after_domain
        if known:
            self.domain = domain_index
        try:
            yield
        finally:
            self.domain, self.gating = saved

    # -- per step --------------------------------------------------------------------------------
    def training_loss(
        self, batch: Mapping[str, torch.Tensor], outputs: StepOutput, ctx: StepContext
    ) -> dict[str, torch.Tensor]:
        """lambda * the attention regulariser of the current gates."""
        gates = hat_gates(self._embeddings.of(self.domain), self.s)
        return {"hat_reg": self.config.reg_lambda * attention_regularizer(gates, self._previous_on_device())}

    def _previous_on_device(self) -> dict[str, torch.Tensor] | None:
        if self.previous is None:
            return None
        if self._device_previous is None:
            device = self._embeddings.tables[self.config.units[0]].device
            self._device_previous = {u: v.to(device) for u, v in self.previous.items()}
        return self._device_previous

    def after_backward(self, ctx: StepContext) -> None:
        """Block the gradients of units earlier domains use; compensate the embedding gradient."""
        model = ctx.unwrapped_model()
        previous = self._previous_on_device()
        if previous is not None:
            mask_hat_gradients(layer_modules(model), previous, unit_shapes(model).head_dim)
        for table in self._embeddings.tables.values():
            if table.grad is not None:
                row = self.domain
                table.grad[row] = compensate_embedding_gradient(
                    table.grad[row], table.data[row], self.s, self.config.smax, self.config.thres_cosh
                )

    def after_optimizer_step(self, ctx: StepContext) -> None:
        """Clamp the embeddings and advance the annealing for the next step."""
        with torch.no_grad():
            for table in self._embeddings.tables.values():
                table.clamp_(-self.config.thres_emb, self.config.thres_emb)
        self.s = anneal_s(ctx.domain_step + 1, ctx.total_domain_steps, self.config.smax)

    # -- fine-tuning -----------------------------------------------------------------------------
    def finetune_model(self, ctx: FinetuneContext) -> nn.Module:
        """The checkpoint's classifier gated by the end task's domain mask at s = smax (fixed)."""
        if ctx.task_domain_index is None:
            raise DapbenchError("hat needs the end task's domain id at fine-tuning", "declare the capability")
        embeddings = getattr(encoder_of(ctx.model), EMBEDDINGS).of(ctx.task_domain_index)
        with torch.no_grad():
            masks = {u: g.detach().clone() for u, g in hat_gates(embeddings, self.config.smax).items()}
        model = super().finetune_model(ctx)
        attach_gates(model, tuple(masks), lambda unit, layer: masks[unit][layer])
        return model

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cumulative mask and the current domain (the embeddings are part of the model)."""
        return {"previous": self.previous, "domain": self.domain}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; the model is then in its after-domain evaluation view."""
        self.previous, self.domain = state["previous"], state["domain"]
        self.s, self.gating = self.config.smax, not self.full_network_after_domain
        self._device_previous = None
