"""Experiment trackers (``--report-to tensorboard|wandb|mlflow``) through accelerate's tracker integration.

A run logs, under its run id as the tracker's run name and with its resolved configuration attached: every
update's loss terms and learning rate (``dap/<term>``, ``dap/lr`` at the global step), the held-out losses after
every stage (``heldout/<set>``), every end-task cell (``end_task/<task>/after_<t>/<score>``) and the final summary
metrics (``final/<metric>``). Trackers only watch: nothing they receive enters a record, and ``report_to`` is not
part of the run id. TensorBoard writes under ``<output-dir>/tracking/<run id>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TRACKERS = ("none", "tensorboard", "wandb", "mlflow")
TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",)}
"""The modules a tracker needs (any one of them): without them accelerate only warns and nothing is tracked."""


def check_tracking(report_to: str, output_dir: str) -> None:
    """Refuse, before any work, a tracker whose package is missing, and a ``<output-dir>/tracking`` that is a file or
    a symbolic link (its files would land elsewhere, or the tracker would fail once the run has started)."""
    from importlib.util import find_spec

    from benchmark.errors import DapbenchError

    if report_to == "none":
        return
    if not any(find_spec(module) for module in TRACKER_PACKAGES[report_to]):
        package = TRACKER_PACKAGES[report_to][0]
        raise DapbenchError(
            f"--report-to {report_to}: the package {package!r} is not installed, so nothing would be tracked",
            f"pip install {package}, or pass --report-to none",
        )
    folder = Path(output_dir) / "tracking"
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise DapbenchError(
            f"{folder} is {'a symbolic link' if folder.is_symlink() else 'a file'}: trackers write their files only"
            " into a folder of the output folder's own",
            f"move {folder} away, or pass another --output-dir",
        )


class RunTracker:
    """The trackers of one run (no-ops, and no host syncs, when ``report_to`` is ``none``)."""

    def __init__(self, accelerator, report_to: str, run_id: str, config: Mapping[str, Any]):
        self.accelerator, self.active, self.run_id = accelerator, report_to != "none", run_id
        if self.active:  # the trackers write below <output-dir>/tracking/<run id>: never through a link elsewhere
            from benchmark.io import unlinked_path

            unlinked_path(accelerator.project_dir, run_id)
        self._config = config
        self._started = False

    def start(self) -> None:
        """Open the trackers (once), with the run's configuration flattened to scalars."""
        if self.active and not self._started:
            self.accelerator.init_trackers(self.run_id, config=flat_config(self._config))
            self._started = True

    def log_update(self, step: int, terms: Mapping[str, Any], lr: float) -> None:
        """One update's loss terms (tensors, read here) and learning rate at global step ``step``."""
        if self.active:
            values = {f"dap/{k}": float(v) for k, v in terms.items()}
            self.accelerator.log({**values, "dap/lr": lr}, step=step)

    def log_values(self, prefix: str, values: Mapping[str, Any], step: int | None = None) -> None:
        """Named numbers (held-out losses, a cell's scores, final metrics; nested maps as ``a/b``) under
        ``prefix/``; anything else (lists, None) is left out."""
        if self.active:
            self.accelerator.log(_numbers(values, prefix), step=step)

    def finish(self) -> None:
        """Flush and close the trackers."""
        if self.active and self._started:
            self.accelerator.end_training()
            self._started = False


def _numbers(values: Mapping[str, Any], prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update(_numbers(value, f"{prefix}/{key}"))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[f"{prefix}/{key}"] = float(value)
    return out


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``dap.lr``-style keys with scalar values (lists and maps as JSON), as every tracker's config accepts."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(flat_config(value, f"{prefix}{key}."))
        elif isinstance(value, bool | int | float | str):
            out[f"{prefix}{key}"] = value
        else:
            out[f"{prefix}{key}"] = json.dumps(value)
    return out
