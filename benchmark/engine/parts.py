"""What every part of one run shares (:class:`RunParts`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from benchmark.config import RunConfig
from benchmark.data.inputs import RunData
from benchmark.engine.layout import RunLayout
from benchmark.engine.progress import RunProgress
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
    progress: RunProgress | None = None
    """The run-level progress line while :meth:`ContinualRun.execute` runs (None: nothing is shown)."""
    own_domain_only: bool = False
    """Evaluate each stage on its own domain's held-out set alone, without drift or the base model's evaluation: a
    stages-only re-run that checks a record's training at a third of the cost (``reproduce --own-domain``)."""

    def phase(self, t: int | None, name: str) -> contextlib.AbstractContextManager:
        """The context of phase ``name`` of domain ``t`` on the run's progress line (nothing without one)."""
        return self.progress.phase(t, name) if self.progress else contextlib.nullcontext()

    def skip_phases(self, count: int) -> None:
        """Count ``count`` phases finished in an earlier attempt as done on the progress line."""
        if self.progress and count:
            self.progress.skip(count)

    @property
    def where(self) -> str:
        """The run, as error messages name it."""
        return f"{self.method.name} seed {self.seed}"
