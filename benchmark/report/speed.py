"""DAP speed compared only between runs on the same machine.

A record's tokens per second say as much about the machine as about the method: the project's CPU runs span an
AVX2-only CPU and a faster AVX-512 one, and a ratio of two rows' means over a mix of both is a ratio of machines.
So a speed ratio is taken only between records that name the same machine (:func:`machine_of`). Records made before
records named their CPU model but after they named its float kernels are taken as one machine per kernel set (the
project's two CPUs differ there); records that name neither are never compared. Records that say how loaded the
machine was (``environment.cpu_load_per_core``) are compared only with records of the same load class: a run on an
oversubscribed machine against one that had its cores made ratios like 7x that were the machines' load, not the
methods'. Runs of a grid share the machine with each other (two streams at one thread each on two cores: one task
per core), so the ratio still carries that load, alike for both rows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from benchmark.report.words import say

TEMPLATE = "speed.md.j2"
"""The template that holds the speed reading's words."""


def machine_of(record: dict) -> str | None:
    """The machine a record's speed was measured on: the accelerator's or the CPU's model name with its float
    kernels, the process and thread counts; for a CPU run made before records carried ``environment.cpu_model``, an
    unnamed CPU of its kernels; None where it names neither (its machine is not known)."""
    env = record["environment"]
    processes = int(env.get("num_processes") or 1)
    across = f" x {processes} processes" if processes > 1 else ""
    if str(env.get("device", "cpu")).startswith("cuda"):
        return f"{env['device_name']}{across}"
    model, kernels = env.get("cpu_model"), env.get("cpu_kernels")
    if not model and not kernels:
        return None
    cpu = f"{model} ({kernels})" if model else f"an unnamed {kernels} CPU"
    return f"{cpu}, {env.get('torch_threads')} thread(s){across}{_load_class(env.get('cpu_load_per_core'))}"


OVERSUBSCRIBED = 1.25
"""Load per usable core above which a CPU run's speed counts as measured on an oversubscribed machine (more runnable
work than cores: each run got a share of a core, not a core), compared only with runs measured so too."""


def _load_class(load: float | None) -> str:
    """How a record's machine was loaded, as its machine name carries it ("" where the record does not say)."""
    if load is None:
        return ""
    return ", oversubscribed" if load > OVERSUBSCRIBED else ", at most one runnable task per core"


def machine_counts(records: list[dict]) -> list[str]:
    """Each machine of ``records`` with its run count, as a group's header lists them (unnamed ones together)."""
    counts = Counter(machine_of(r) or "a CPU that the records do not name" for r in records)
    return [f"{machine} ({n} run{'' if n == 1 else 's'})" for machine, n in sorted(counts.items())]


def mixed_machines_flag(records: list[dict]) -> str:
    """A row's flag where its tokens/s column is a mean over runs of more than one machine (one whose records do not
    name it counts as another), so that column is no speed of the method alone; "" where one machine made them all."""
    machines = {machine_of(r) for r in records if r["timing"].get("tokens_per_second")}
    return f"tokens/s over {len(machines)} machines" if len(machines) > 1 else ""


@dataclass(frozen=True)
class SpeedRatio:
    """A row's mean DAP tokens per second over a reference row's, both on one machine."""

    ratio: float
    machine: str
    runs: int
    """The row's records on that machine."""
    reference_runs: int
    """The reference's records on that machine."""


def _speeds(records: list[dict], label: str) -> dict[str, list[float]]:
    """Machine -> the tokens per second of ``label``'s records that name it and measured DAP."""
    out: dict[str, list[float]] = {}
    for record in records:
        machine, speed = machine_of(record), record["timing"].get("tokens_per_second")
        if record["method_label"] == label and machine is not None and speed:
            out.setdefault(machine, []).append(float(speed))
    return out


def same_machine_speed(records: list[dict], label: str, reference: str) -> SpeedRatio | None:
    """``label``'s speed against ``reference``'s on the machine where both have the most runs (the fewer of the two
    counts, then the sum, then the name, decides), or None where no machine holds runs of both."""
    mine, theirs = _speeds(records, label), _speeds(records, reference)
    shared = set(mine) & set(theirs)
    if not shared:
        return None
    machine = min(shared, key=lambda m: (-min(len(mine[m]), len(theirs[m])), -len(mine[m]) - len(theirs[m]), m))
    a, b = mine[machine], theirs[machine]
    return SpeedRatio((sum(a) / len(a)) / (sum(b) / len(b)), machine, len(a), len(b))


def speed_reading(stats) -> list[str]:
    """The group's DAP speed against its naive continual reference, each row only on a machine it shares with it;
    the rows with no such machine named as not compared."""
    naive = stats.references.get("naive_continual")
    if naive is None:
        return []
    labels = sorted({r["method_label"] for r in stats.records if r["timing"].get("tokens_per_second")} - {naive})
    ratios = {label: same_machine_speed(stats.records, label, naive) for label in labels}
    by_machine: dict[str, list[tuple[str, SpeedRatio]]] = {}
    for label, found in ratios.items():
        if found is not None:
            by_machine.setdefault(found.machine, []).append((label, found))
    lines = [say(TEMPLATE, "same_machine", naive, machine, found) for machine, found in sorted(by_machine.items())]
    apart = [label for label, found in ratios.items() if found is None]
    if apart:
        lines.append(say(TEMPLATE, "apart", naive, apart))
    return lines
