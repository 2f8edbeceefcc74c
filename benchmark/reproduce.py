"""Re-derive a committed run record from scratch and compare every number it reports.

``dapbench reproduce RECORD`` rebuilds the record's configuration, checks that the data on this
machine is the data the record was made from (checksums), runs the method and seed again in a fresh
work directory and lists every reported number (summary, A[t][k] matrices, MLM-loss matrix) that
differs by more than the tolerance. The CI key-number check uses the same comparison.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.config import DapConfig, FinetuneConfig, RunConfig, profile_config
from benchmark.errors import DapbenchError

PATH_FIELDS = ("model", "data_root", "general_heldout", "general_corpus")


@dataclass(frozen=True)
class Tolerance:
    """Largest absolute difference accepted per kind of number."""

    score: float
    """Accuracy / F1 entries and their summaries (fractions in [0, 1])."""
    loss: float
    """Held-out MLM losses (nats per masked token)."""


CI_TOLERANCE = Tolerance(score=0.01, loss=0.005)
"""Tolerance of the CI key-number check and the default of ``dapbench reproduce``.

Measured on the 2-core development CPU: four runs of the ``ci`` profile (1, 2 and 1 torch threads, and a
second checkout) gave every number identical (0 difference in 123 numbers; records round losses to 1e-5).
The tolerance is therefore not for run-to-run noise here but for other CPUs' float kernels: about one
changed prediction per end task for scores (1/120 test examples = 0.0083 -> 0.01) and 0.005 nats for
held-out MLM losses (~0.1% of a loss of ~5). It stays tight enough to catch behaviour changes: one extra
DAP update per domain (``dap.steps`` 10 -> 11) moves the MLM losses by up to 0.065.
"""
DEFAULT_TOLERANCE = CI_TOLERANCE


@dataclass(frozen=True)
class Mismatch:
    """One reported number that differs beyond its tolerance (or exists in only one record)."""

    name: str
    expected: float | None
    actual: float | None
    allowed: float

    def __str__(self) -> str:
        def show(value: float | None) -> str:
            return "missing" if value is None else f"{value:.5f}"

        return f"{self.name}: expected {show(self.expected)}, got {show(self.actual)} (tolerance {self.allowed})"


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Rebuild a :class:`RunConfig` from its ``to_dict`` form (the ``config`` of a record)."""
    try:
        return RunConfig(
            **{
                **{k: v for k, v in data.items() if k not in ("output_dir", "work_dir")},
                "dap": DapConfig(**data["dap"]),
                "finetune": FinetuneConfig(**data["finetune"]),
                "methods": tuple(data["methods"]),
                "seeds": tuple(data["seeds"]),
            }
        )
    except (TypeError, KeyError) as exc:
        raise DapbenchError(
            f"the record's config does not match this version of dapbench: {exc}",
            "check out the commit named in the record's environment.git_commit and reproduce there",
        ) from exc


def key_numbers(record: dict) -> dict[str, float | None]:
    """Every number a record reports about results, flattened to ``section/key`` names."""
    out: dict[str, float | None] = {}
    for metric, block in record["summary"].items():
        for key, value in (block or {}).items():
            out[f"summary/{metric}/{key}"] = value
    for metric, matrix in record["matrices"].items():
        for t, row in enumerate(matrix):
            for k, value in enumerate(row):
                if value is not None:
                    out[f"matrix/{metric}/{t}/{k}"] = value
    losses = record["mlm_loss"]
    for column, value in losses["base"].items():
        out[f"mlm_loss/base/{column}"] = value
    for t, row in enumerate(losses["after_domain"]):
        for column, value in (row or {}).items():
            out[f"mlm_loss/{t}/{column}"] = value
    return out


def compare_records(expected: dict, actual: dict, tolerance: Tolerance) -> list[Mismatch]:
    """The numbers of ``actual`` that differ from ``expected`` by more than the tolerance."""
    want, got = key_numbers(expected), key_numbers(actual)
    mismatches = []
    for name in sorted(set(want) | set(got)):
        allowed = tolerance.loss if _kind(name) == "loss" else tolerance.score
        a, b = want.get(name), got.get(name)
        if a is None and b is None:
            continue
        if a is None or b is None or not math.isclose(a, b, rel_tol=0.0, abs_tol=allowed):
            mismatches.append(Mismatch(name, a, b, allowed))
    return mismatches


