"""``dapbench report``: records -> groups -> statistics -> reading -> files.

Generated files live apart from the records they are made from: ``<output>/leaderboard.md``, and under
``<output>/results/report/`` the group plots (``plots/``), one table file per record (``runs/``), the site and a
manifest of what was written from which records. In the repository only ``leaderboard.md`` and the README's generated
blocks are committed: ``results/report/`` is built (by ``dapbench report`` and by CI), so a new record adds its own
files and a few changed lines to the history, not a rebuilt site and plots. ``--check`` compares the committed files
with what the records give, and a built ``results/report/`` too where there is one; without one it builds the
report in a temporary folder it removes, so a fresh clone can be checked. A report rewrites only what changed: a
record's table when the record changed, a group's plots when one of its records did; the leaderboard every time (it
is one file). Only files the manifest says the report wrote are ever deleted, and no symbolic link is followed out
of the output folder.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from typing_extensions import NotRequired, TypedDict

from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_text, bar_disabled, read_json, unlinked_path
from benchmark.records.store import REPORT_FOLDER, leaderboard_entries
from benchmark.report.answer import answer_summary, answering_group, rows_table, short_answer
from benchmark.report.frame import leaderboard_frame, method_colours, reference_labels
from benchmark.report.groups import Group, group_records
from benchmark.report.markdown import leaderboard_markdown, run_tables
from benchmark.report.site import PLOTLY_ASSET, SITE_FOLDER, plotly_bundle, site_files
from benchmark.report.statistics import GroupStatistics

MANIFEST = "manifest.json"
REPORT_SUBFOLDERS = ("runs", "plots", SITE_FOLDER)
"""The report's folders under ``results/report/``: one page per record, the group plots, the static site."""
SITE_SUBFOLDERS = ("assets", "data")
"""The site's own folders (Plotly's bundle; each group's CSV)."""
PENDING = "pending.txt"
"""The report's journal: every file a report writes that its last manifest does not list is named here before it is
written, so a report stopped before its manifest leaves no file that no later report knows to remove."""
REPORT_FILE = re.compile(r"runs/[^/]+\.md|plots/[^/]+\.png|site/(assets/|data/)?[^/]+\.(html|css|js|csv)")
"""The files a report writes, relative to its folder: a manifest or journal naming anything else is not the report's
(it would make the report delete a file it did not write)."""


class _Sink:
    """Where the report's files go: written when their content changed, or with ``check`` (``dapbench report
    --check``) compared only, the ones that would change named in :attr:`stale` and nothing written."""

    def __init__(self, out: Path, check: bool, scratch: Path | None = None):
        self.out, self.check, self.scratch, self.stale, self.written = out, check, scratch, [], 0
        self.journal: Path | None = None
        """The report folder's :data:`PENDING` journal, once the report knows what its last manifest lists."""
        self.listed: set[Path] = set()

    def compares(self, path: Path) -> bool:
        """Whether ``path`` is only compared (``check``), not written: a file of the scratch build is written."""
        return self.check and not (self.scratch is not None and self.scratch in path.parents)

    def text(self, path: Path, content: str) -> None:
        """Write ``content`` to ``path`` unless it already holds it."""
        if path.is_file() and path.read_text(encoding="utf-8") == content:
            return
        self._changed(path, lambda: atomic_write_text(path, content))

    def change(self, path: Path, action: Callable[[], object]) -> None:
        """Take ``action``, which changes ``path`` (deletes it), or with ``check`` name ``path`` stale."""
        self._changed(path, action)

    def _changed(self, path: Path, write: Callable[[], object]) -> None:
        if self.compares(path):
            self.stale.append(str(path.relative_to(self.out)))
            return
        if self.journal is not None and self.journal.parent in path.parents and path not in self.listed:
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            with self.journal.open("a", encoding="utf-8") as journal:  # named before it exists, flushed on close
                journal.write(path.relative_to(self.journal.parent).as_posix() + "\n")
            self.listed.add(path)
        write()
        self.written += 1


