"""Knowledge-distillation losses (pure functions)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * KL(softmax(teacher / T) || softmax(student / T))``, mean over rows (Hinton et al. 2015).

    Rows are the masked positions; the T^2 factor keeps gradient magnitudes comparable across T.
    """
    log_student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return temperature**2 * F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")


def reference_hidden_kl(
    student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """The reference code's KD term (``docs/das.md`` 4.3): softmax over the *token* axis of the
    final hidden states, KL(student || teacher) * T^2 / batch size."""
    log_s = F.log_softmax(student_hidden.float() / temperature, dim=1)
    log_t = F.log_softmax(teacher_hidden.float() / temperature, dim=1)
    return temperature**2 * (log_s.exp() * (log_s - log_t)).sum() / student_hidden.shape[0]
