"""The cells A[t][k] of the end-task matrix: each end task fine-tuned (or probed) from checkpoint t, once, resumably,
spread over the processes of a multi-process run."""

from __future__ import annotations

import contextlib
import time

from benchmark.engine.parts import RunParts
from benchmark.engine.stages import StageModels
from benchmark.engine.workfiles import finished, read_work_file, write_work_file
from benchmark.errors import error_context
from benchmark.method import FinetuneContext
from benchmark.protocols import LANGUAGE_MODEL, get_protocol

SCORES = ("acc", "macro_f1", "micro_f1")
"""The end-task scores of every cell A[t][k] (fractions)."""


class EndTaskRunner:
    """The cells A[t][k]: each end task fine-tuned (or probed) from checkpoint t, once."""

    def __init__(self, parts: RunParts, models: StageModels):
        self.parts, self.models = parts, models

    def run_row(self, t: int, on_cell_done=lambda: None) -> None:
        """Every cell of row ``t`` that the matrix mode asks for and that is not finished yet."""
        from transformers import set_seed

        p, row_key, acc = self.parts, self.parts.schedule.row_key(t), self.parts.accelerator
        protocol = get_protocol(p.config.finetune.protocol)
        todo = [k for k in p.schedule.row_tasks(t) if not self._finished(row_key, k)]
        mine = todo[acc.process_index :: acc.num_processes]  # several processes take whole fine-tunes each
        p.skip_phases(len(p.schedule.row_tasks(t)) - len(todo))
        dap_model = self.models.load(t) if mine else None
        for i, k in enumerate(mine):
            task = p.data.tasks[p.data.domains[k]]
            domain_id = k if p.method.capabilities.needs_domain_id_at_finetune else None
            ctx = FinetuneContext(
                p.layout.verified_checkpoint(t), dap_model, task.num_labels, task_domain_index=domain_id
            )
            start = time.perf_counter()
            seed = p.seed + p.config.finetune.seed_offset
            # Seeded before the classifier exists: its fresh head must not depend on what ran before
            # (a resumed run skips work and would otherwise draw a different head).
            set_seed(seed)
            model = p.method.end_task_model(ctx, protocol.scores).to(p.accelerator.device)
            phase = f"end task {i + 1}/{len(mine)} {task.name} ({protocol.words})"
            # A protocol that scores the language model sees it as the method serves the task's domain, as the
            # held-out losses do (a task mask, a domain's prompt).
            view = p.method.heldout_view(model, k) if protocol.scores == LANGUAGE_MODEL else contextlib.nullcontext()
            with error_context(f"{p.where}, checkpoint after domain {t}, end task {task.name}"), p.phase(t, phase):
                with view:
                    result = protocol.evaluate(model, task, p.data.tokenizer, p.config.finetune, seed, p.accelerator)
            report = p.method.finetune_report(model)
            cell = {"row": t, "task": task.name, **result, **({"method_report": report} if report else {})}
            cell["seconds"] = round(time.perf_counter() - start, 3)
            write_work_file(p.layout.finetune_cell(row_key, k), cell)
            p.tracker.log_values(f"end_task/{task.name}/after_{t}", result)
            on_cell_done()
        acc.wait_for_everyone()  # every cell of the row is on disk before anyone reads the matrix or trains on
        p.skip_phases(len(todo) - len(mine))  # the cells the other processes scored

    def seconds(self) -> float | None:
        """Seconds the finished cells took together (their models built, trained or probed, and scored); None where
        a cell was made before cells recorded their time."""
        seconds = [cell.get("seconds") for _, _, cell in self._cells()]
        return None if None in seconds else sum(seconds)

    def _cells(self):
        """Every finished cell the matrix mode asks for, as ``(t, k, its work file's contents)``, row by row."""
        p = self.parts
        for t in p.schedule.stages():
            for k in p.schedule.row_tasks(t):
                yield t, k, read_work_file(p.layout.finetune_cell(p.schedule.row_key(t), k), "fine-tune result")

    def _finished(self, row_key: str, k: int) -> bool:
        """Whether cell ``k`` of row ``row_key`` is done (its file intact; a corrupt one is moved aside and redone)."""
        path, main = self.parts.layout.finetune_cell(row_key, k), self.parts.accelerator.is_main_process
        return finished(path, "fine-tune result", main)

    def matrices(self) -> tuple[dict[str, list[list[float | None]]], dict[str, list[int]], dict[str, dict]]:
        """A[t][k] per score from the finished cells (None where the matrix mode skips a cell), each cell's test
        predictions keyed ``t/k`` (what the report bootstraps the test sample over) and the method's reports on the
        cells' fine-tuned models (``finetune_report``; empty for most methods)."""
        size = len(self.parts.data.domains)
        out: dict[str, list[list[float | None]]] = {m: [[None] * size for _ in range(size)] for m in SCORES}
        predictions, reports = {}, {}
        for t, k, cell in self._cells():
            for metric in out:
                out[metric][t][k] = cell[metric]
            predictions[f"{t}/{k}"] = cell["predictions"]
            if "method_report" in cell:
                reports[f"{t}/{k}"] = cell["method_report"]
        return out, predictions, reports