def write_report(output_dir: str | Path, show_progress: bool = False, check: bool = False) -> dict:
    """Regenerate what changed of the tables, plots, site and ``leaderboard.md`` under ``output_dir`` from the records
    under ``output_dir/results``; return how many records and groups it read and how many files it wrote. With
    ``check``, write nothing and return under ``stale`` the files a report would change (empty: up to date); where no
    report was built under ``output_dir`` (a fresh clone), the check builds one in a temporary folder and compares the
    committed files alone."""
    out = Path(output_dir)
    report = report_folder(out)
    if not check or (report / MANIFEST).is_file():
        return _write_report(out, report, show_progress, _Sink(out, check))
    scratch = Path(tempfile.mkdtemp(prefix="dapbench-check-"))
    try:
        built = report_folder(scratch)
        return _write_report(out, built, show_progress, _Sink(out, check, scratch=scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # made by this call, removed by it


def _write_report(out: Path, report: Path, show_progress: bool, sink: _Sink) -> dict:
    entries = leaderboard_entries(out / "results")  # all but the key-number folder's
    records = [record for _, record in entries]
    groups, left_out = group_records(records)  # every check runs before anything is written
    previous = _read_manifest(report)
    if not sink.check:
        sink.journal, sink.listed = report / PENDING, {report / relative for relative in _files(previous)}
    manifest: dict = {"runs": {}, "groups": {}, "site": []}
    plots_code = _plots_code()
    colours = method_colours([r["method_label"] for r in records])  # one colour per method on every plot and page
    for group in _progress(groups, show_progress, "report: groups"):
        _write_runs(group, report, manifest, sink)
        _write_group_plots(group, report, previous, manifest, (plots_code, colours), sink)
    sections = [(g, group_statistics(g), _links(manifest["groups"][g.key]["files"])) for g in groups]
    readings, ladders = _write_ladders(sections, report, manifest, sink, colours)
    summary = answer_summary(sections, readings)  # once: the README shows it, the short answer opens with it
    answer = short_answer(sections, readings, summary)  # once: the leaderboard, the README and the site quote it
    sink.text(out / "leaderboard.md", leaderboard_markdown(sections, left_out, ladders, answer))
    for page in GENERATED_BLOCK_PAGES:
        _fill_readme(out / page, sections, summary, sink)
    files = site_files(sections, readings, _record_files(entries, out / "results"), colours, answer)
    _write_site(report, files, manifest, sink)
    _remove_unproduced(report, previous, manifest, sink)
    sink.journal = None  # the manifest lists every file written now
    sink.text(report / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    if not sink.check:
        (report / PENDING).unlink(missing_ok=True)
    return {"records": len(records), "groups": len(groups), "files": sink.written, "stale": sink.stale}


def _record_files(entries: list[tuple[Path, dict]], results: Path) -> dict[str, str]:
    """Run id -> its record file, relative to ``results`` (the site links each run page to its record)."""
    return {record["run_id"]: path.relative_to(results).as_posix() for path, record in entries}


def _write_site(report: Path, files: dict[str, str], manifest: dict, sink: _Sink) -> None:
    """The static site (:mod:`benchmark.report.site`) under ``report/site``: every page rewritten when its text
    changed, Plotly's bundle when the installed plotly's differs from it, all listed in the
    manifest, so the report removes only site files it wrote."""
    site = unlinked_path(report, SITE_FOLDER)
    for relative, content in sorted(files.items()):  # no link below the site either (assets/, data/)
        sink.text(unlinked_path(site, *Path(relative).parts), content)
    bundle = unlinked_path(site, *Path(PLOTLY_ASSET).parts)
    if not (sink.compares(bundle) and bundle.is_file()):  # --check asks only that it is there: it is plotly's own
        sink.text(bundle, plotly_bundle())
    manifest["site"] = sorted(f"{SITE_FOLDER}/{relative}" for relative in [*files, PLOTLY_ASSET])


def group_statistics(group: Group) -> GroupStatistics:
    """A group's statistics as the leaderboard computes them: its frame, evaluation sample and references."""
    part = leaderboard_frame(group.records, group_of=lambda record: group.key)
    return GroupStatistics(part, group.records, group.sample_key, reference_labels(group.records))


def _digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def _write_runs(group: Group, report: Path, manifest: dict, sink: _Sink) -> None:
    """One Markdown file per record with its A[t][k] and held-out loss matrices, rewritten when its text changed: the
    page is rendered every time (cheap), so a change of the record or of the code that renders it shows."""
    for record in group.records:
        relative = f"runs/{record['run_id']}.md"
        manifest["runs"][record["run_id"]] = {"digest": _digest(record), "file": relative}
        sink.text(report / relative, run_tables(record))


def _plots_code() -> str:
    """A digest of the plotting code: plots are redrawn when it changes, not only when their records do."""
    import inspect

    import benchmark.report.plots as plots  # the module itself, not the package: no import cycle through it

    return hashlib.sha256(inspect.getsource(plots).encode()).hexdigest()


def _write_group_plots(group: Group, report: Path, previous: dict, manifest: dict, style: tuple, sink: _Sink) -> None:
    """The group's plots (every one whose data the group has), redrawn when one of its records, the plotting code or
    its methods' colours changed (``style``: the plotting code's digest, read once per report, and the colours)."""
    from benchmark.report.plots import GROUP_PLOTS

    plots_code, colours = style
    mine = {r["method_label"]: colours[r["method_label"]] for r in group.records}
    records = "".join(sorted(manifest["runs"][r["run_id"]]["digest"] for r in group.records))
    digest = hashlib.sha256((records + plots_code + json.dumps(mine, sort_keys=True)).encode())
    entry = {"digest": digest.hexdigest()[:16], "files": {}}
    before = previous["groups"].get(group.key, {})
    if before.get("digest") == entry["digest"] and all((report / f).is_file() for f in before["files"].values()):
        manifest["groups"][group.key] = before
        return
    for kind, plot in GROUP_PLOTS.items():
        relative = f"plots/{group.key}-{kind}.png"
        if sink.compares(report / relative):
            sink.stale.append(f"results/{REPORT_FOLDER}/{relative}")  # which of them a group has shows once drawn
        elif plot(group.records, report / relative, colours) is not None:
            entry["files"][kind] = relative
            sink.written += 1
    manifest["groups"][group.key] = entry


GENERATED_BLOCK_PAGES = ("README.md", "docs/findings.md")
"""The pages of an output folder whose marked blocks (:data:`ANSWER_MARKERS`, :data:`ROWS_MARKERS`) ``dapbench report``
fills: the repository's README and its findings page quote the leaderboard's numbers; a user's output folder has
neither, so a user's report writes no page of this list."""

ANSWER_MARKERS = ("<!-- short answer: generated by dapbench report -->", "<!-- end of short answer -->")
"""The block of a ``README.md`` in the output folder that ``dapbench report`` fills with the leaderboard's short answer
(the repository's own README has it; a user's output folder has no README, so a user's report never writes one)."""

ROWS_MARKERS = ("<!-- rows of the short answer's group, generated by dapbench report:", "<!-- end of rows -->")
"""A block of such a ``README.md`` that ``dapbench report`` fills with a table of the answering group's rows: the
start marker names them (``<!-- rows of ...: ncl; das -->``, labels separated by ``;``), so that the README quotes the
leaderboard's numbers, never copies of them that a new seed leaves stale."""


def _fill_readme(readme: Path, sections: list, summary: str, sink: _Sink) -> None:
    """Rewrite the short-answer block (:data:`ANSWER_MARKERS`, with the answer's ``summary``,
    :func:`~benchmark.report.answer.answer_summary`) and every rows block (:data:`ROWS_MARKERS`) of ``readme`` (one
    of :data:`GENERATED_BLOCK_PAGES`), where it has them."""
    if readme.is_symlink() or not readme.is_file():
        return
    sink.text(readme, _fill_rows(_fill_answer(readme.read_text(encoding="utf-8"), summary), sections))


def _fill_answer(text: str, summary: str) -> str:
    start, end = ANSWER_MARKERS
    if start not in text or end not in text:
        return text
    head, rest = text.split(start, 1)
    evidence = "Every claim with its numbers and intervals: [the short answer](leaderboard.md#the-short-answer)."
    block = "\n".join([start, summary or "No group answers yet.", "", evidence, ""])
    return head + block + end + rest.split(end, 1)[1]


def _fill_rows(text: str, sections: list) -> str:
    start, end = ROWS_MARKERS
    found = answering_group(sections)
    out, rest = [], text
    while start in rest and end in rest.split(start, 1)[1]:
        head, rest = rest.split(start, 1)
        names, rest = rest.split("-->", 1)
        rest = rest.split(end, 1)[1]
        labels = [label.strip() for label in names.split(";") if label.strip()]
        if found is None:
            table = ["- no group answers yet"]
        else:
            group, stats = found
            table = rows_table(stats, labels, f"row (sequence {group.records[0]['config']['sequence']})")
        out += [head, start, names, "-->\n", "\n".join(table), "\n", end]
    return "".join(out) + rest


def report_folder(out: Path) -> Path:
    """``out/results/report`` after checking that it and its page and plot folders are no symbolic links: the report
    writes and deletes only inside its own folders (checked before any write, and by a run before any work)."""
    report = unlinked_path(out, "results", REPORT_FOLDER)
    for folder in REPORT_SUBFOLDERS:
        unlinked_path(report, folder)
    for folder in SITE_SUBFOLDERS:
        unlinked_path(report, SITE_FOLDER, folder)
    return report


def _write_ladders(
    sections: list, report: Path, manifest: dict, sink: _Sink, colours: dict[str, str]
) -> tuple[list, list[list[str]]]:
    """Every budget ladder among the groups (:mod:`benchmark.report.ladder`): its reading, plot and leaderboard lines;
    the plot is listed in the manifest like a group's, so it is removed once the ladder is gone."""
    from benchmark.report.curve_law import curve_law_markdown
    from benchmark.report.ladder import find_ladders, read_ladder
    from benchmark.report.law import law_markdown
    from benchmark.report.markdown import ladder_markdown
    from benchmark.report.plots import plot_ladder

    readings, lines = [], []
    for ladder in find_ladders(sections):
        reading, relative = read_ladder(ladder), f"plots/ladder-{ladder.key}.png"
        if not sink.compares(report / relative):  # cheap, and drawn from the reading alone: redrawn every report
            plot_ladder(reading, report / relative, colours)
        elif not (report / relative).is_file():
            sink.stale.append(f"results/{REPORT_FOLDER}/{relative}")
        manifest["groups"][f"ladder-{ladder.key}"] = {"digest": ladder.key, "files": {"ladder": relative}}
        readings.append(reading)
        text = ladder_markdown(reading, _links({"ladder": relative})["ladder"]) + law_markdown(reading)
        lines.append(text + curve_law_markdown(ladder))
    return readings, lines


def _links(files: dict[str, str]) -> dict[str, str]:
    return {kind: f"results/{REPORT_FOLDER}/{relative}" for kind, relative in files.items()}


class _RunEntry(TypedDict):
    digest: str
    file: str


class _GroupEntry(TypedDict):
    digest: str
    files: dict[str, str]


class Manifest(TypedDict):
    """What a report wrote (``results/report/manifest.json``): per record its page, per group its plots, the site's
    files, each with the digest of what it was made from; the next report removes what no record produces now."""

    runs: dict[str, _RunEntry]
    groups: dict[str, _GroupEntry]
    site: NotRequired[list[str]]
    pending: NotRequired[list[str]]
    """Files of the :data:`PENDING` journal a stopped report left (never written to the manifest file)."""


def _read_manifest(report: Path) -> dict:
    """The last report's manifest with its journal's files, each checked to be a file the report writes."""
    from benchmark.records.schema import type_problems

    path, journal = report / MANIFEST, report / PENDING
    manifest = read_json(path, "report manifest") if path.exists() else {"runs": {}, "groups": {}}
    fix = f"delete {path} and {journal} (the report rewrites every page; it then removes none of the old ones)"
    problems = type_problems(Manifest, manifest)
    if problems:
        raise DapbenchError(f"{path} is not a report manifest: {problems[0]}", fix)
    if journal.is_file() and not journal.is_symlink():
        manifest["pending"] = journal.read_text(encoding="utf-8").splitlines()
    foreign = sorted(f for f in _files(manifest) if not REPORT_FILE.fullmatch(f) or ".." in f)
    if foreign:
        raise DapbenchError(f"{path} or {journal} names {foreign[0]!r}, which is no file a report writes", fix)
    return manifest


def _remove_unproduced(report: Path, previous: dict, manifest: dict, sink: _Sink) -> None:
    """Delete the files an earlier report wrote that no current record or group produces (and nothing else)."""
    for relative in sorted(_files(previous) - _files(manifest)):
        path = (report / relative).resolve()
        if report.resolve() in path.parents and path.is_file() and not (report / relative).is_symlink():
            sink.change(report / relative, path.unlink)


def _files(manifest: dict) -> set[str]:
    """Every file a manifest lists, relative to the report folder."""
    files = {entry["file"] for entry in manifest["runs"].values()}
    files |= {f for entry in manifest["groups"].values() for f in entry.get("files", {}).values()}
    return files | set(manifest.get("site", [])) | set(manifest.get("pending", []))


def _progress(items: list, show: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, disable=bar_disabled(show and len(items) > 1), leave=False)
