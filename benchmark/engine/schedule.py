"""The stage schedule: what a method's :class:`~benchmark.method.Capabilities` mean for the run.

Every branch on a capability lives here, so the runner reads as one loop: which stages produce a
model, which model a stage starts from, what it trains on and for how many updates, and which
cells A[t][k] of the end-task matrix are fine-tuned.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmark.method import Capabilities


@dataclass(frozen=True)
class StageSchedule:
    """The schedule of one method over a sequence of ``num_domains`` domains."""

    caps: Capabilities
    num_domains: int
    steps_per_domain: int
    matrix: str
    """``full`` (the lower triangle of A) or ``final`` (the diagonal plus the last row)."""

    def stages(self) -> list[int]:
        """The domains after which a model exists: every one, or only the last for joint training
        (one model trained once on the union of all corpora)."""
        return [self.num_domains - 1] if self.caps.joint_training else list(range(self.num_domains))

    def trains(self) -> bool:
        """Whether the method pre-trains at all (False for the no-DAP baseline)."""
        return self.caps.pretrains

    def starts_fresh(self, t: int) -> bool:
        """Whether stage ``t`` starts from the base model (else from checkpoint ``t - 1``)."""
        caps = self.caps
        return (
            t == 0 or caps.independent_per_domain or caps.joint_training or caps.retrains_on_seen or not caps.pretrains
        )

    def carries_method_state(self, t: int) -> bool:
        """Whether a fresh stage ``t`` still restores the method state of checkpoint ``t - 1`` (per-domain
        methods keep their own state, e.g. a registry of per-domain adapters)."""
        return t > 0 and not (self.caps.joint_training or self.caps.retrains_on_seen)

    def training_domains(self, t: int) -> list[int]:
        """The domains whose corpora stage ``t`` trains on: its own, all of them for joint training, those seen so
        far for the oracle."""
        if self.caps.joint_training:
            return list(range(self.num_domains))
        return list(range(t + 1)) if self.caps.retrains_on_seen else [t]

    def updates(self, t: int) -> int:
        """Optimizer updates of stage ``t``: joint training gets the whole sequence's budget, so it sees as many
        tokens as a continual run; the oracle's stage t the budget of the continual run's stages 0..t."""
        if self.caps.retrains_on_seen:
            return self.steps_per_domain * (t + 1)
        return self.steps_per_domain * (self.num_domains if self.caps.joint_training else 1)

    def total_updates(self, t: int) -> int:
        """Optimizer updates of the whole training run stage ``t`` belongs to: the sequence, or for the oracle the
        stage's own run from the base model."""
        return self.updates(t) if self.caps.retrains_on_seen else self.steps_per_domain * self.num_domains

    def step_offset(self, t: int) -> int:
        """The global step count before stage ``t`` (0 where the stage is a run of its own from the base model)."""
        return 0 if self.caps.joint_training or self.caps.retrains_on_seen else t * self.steps_per_domain

    def row_tasks(self, t: int, matrix: str | None = None) -> list[int]:
        """Columns k of row t that the matrix mode (the run's, or ``matrix``) asks for. A per-domain method (the ONE
        family) scores each end task with its own domain's model: only the diagonal enters any summary, so no other
        cell is computed."""
        if self.caps.independent_per_domain:
            return [t]
        if (matrix or self.matrix) == "full" or t == self.num_domains - 1:
            return list(range(t + 1))
        return [t]

    def row_key(self, t: int) -> str:
        """The name of row t's fine-tune results; the no-DAP baseline fine-tunes the same base model in every
        row, so each column is computed once (``base``)."""
        return "base" if not self.caps.pretrains else f"row{t}"


def stage_phases(schedule: StageSchedule) -> int:
    """The phases of a stage on the run's progress line: DAP (if the method trains) and held-out evaluation."""
    return 2 if schedule.trains() else 1


BESIDE_MATRIX = "final"
"""The cells a protocol beside the run's own scores (``finetune.beside``): the diagonal and the last row, what the
final scores and forgetting need, whatever the run's matrix mode (a second protocol over the whole triangle would
cost as much again)."""


def run_phases(schedule: StageSchedule, beside: bool = False) -> int:
    """Every phase of a run on its progress line: the base model's evaluation, each stage's, each end-task cell (and
    each cell scored ``beside`` the run's protocol)."""
    cells = sum(len(schedule.row_tasks(t)) for t in schedule.stages())
    if beside:
        cells += sum(len(schedule.row_tasks(t, BESIDE_MATRIX)) for t in schedule.stages())
    return 1 + len(schedule.stages()) * stage_phases(schedule) + cells
