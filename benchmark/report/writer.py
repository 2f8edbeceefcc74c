"""``dapbench report``: records -> groups -> statistics -> reading -> files.

Generated files live apart from the records they are made from: ``<output>/leaderboard.md``, and under
``<output>/results/report/`` the group plots (``plots/``), one table file per record (``runs/``) and a manifest of
what was written from which records. A report rewrites only what changed: a record's table when the record
changed, a group's plots when one of its records did; the leaderboard every time (it is one file). Only files the
manifest says the report wrote are ever deleted, and no symbolic link is followed out of the output folder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_json, atomic_write_text, read_json, unlinked_path
from benchmark.records.store import REPORT_FOLDER, leaderboard_records
from benchmark.report.escape import code, text
from benchmark.report.frame import leaderboard_frame, reference_labels
from benchmark.report.groups import Group, group_records
from benchmark.report.markdown import is_decoder, leaderboard_markdown, loss_unit
from benchmark.report.statistics import GroupStatistics

MANIFEST = "manifest.json"
REPORT_SUBFOLDERS = ("runs", "plots")
"""The report's folders under ``results/report/``: one page per record, the group plots."""


def write_report(output_dir: str | Path, show_progress: bool = False) -> dict[str, int]:
    """Regenerate what changed of the tables, plots and ``leaderboard.md`` under ``output_dir`` from the records
    under ``output_dir/results``; return how many records and groups it read and how many files it wrote."""
    out = Path(output_dir)
    report = report_folder(out)
    records = leaderboard_records(out / "results")  # all but the key-number folder's
    groups, left_out = group_records(records)  # every check runs before anything is written
    previous = _read_manifest(report)
    manifest: dict = {"runs": {}, "groups": {}}
    written, plots_code = 0, _plots_code()
    for group in _progress(groups, show_progress, "report: groups"):
        written += _write_runs(group, report, previous, manifest)
        written += _write_group_plots(group, report, previous, manifest, plots_code)
    sections = [(g, _statistics(g), _links(manifest["groups"][g.key]["files"])) for g in groups]
    ladders = _write_ladders(sections, report, manifest)
    written += len(ladders)
    atomic_write_text(out / "leaderboard.md", leaderboard_markdown(sections, left_out, ladders))
    _fill_readme_answer(out / "README.md", sections)
    _remove_unproduced(report, previous, manifest)
    atomic_write_json(report / MANIFEST, manifest)
    return {"records": len(records), "groups": len(groups), "files": written + 1}


def _statistics(group: Group) -> GroupStatistics:
    part = leaderboard_frame(group.records, group_of=lambda record: group.key)
    return GroupStatistics(part, group.records, group.sample_key, reference_labels(group.records))


def _digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def _write_runs(group: Group, report: Path, previous: dict, manifest: dict) -> int:
    """One Markdown file per record with its A[t][k] and held-out loss matrices, rewritten when its text changed: the
    page is rendered every time (cheap), so a change of the record or of the code that renders it shows."""
    written = 0
    for record in group.records:
        relative = f"runs/{record['run_id']}.md"
        manifest["runs"][record["run_id"]] = {"digest": _digest(record), "file": relative}
        page, path = run_tables(record), report / relative
        if not path.is_file() or path.read_text(encoding="utf-8") != page:
            atomic_write_text(path, page)
            written += 1
    return written


def _plots_code() -> str:
    """A digest of the plotting code: plots are redrawn when it changes, not only when their records do."""
    import inspect

    import benchmark.report.plots as plots  # the module itself, not the package: no import cycle through it

    return hashlib.sha256(inspect.getsource(plots).encode()).hexdigest()


def _write_group_plots(group: Group, report: Path, previous: dict, manifest: dict, plots_code: str) -> int:
    """The group's plots (every one whose data the group has), redrawn when one of its records or the plotting code
    (``plots_code``, its digest: read once per report) changed."""
    from benchmark.report.plots import GROUP_PLOTS

    records = "".join(sorted(manifest["runs"][r["run_id"]]["digest"] for r in group.records))
    digest = hashlib.sha256((records + plots_code).encode())
    entry = {"digest": digest.hexdigest()[:16], "files": {}}
    before = previous["groups"].get(group.key, {})
    if before.get("digest") == entry["digest"] and all((report / f).is_file() for f in before["files"].values()):
        manifest["groups"][group.key] = before
        return 0
    for kind, plot in GROUP_PLOTS.items():
        relative = f"plots/{group.key}-{kind}.png"
        if plot(group.records, report / relative) is not None:
            entry["files"][kind] = relative
    manifest["groups"][group.key] = entry
    return len(entry["files"])


ANSWER_MARKERS = ("<!-- short answer: generated by dapbench report -->", "<!-- end of short answer -->")
"""The block of a ``README.md`` in the output folder that ``dapbench report`` fills with the leaderboard's short answer
(the repository's own README has it; a user's output folder has no README, so a user's report never writes one)."""


