"""What the renderers say of a group and of a run, in Markdown: shared by the leaderboard (:mod:`.markdown`) and the
site (:mod:`.site`), so that neither renderer imports the other. Every sentence is generated from the group's
statistics or the record's numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmark.report.end_task_reading import end_task_reading
from benchmark.report.escape import text
from benchmark.report.frame import GENERATED_WORLD, is_decoder, loss_unit
from benchmark.report.reading import loss_reading, sibling_reading, variant_reading
from benchmark.report.speed import speed_reading
from benchmark.report.statistics import GroupStatistics
from benchmark.report.training_reading import training_reading
from benchmark.report.words import say

TEMPLATE = "group.md.j2"
"""The template that holds these words."""


def group_reading(stats: GroupStatistics) -> list[str]:
    """A group's reading: the sentences generated from its numbers (loss metrics, training, variants, siblings, end
    tasks), as Markdown list lines."""
    readings = (loss_reading, training_reading, speed_reading, variant_reading, sibling_reading, end_task_reading)
    return [line for reading in readings for line in reading(stats)]


def generated_world_note(record: dict) -> str | None:
    """What a group of the generated world is (None for real text): said in the group itself, because a reader who
    lands on it must not read its verdicts as ones about real text (the short answer never reads it either)."""
    if record["profile"] != GENERATED_WORLD:
        return None
    return say(TEMPLATE, "generated_world")


def run_matrices(record: dict) -> list[str]:
    """A record's numbers as Markdown sections: its loss metrics, A[t][k] (accuracy and macro-F1, percent) and the
    held-out loss matrix (with perplexity for a decoder), every number rounded for reading."""
    domains, tasks = record["sequence"], record["end_tasks"]
    unit = loss_unit(record)
    metrics = pd.DataFrame({unit[1]: record["lm_loss"]["metrics"]})
    lines = ["## loss metrics", "", metrics.to_markdown(floatfmt=".4f", missingval="n/a"), ""]
    for score in ("acc", "macro_f1"):
        rows = [[None if v is None else round(100 * v, 2) for v in row] for row in record["matrices"][score]]
        frame = pd.DataFrame(rows, index=[f"after {text(d)}" for d in domains], columns=[text(t) for t in tasks])
        lines += [f"## {score} (%)", "", frame.to_markdown(floatfmt=".2f"), ""]
    losses = record["lm_loss"]
    rows = [losses["base"], *(row or {} for row in losses["after_domain"])]
    index = ["base", *[f"after {text(d)}" for d in domains]]
    frame = pd.DataFrame(rows, index=index)[losses["columns"]]
    frame.columns = [text(c) for c in frame.columns]
    lines += ["## {} ({})".format(*unit), "", frame.to_markdown(floatfmt=".4f"), ""]
    if is_decoder(record):
        lines += [say(TEMPLATE, "perplexity_title"), "", np.exp(frame.astype(float)).to_markdown(floatfmt=".1f"), ""]
    return lines
