"""What every part of one run shares (:class:`RunParts`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmark.config import RunConfig
from benchmark.data.inputs import RunData
from benchmark.engine.layout import RunLayout
from benchmark.engine.schedule import StageSchedule
from benchmark.method import ContinualMethod


@dataclass
class RunParts:
    """What every part of one run shares."""

    config: RunConfig
    data: RunData
    method: ContinualMethod
    seed: int
    layout: RunLayout
    schedule: StageSchedule
    accelerator: Any
    tracker: Any
    """The run's :class:`~benchmark.engine.tracking.RunTracker` (its calls do nothing when no tracker is asked for)."""
    show_progress: bool = True

    @property
    def where(self) -> str:
        """The run, as error messages name it."""
        return f"{self.method.name} seed {self.seed}"