def largest_differences(expected: dict, actual: dict) -> dict[str, tuple[str, float]]:
    """Per kind (``score``, ``loss``): the number present in both records that moved most, and by how much.

    What a tolerance is measured from: run the same record twice (or on two machines) and read these.
    """
    want, got = key_numbers(expected), key_numbers(actual)
    largest: dict[str, tuple[str, float]] = {}
    for name in sorted(set(want) & set(got)):
        if want[name] is None or got[name] is None:
            continue
        kind = _kind(name)
        diff = abs(want[name] - got[name])
        if kind not in largest or diff > largest[kind][1]:
            largest[kind] = (name, diff)
    return largest


def _kind(name: str) -> str:
    """``loss`` for held-out MLM losses, ``score`` for accuracies and F1s (a :class:`Tolerance` field)."""
    return "loss" if name.startswith("mlm_loss/") else "score"


def recorded_cpu_threads(record: dict) -> int | None:
    """The CPU thread count a CPU record was made with; None for accelerator or older records.

    Float summation order depends on it, so the same CPU with the same count gives the same numbers.
    Measured (mini NCL record made with 1 thread, re-run with 2): held-out losses within 1e-5, but
    the linear probe flipped about one test prediction in 7 of 21 cells (macro-F1 up to 0.0125 on SciERC).
    """
    environment = record.get("environment", {})
    return environment.get("torch_threads") if environment.get("device") == "cpu" else None


@contextlib.contextmanager
def cpu_threads(count: int) -> Iterator[None]:
    """Limit torch and the BLAS/OpenMP pools that scikit-learn uses to ``count`` threads, then restore."""
    import torch
    from threadpoolctl import threadpool_limits

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        with threadpool_limits(limits=count):
            yield
    finally:
        torch.set_num_threads(previous)


def reproduction_config(record: dict, output_dir: str | Path, paths: dict[str, str | None]) -> RunConfig:
    """The record's configuration for one fresh run of its method and seed under ``output_dir``.

    Paths given in ``paths`` replace the recorded ones; ``shared:`` locations resolve under this machine's
    shared assets folder; a recorded location that does not exist here (a ``local:`` name from another
    machine) falls back to the profile's default, and the input checksums decide later whether that is
    the same input.
    """
    from benchmark.config import PROFILES
    from benchmark.records import resolve_portable

    config = config_from_dict(record["config"])
    defaults = profile_config(config.profile) if config.profile in PROFILES else None
    replaced = {}
    for name in PATH_FIELDS:
        given, recorded = paths.get(name), resolve_portable(getattr(config, name))
        if given:
            replaced[name] = given
        elif recorded and _missing_here(recorded) and defaults is not None:
            replaced[name] = getattr(defaults, name)
        else:
            replaced[name] = recorded
    out = Path(output_dir)
    return dataclasses.replace(
        config,
        **replaced,
        methods=(record["method"],),
        seeds=(record["seed"],),
        output_dir=str(out),
        work_dir=str(out / ".dapbench"),
    )


def _missing_here(location: str) -> bool:
    """Whether a recorded input location names nothing on this machine (hub ids are taken as present)."""
    return location.startswith("local:") or (Path(location).is_absolute() and not Path(location).exists())


def check_data(record: dict, checksums: dict[str, str]) -> None:
    """Fail with the list of differing inputs if this machine's data is not the record's."""
    recorded = record.get("data_checksums", {})
    differing = sorted(k for k in recorded if checksums.get(k) != recorded[k])
    if differing:
        raise DapbenchError(
            f"the data here differs from the data of the record: {', '.join(differing)}",
            "pass the record's inputs: --model, --data-root, --general-heldout, --general-corpus (a record names"
            " inputs outside the shared assets only as local:<name>)",
        )
