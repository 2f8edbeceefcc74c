"""``dapbench tune``: choose one numeric option of a method (a learning rate, typically) at a profile's budget, the
same way for every method, without looking at what the leaderboard measures.

Each candidate value is one continual DAP run through the profile's sequence at the profile's budget, with
``dap.evaluate_on=validation``: the loss matrix is measured on a validation slice of every domain, as many lines as
its held-out part and disjoint from it and from the training lines (:func:`benchmark.data.corpora.validation_split`),
and on as many lines from the end of the general training corpus as the general held-out text has. End tasks are not
run: the choice rests on the declared :data:`CRITERION` alone, and the held-out sets and end tasks that rank methods
play no part in it. Candidates are ordinary runs in the work folder (their own run ids: ``evaluate_on`` is part of
the configuration), so an interrupted tuning resumes where it stopped.

The result, every candidate's validation losses, the criterion and the choice, is written to
``<output-dir>/tuning/<profile>/<method>-<option>-seed<seed>.json``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from benchmark.config import RunConfig, apply_overrides
from benchmark.errors import DapbenchError

CRITERION = "lowest mean validation loss after the last domain, over every domain of the sequence and general text"
"""How ``dapbench tune`` chooses: one number per candidate, the mean of the final row of its validation-loss matrix
(every domain's slice and general text weigh alike: learning the new domains and keeping general knowledge both
count)."""


def tune(
    config: RunConfig, method: str, option: str, values: Sequence[float], seed: int, show_progress: bool = False
) -> dict:
    """Run ``method`` once per value of its ``option`` (``method.key``) on validation slices, choose by
    :data:`CRITERION`, write and return the result."""
    from benchmark.api import continual_run, materialise, quiet_libraries
    from benchmark.io import atomic_write_json, path_inside
    from benchmark.preflight import check_inputs

    if len(values) < 2 or len(set(values)) != len(values):
        raise DapbenchError(f"--values {list(values)}: a choice needs two or more different values", "e.g. 1e-4,1e-3")
    quiet_libraries()
    candidates = [_candidate(config, method, option, value, seed) for value in values]
    for candidate in candidates:  # every candidate's inputs checked before the first trains
        candidate.update(config=materialise(candidate["config"], show_progress))
        candidate.update(data=check_inputs([candidate["config"]])[0])
    rows = []
    for candidate in candidates:
        run = continual_run(candidate["config"], candidate["data"], method, seed, show_progress=show_progress)
        losses = run.pretrain_only()
        label = run.method.label()  # the row it names, with every option the candidate ran with
        rows.append({"value": candidate["value"], "label": label, "run_id": run.run_id, "losses": losses})
        rows[-1]["mean"] = _mean(losses)
    result = {
        "method": method,
        "option": option,
        "profile": config.profile,
        "seed": seed,
        "sequence": config.sequence,
        "criterion": CRITERION,
        "candidates": rows,
        "chosen": min(rows, key=lambda row: row["mean"])["value"],
    }
    name = f"{method}-{option.partition('.')[2]}-seed{seed}.json"
    atomic_write_json(path_inside(config.output_dir, "tuning", config.profile, name), result)
    return result


def _candidate(config: RunConfig, method: str, option: str, value: float, seed: int) -> dict:
    """The configuration of one candidate: ``option=value`` on validation slices, one method and seed."""
    from benchmark.api import validate_config

    section, _, key = option.partition(".")
    if section != method or not key:
        raise DapbenchError(
            f"--option {option!r} is not an option of method {method!r}",
            f"name one of its options as {method}.KEY (`dapbench list` shows them)",
        )
    if not (isinstance(value, int | float) and math.isfinite(value)):
        raise DapbenchError(f"--values: {value!r} is not a finite number", "e.g. --values 1e-4,3e-4,1e-3")
    tuned = apply_overrides(config, [f"{option}={value!r}", "dap.evaluate_on=validation"])
    tuned = dataclasses.replace(tuned, methods=(method,), seeds=(seed,))
    validate_config(tuned)  # the option exists and the value is in its declared range, before any work
    return {"value": value, "config": tuned}


def _mean(losses: dict[str, float]) -> float:
    return sum(losses.values()) / len(losses)
