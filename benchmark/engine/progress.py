"""Where a run is, always on screen: run i of n, domain t of T, the phase (DAP, held-out evaluation, end-task
fine-tune k of K), the time spent and an estimate of what is left.

One tqdm bar per run, above the DAP loop's own bar. Its unit is a phase; a heartbeat thread redraws it every
``interval`` seconds, so even a phase that reports nothing itself (a fine-tune, a held-out pass) shows the clock
moving: no phase goes longer than ``interval`` without a visible update. What is left is the mean time of the phases
this invocation ran times the phases left, not tqdm's own estimate: that one smooths over the latest updates, so a
phase that takes no time (a base evaluation found in the work folder) made it read ``~00:00 left`` through the next
several minutes of DAP; phases a resumed run skips are not timed at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

HEARTBEAT_SECONDS = 10.0
"""How often the run line is redrawn while nothing else updates it (the issue's bound is 30 s)."""
MIN_TIMED_SECONDS = 1.0
"""The time the phases run so far must have taken before the line estimates what is left (``~?`` until then)."""


@dataclass(frozen=True)
class RunPosition:
    """Which run of a grid this is (1-based), how many the grid holds, and what the runs before it in this command
    took: the line's estimate of the whole command's time left."""

    index: int = 1
    total: int = 1
    earlier_seconds: float = 0.0
    """Wall seconds of the runs of this command before this one that did work (not those found finished)."""
    earlier_runs: int = 0
    """How many runs :attr:`earlier_seconds` sums."""

    def after_this(self) -> float | None:
        """Seconds the runs after this one will take at the mean of the earlier ones (None: none timed yet; 0 for
        the last run). Runs of other methods cost other times: an estimate that improves as the command goes."""
        if self.index >= self.total:
            return 0.0
        if not self.earlier_runs:
            return None
        return self.earlier_seconds / self.earlier_runs * (self.total - self.index)


class RunProgress:
    """The run-level progress line of one run (does nothing when ``enabled`` is false)."""

    def __init__(
        self,
        label: str,
        position: RunPosition,
        domains: list[str],
        phases: int,
        *,
        enabled: bool = True,
        interval: float = HEARTBEAT_SECONDS,
        file=None,
    ):
        import sys

        from tqdm.auto import tqdm

        self.label, self.position, self.domains = label, position, domains
        self.where = "starting"
        self._started, self._timed = time.monotonic(), 0
        self._file = file or sys.stderr
        terminal = getattr(self._file, "isatty", lambda: False)()
        self._plain = enabled and not terminal  # a log file: one plain line per phase, no redrawn bar
        self._bar = tqdm(
            desc=self.line(),
            total=phases,
            disable=not enabled or self._plain,
            leave=False,
            file=file,
            mininterval=0,
            bar_format="{desc} | {n_fmt}/{total_fmt} phases, {elapsed} elapsed{postfix}",
            postfix="~? left",
        )
        self._done, self._total = 0, phases
        self._stop = threading.Event()
        self._thread = None
        if enabled and not self._plain:
            self._thread = threading.Thread(target=self._beat, args=(interval,), daemon=True, name="dapbench-progress")
            self._thread.start()

    def line(self) -> str:
        """The run line's text without the clock: ``run 1/3 ncl seed 2021 | domain 2/6 phone | DAP``."""
        return f"run {self.position.index}/{self.position.total} {self.label} | {self.where}"

    @contextmanager
    def phase(self, t: int | None, name: str) -> Iterator[None]:
        """Show that phase ``name`` of domain ``t`` (None: before the first domain) runs; count it done after."""
        domain = "base model" if t is None else f"domain {t + 1}/{len(self.domains)} {self.domains[t]}"
        self.where = f"{domain} | {name}"
        self._describe()
        if self._plain:
            elapsed = time.monotonic() - self._started
            print(
                f"{self.line()} | {self._done}/{self._total} phases, {_clock(elapsed)} elapsed, {self._left(0)}",
                file=self._file,
                flush=True,
            )
        yield
        self._timed += 1
        self._bar.set_postfix_str(self._left(), refresh=False)  # before the count moves: one redraw shows both
        self._done += 1
        self._bar.update(1)
        self._bar.refresh()

    def skip(self, phases: int) -> None:
        """Count ``phases`` as done without running them (finished in an earlier, resumed attempt)."""
        self._done += phases
        self._bar.update(phases)

    def _left(self, ending: int = 1) -> str:
        """``~MM:SS left``: the phases left (after the ``ending`` one that is done now) at the mean time of the
        phases timed, or ``~? left`` while they took under :data:`MIN_TIMED_SECONDS` in all; before the last run of a
        command, also the command's time left (:meth:`RunPosition.after_this`), or how many runs follow."""
        spent = time.monotonic() - self._started
        if spent < MIN_TIMED_SECONDS or not self._timed:  # only instant phases so far: they say nothing ahead
            return "~? left"
        left = spent / self._timed * max(self._total - self._done - ending, 0)
        after = self.position.after_this()
        if self.position.index >= self.position.total:
            return f"~{_clock(left)} left"
        command = (
            f"~{_clock(left + after)}" if after is not None else f"{self.position.total - self.position.index} runs"
        )
        return f"~{_clock(left)} left (command: {command} more)"

    def close(self) -> None:
        """Stop the heartbeat and remove the line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._bar.close()

    def _describe(self) -> None:
        self._bar.set_description_str(self.line(), refresh=True)

    def _beat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._bar.refresh()  # redraws elapsed and remaining (tqdm's lock keeps it from tearing another bar)


def _clock(seconds: float) -> str:
    from tqdm import tqdm

    return tqdm.format_interval(seconds)
