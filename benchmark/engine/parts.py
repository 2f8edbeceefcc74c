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
    show_progress: bool = True
    tracker: Any = None
    """The run's :class:`~benchmark.engine.tracking.RunTracker`."""

    @property
    def where(self) -> str:
        """The run, as error messages name it."""
        return f"{self.method.name} seed {self.seed}"
