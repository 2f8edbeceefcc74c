"""The cells A[t][k] of the end-task matrix: each end task fine-tuned (or probed) from checkpoint t, once, resumably,
spread over the processes of a multi-process run."""

from __future__ import annotations

import contextlib
import time

from benchmark.engine.parts import RunParts
from benchmark.engine.schedule import BESIDE_MATRIX
from benchmark.engine.stages import StageModels
from benchmark.engine.workfiles import finished, read_work_file, write_work_file
from benchmark.errors import error_context
from benchmark.method import FinetuneContext
from benchmark.protocols import LANGUAGE_MODEL, EndTaskProtocol, protocols_of

SCORES = ("acc", "macro_f1", "micro_f1")
"""The end-task scores of every cell A[t][k] (fractions)."""


class EndTaskRunner:
    """The cells A[t][k]: each end task fine-tuned (or probed) from checkpoint t, once per protocol the run scores
    with (``finetune.protocol``, and ``finetune.beside`` when set)."""

    def __init__(self, parts: RunParts, models: StageModels):
        self.parts, self.models = parts, models

    def protocols(self) -> list[EndTaskProtocol]:
        """The run's protocols: its own first, then the one beside it, if any."""
        return protocols_of(self.parts.config.finetune)

    def run_row(self, t: int, on_cell_done=lambda: None) -> None:
        """Every cell of row ``t`` that the matrix mode asks for and that is not finished yet, under each protocol
        (the run's own first)."""
        p, row_key, acc = self.parts, self.parts.schedule.row_key(t), self.parts.accelerator
        cells = [(k, protocol, beside) for beside, protocol in self._tagged() for k in self._row_tasks(t, beside)]
        todo = [(k, protocol, beside) for k, protocol, beside in cells if not self._finished(row_key, k, beside)]
        mine = todo[acc.process_index :: acc.num_processes]  # several processes take whole fine-tunes each
        p.skip_phases(len(cells) - len(todo))
        dap_model = self.models.load(t) if mine else None
        for i, (k, protocol, beside) in enumerate(mine):
            self._score(t, k, protocol, beside, dap_model, f"{i + 1}/{len(mine)}")
            on_cell_done()
        acc.wait_for_everyone()  # every cell of the row is on disk before anyone reads the matrix or trains on
        p.skip_phases(len(todo) - len(mine))  # the cells the other processes scored

    def _score(self, t: int, k: int, protocol: EndTaskProtocol, beside: str | None, dap_model, counter: str) -> None:
        """Score cell A[t][k] under ``protocol`` and write its work file."""
        from transformers import set_seed

        p, row_key = self.parts, self.parts.schedule.row_key(t)
        task = p.data.tasks[p.data.domains[k]]
        domain_id = k if p.method.capabilities.needs_domain_id_at_finetune else None
        ctx = FinetuneContext(p.layout.verified_checkpoint(t), dap_model, task.num_labels, task_domain_index=domain_id)
        start = time.perf_counter()
        seed = p.seed + p.config.finetune.seed_offset
        repeats = p.config.finetune.seeds if protocol.trains else 1  # a seed-free protocol scores alike every time
        phase = f"end task {counter} {task.name} ({protocol.words})"
        settings = protocol.settings_of(p.config.finetune)  # the protocol's own typed settings, alike for every seed
        results, report = [], None
        with error_context(f"{p.where}, checkpoint after domain {t}, end task {task.name}"), p.phase(t, phase):
            for fine_tune_seed in (seed + FINETUNE_SEED_STRIDE * i for i in range(repeats)):
                # Seeded before the classifier exists: its fresh head must not depend on what ran before
                # (a resumed run skips work and would otherwise draw a different head).
                set_seed(fine_tune_seed)
                model = p.method.end_task_model(ctx, protocol.scores).to(p.accelerator.device)
                # A protocol that scores the language model sees it as the method serves the task's domain, as the
                # held-out losses do (a task mask, a domain's prompt).
                lm = protocol.scores == LANGUAGE_MODEL
                with p.method.heldout_view(model, k) if lm else contextlib.nullcontext():
                    args = (model, task, p.data.tokenizer, settings, fine_tune_seed)
                    results.append(protocol.evaluate(*args, p.accelerator))
                report = report or p.method.finetune_report(model)
        result = seed_mean(results)
        cell = {"row": t, "task": task.name, **result, **({"method_report": report} if report else {})}
        cell["seconds"] = round(time.perf_counter() - start, 3)
        write_work_file(p.layout.finetune_cell(row_key, k, beside), cell)
        where = "end_task" if beside is None else f"end_task_{beside}"
        p.tracker.log_values(f"{where}/{task.name}/after_{t}", result)

    def seconds(self) -> float | None:
        """Seconds the finished cells took together, under every protocol (their models built, trained or probed,
        and scored); None where a cell was made before cells recorded their time."""
        # Once per cell file: the no-DAP baseline's rows share their cells (``row_key``), and the matrix lists a
        # shared cell in every row that asks for it.
        paths = {path for beside, _ in self._tagged() for _, _, path in self._cell_paths(beside)}
        seconds = [read_work_file(path, "fine-tune result").get("seconds") for path in paths]
        return None if None in seconds else sum(seconds)

    def _tagged(self) -> list[tuple[str | None, EndTaskProtocol]]:
        """Each protocol of the run with the tag of its cell files: None for the run's own, its name for the one
        beside it."""
        own, *others = self.protocols()
        return [(None, own), *((q.name, q) for q in others)]

    def _row_tasks(self, t: int, beside: str | None) -> list[int]:
        """The columns of row ``t`` a protocol scores: the run's matrix mode for its own, the diagonal and last row
        for the one beside it (:data:`~benchmark.engine.schedule.BESIDE_MATRIX`)."""
        return self.parts.schedule.row_tasks(t, None if beside is None else BESIDE_MATRIX)

    def _cell_paths(self, beside: str | None = None):
        """Every cell the protocol asks for, as ``(t, k, its work file)``, row by row (a shared cell in each row)."""
        p = self.parts
        for t in p.schedule.stages():
            for k in self._row_tasks(t, beside):
                yield t, k, p.layout.finetune_cell(p.schedule.row_key(t), k, beside)

    def _cells(self, beside: str | None = None):
        """Every finished cell the protocol asks for, as ``(t, k, its work file's contents)``, row by row."""
        for t, k, path in self._cell_paths(beside):
            yield t, k, read_work_file(path, "fine-tune result")

    def _finished(self, row_key: str, k: int, beside: str | None = None) -> bool:
        """Whether cell ``k`` of row ``row_key`` is done (its file intact; a corrupt one is moved aside and redone)."""
        path, main = self.parts.layout.finetune_cell(row_key, k, beside), self.parts.accelerator.is_main_process
        return finished(path, "fine-tune result", main)

    def seed_predictions(self, beside: str | None = None) -> dict[str, list[list[int]]]:
        """Per cell fine-tuned more than once (``finetune.seeds``), the test predictions of every fine-tune after the
        first (whose predictions are the cell's ``predictions``); those of the protocol ``beside`` when named."""
        return {
            f"{t}/{k}": cell["seed_predictions"] for t, k, cell in self._cells(beside) if "seed_predictions" in cell
        }

    def matrices(self, beside: str | None = None):
        """A[t][k] per score from the finished cells (None where the matrix mode skips a cell), each cell's test
        predictions keyed ``t/k`` (what the report bootstraps the test sample over) and the method's reports on the
        cells' fine-tuned models (``finetune_report``; empty for most methods); those of the protocol ``beside`` the
        run's own when named."""
        size = len(self.parts.data.domains)
        out: dict[str, list[list[float | None]]] = {m: [[None] * size for _ in range(size)] for m in SCORES}
        predictions, reports = {}, {}
        for t, k, cell in self._cells(beside):
            for metric in out:
                out[metric][t][k] = cell[metric]
            predictions[f"{t}/{k}"] = cell["predictions"]
            if "method_report" in cell:
                reports[f"{t}/{k}"] = cell["method_report"]
        return out, predictions, reports

    def beside(self) -> dict[str, tuple] | None:
        """The matrices, predictions and reports of the protocol beside the run's own, and the predictions of its
        further fine-tunes (:meth:`seed_predictions`), by its name (None without)."""
        return {name: (*self.matrices(name), self.seed_predictions(name)) for name, _ in self._tagged()[1:]} or None


FINETUNE_SEED_STRIDE = 1000
"""The i-th fine-tune of a cell (``finetune.seeds``) is seeded with the fine-tune seed + this times i: apart from every
other run's seeds (2021, 111, 222, ...)."""


def seed_mean(results: list[dict]) -> dict:
    """One cell's result from the results of its fine-tunes: the first's, with every score the mean of theirs, the
    later fine-tunes' test predictions kept (``seed_predictions``: each one's scores follow from them) and their
    seconds summed; a single result as it is."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    mean = {score: float(sum(r[score] for r in results) / len(results)) for score in SCORES}
    seconds = {key: round(sum(r[key] for r in results), 3) for key in ("train_seconds", "eval_seconds") if key in first}
    return {
        **first,
        **mean,
        **seconds,
        "seed_predictions": [r["predictions"] for r in results[1:]],
    }
