"""Measurements that are not unit tests: DAP step time per method on the same data."""

from __future__ import annotations

import dataclasses
import tempfile

from benchmark.config import RunConfig
from benchmark.inputs import prepare_data
from benchmark.runner import ContinualRun


def step_times(config: RunConfig, methods: list[str], steps: int, seed: int = 0) -> dict[str, dict]:
    """Seconds per DAP update of each method on the first domain of ``config.sequence`` (same data,
    same budget, one process), with the ratio to the first method listed."""
    with tempfile.TemporaryDirectory() as work:
        cfg = dataclasses.replace(
            config, work_dir=work, matrix="final", dap=dataclasses.replace(config.dap, steps=steps, log_every=steps)
        )
        data = prepare_data(cfg)
        data = dataclasses.replace(data, domains=data.domains[:1])  # time the first domain only
        out = {}
        for name in methods:
            run = ContinualRun(cfg, data, name, seed, show_progress=False)
            stats = run.stages.run(0)
            out[name] = {
                "step_seconds": stats["step_seconds"],
                "tokens_per_second": stats["tokens_per_second"],
                "peak_memory_mb": stats["peak_memory_mb"],
            }
    baseline = out[methods[0]]["step_seconds"]
    for stats in out.values():
        stats["ratio"] = round(stats["step_seconds"] / baseline, 3)
    return out