def _fill_readme_answer(readme: Path, sections: list) -> None:
    """Rewrite the block between :data:`ANSWER_MARKERS` of ``readme`` (if it has one) with the short answer."""
    from benchmark.report.answer import short_answer

    if readme.is_symlink() or not readme.is_file():
        return
    text = readme.read_text(encoding="utf-8")
    start, end = ANSWER_MARKERS
    if start not in text or end not in text:
        return
    answer = short_answer(sections)[2:-1] or ["- no group answers yet"]
    head, rest = text.split(start, 1)
    block = "\n".join([start, *answer, "", "[The evidence](leaderboard.md#the-short-answer).", ""])
    new = head + block + end + rest.split(end, 1)[1]
    if new != text:
        atomic_write_text(readme, new)


def report_folder(out: Path) -> Path:
    """``out/results/report`` after checking that it and its page and plot folders are no symbolic links: the report
    writes and deletes only inside its own folders (checked before any write, and by a run before any work)."""
    report = unlinked_path(out, "results", REPORT_FOLDER)
    for folder in REPORT_SUBFOLDERS:
        unlinked_path(report, folder)
    return report


def _write_ladders(sections: list, report: Path, manifest: dict) -> list[list[str]]:
    """Every budget ladder among the groups (:mod:`benchmark.report.ladder`), read, plotted and written as leaderboard
    lines; its plot is listed in the manifest like a group's, so it is removed once the ladder is gone."""
    from benchmark.report.ladder import find_ladders, ladder_markdown, plot_ladder, read_ladder

    out = []
    for ladder in find_ladders(sections):
        reading, relative = read_ladder(ladder), f"plots/ladder-{ladder.key}.png"
        plot_ladder(reading, report / relative)
        manifest["groups"][f"ladder-{ladder.key}"] = {"digest": ladder.key, "files": {"ladder": relative}}
        out.append(ladder_markdown(reading, _links({"ladder": relative})["ladder"]))
    return out


def _links(files: dict[str, str]) -> dict[str, str]:
    return {kind: f"results/{REPORT_FOLDER}/{relative}" for kind, relative in files.items()}


def _read_manifest(report: Path) -> dict:
    path = report / MANIFEST
    if not path.exists():
        return {"runs": {}, "groups": {}}
    manifest = read_json(path, "report manifest")
    if not isinstance(manifest, dict) or not {"runs", "groups"} <= set(manifest):
        raise DapbenchError(f"{path} is not a report manifest", f"delete {report} (it is regenerated)")
    return manifest


def _remove_unproduced(report: Path, previous: dict, manifest: dict) -> None:
    """Delete the files an earlier report wrote that no current record or group produces (and nothing else)."""
    produced = {entry["file"] for entry in manifest["runs"].values()}
    produced |= {f for entry in manifest["groups"].values() for f in entry["files"].values()}
    earlier = {entry["file"] for entry in previous["runs"].values()}
    earlier |= {f for entry in previous["groups"].values() for f in entry.get("files", {}).values()}
    for relative in sorted(earlier - produced):
        path = (report / relative).resolve()
        if report.resolve() in path.parents and path.is_file() and not (report / relative).is_symlink():
            path.unlink()


def _progress(items: list, show: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, disable=not show or len(items) < 2, leave=False)


def run_tables(record: dict) -> str:
    """A record's matrices as Markdown: A[t][k] (accuracy and macro-F1, percent) and the held-out loss matrix."""
    import numpy as np
    import pandas as pd

    domains, tasks = record["sequence"], record["end_tasks"]
    lines = [f"# {code(record['method_label'])} seed {record['seed']}", "", f"run {code(record['run_id'])}", ""]
    for score in ("acc", "macro_f1"):
        rows = [[None if v is None else round(100 * v, 2) for v in row] for row in record["matrices"][score]]
        frame = pd.DataFrame(rows, index=[f"after {text(d)}" for d in domains], columns=[text(t) for t in tasks])
        lines += [f"## {score} (%)", "", frame.to_markdown(floatfmt=".2f"), ""]
    losses = record["mlm_loss"]
    rows = [losses["base"], *(row or {} for row in losses["after_domain"])]
    index = ["base", *[f"after {text(d)}" for d in domains]]
    frame = pd.DataFrame(rows, index=index)[losses["columns"]]
    frame.columns = [text(c) for c in frame.columns]
    lines += ["## {} ({})".format(*loss_unit(record)), "", frame.to_markdown(floatfmt=".4f"), ""]
    if is_decoder(record):
        lines += ["## perplexity (exp of the loss)", "", np.exp(frame.astype(float)).to_markdown(floatfmt=".1f"), ""]
    return "\n".join(lines)
