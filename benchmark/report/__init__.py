"""``dapbench report`` as a pipeline: records -> groups (:mod:`.groups`) -> rows (:mod:`.frame`) -> statistics
(:mod:`.statistics`) -> reading (:mod:`.reading`) -> Markdown and plots (:mod:`.markdown`, :mod:`.plots`), written by
:mod:`.writer`, and the static site (:mod:`.site`)."""

from benchmark.report.frame import leaderboard_frame
from benchmark.report.writer import write_report

__all__ = ["leaderboard_frame", "write_report"]
