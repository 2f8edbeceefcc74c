"""CPU threads that fit the machine (issue #88): how many cores this process may use, and OpenMP waiting that yields.

PyTorch's CPU kernels run on OpenMP threads. By default GNU OpenMP spins while a thread waits for work, so when other
processes share the cores a run's threads burn their time slices spinning and a run slows far beyond its fair share
(measured: 17.6x slower beside three busy processes on 2 cores, against 3.5x for a fair share). dapbench therefore
asks OpenMP to wait passively, and sizes its default thread count by the cores this process may run on (its CPU
affinity and its cgroup's CPU quota), not by the machine's core count. Both are set before PyTorch loads its OpenMP
runtime, only where the user has not set them (``OMP_WAIT_POLICY``, ``OMP_NUM_THREADS``): neither changes a number a
run computes on a machine whose usable cores are all its cores, so default runs keep their numbers.
"""

from __future__ import annotations

import math
import os
from collections.abc import MutableMapping
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
MAX_THREADS = 512
"""The most CPU threads a run or re-run may ask for: more than any machine a record comes from has cores, far fewer
than exhaust a process (3,000 threads did)."""


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The cores this process may use: its CPU affinity, capped by its cgroup's CPU quota where one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


_CHOSEN: dict[str, str] = {}
"""The thread count dapbench itself put in the environment (absent where the user set one)."""


def configure_threads(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set OpenMP's passive waiting and the default thread count in ``environ`` where the user has not set them."""
    environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "OMP_NUM_THREADS" not in environ:
        environ["OMP_NUM_THREADS"] = _CHOSEN["threads"] = str(usable_cores())


def threads_per_run(runs: int, environ: MutableMapping[str, str] = os.environ) -> str:
    """The threads each of ``runs`` processes side by side gets: the count the user set, else a share of the usable
    cores (the count dapbench chose for one process would oversubscribe them)."""
    current = environ.get("OMP_NUM_THREADS")
    if current and current != _CHOSEN.get("threads"):
        return current
    return str(max(1, usable_cores() // runs))
