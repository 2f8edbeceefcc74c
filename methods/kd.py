"""KD: continual DAP with knowledge distillation from the previous domain's model (DAS paper baseline).

At the start of domain t the current model (the previous domain's final model; the base model at
t = 0) is copied into a frozen teacher. Every step adds ``weight * T^2 * KL(teacher || student)`` of
the MLM output distributions at the masked positions, with temperature T (Hinton et al. 2015).
T = 2 and weight 1 are our defaults (the DAS paper does not state them; the reference uses T = 1
and weight 1 on a different target). ``target="hidden_states"`` reproduces the reference code:
KL over the token axis of the final hidden states of unmasked inputs, teacher with dropout
(``docs/das.md`` section 4.3).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from benchmark.method import ContinualMethod, DomainContext, MethodConfig, StepContext, StepOutput
from benchmark.modeling import encoder_of, mlm_forward
from benchmark.settings import setting
from methods._shared.distill import distillation_loss, reference_hidden_kl


@dataclass(frozen=True)
class KDConfig(MethodConfig):
    """KD options."""

    temperature: float = setting(2.0, low=0, low_open=True, high=100)
    """The softmax temperature of the distillation over the MLM logits."""
    weight: float = setting(1.0, low=0, high=1e6)
    """The weight of the distillation loss beside the MLM loss."""
    target: str = setting("mlm_logits", choices=("mlm_logits", "hidden_states"))
    """``mlm_logits`` (default) or ``hidden_states`` (the reference code)."""


class KD(ContinualMethod):
    """MLM plus distillation towards a frozen copy of the model from the start of the domain."""

    name: ClassVar[str] = "kd"
    multi_process: ClassVar[bool] = True
    fsdp_refusal: ClassVar[str] = "its teacher is a whole copy of the model on every process, which defeats sharding"
    config_cls: ClassVar[type[MethodConfig]] = KDConfig
    config: KDConfig

    def __init__(self, config: KDConfig, *, env):
        super().__init__(config, env=env)
        self.teacher: torch.nn.Module | None = None

    def before_domain(self, ctx: DomainContext) -> None:
        """Freeze a copy of the model as this domain's teacher."""
        model = ctx.unwrapped_model()
        self.teacher = copy.deepcopy(model).requires_grad_(False)
        self.teacher.train(self.config.target == "hidden_states")  # the reference runs it with dropout

    def flop_bound(self, encoder_share: float) -> float | None:
        """The MLM update plus the teacher's forward (a third of an update): of the MLM pass for logit
        distillation; for hidden states, of the encoder, with the student's extra pass on the unmasked input."""
        if self.config.target == "hidden_states":
            return 1.0 + encoder_share + encoder_share / 3
        return 1.0 + 1.0 / 3

    def training_loss(
        self, batch: Mapping[str, torch.Tensor], outputs: StepOutput, ctx: StepContext
    ) -> dict[str, torch.Tensor]:
        """The distillation term."""
        if self.teacher is None:
            return {}
        if self.config.target == "hidden_states":
            ids, mask = batch["original_ids"], batch.get("attention_mask")
            with torch.no_grad():
                teacher = encoder_of(self.teacher)(input_ids=ids, attention_mask=mask).last_hidden_state
            student = encoder_of(ctx.unwrapped_model())(input_ids=ids, attention_mask=mask).last_hidden_state
            return {"kd": self.config.weight * reference_hidden_kl(student, teacher, self.config.temperature)}
        with torch.no_grad():
            teacher_logits = mlm_forward(self.teacher, batch)[2]
        return {"kd": self.config.weight * distillation_loss(outputs.logits, teacher_logits, self.config.temperature)}

    def after_domain(self, ctx: DomainContext) -> None:
        """Drop the teacher (the next domain copies the trained model)."""
        self.teacher = None
