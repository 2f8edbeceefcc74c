"""The leaderboard as a static web site (issue #49), generated from the same sections as ``leaderboard.md``.

The site opens from the file system and asks no other host for anything: pages are rendered by Jinja2 from the
templates in ``site_templates/``, each page's numbers travel inside it as JSON (a browser refuses to fetch a file
next to a page opened from disk), and the charts are drawn by Plotly's own script, shipped in ``assets/``. Pages: an
index with the short answer, one page per leaderboard group (sortable, filterable tables with verdicts spelled out,
interactive charts, CSV downloads), one per method, one per run (its configuration, commit, record and the command
that reproduces it) and a page on submitting a method.

:func:`site_files` returns every page as text keyed by its path inside the site; the report writes the ones that
changed and removes only the files an earlier report wrote (:mod:`benchmark.report.writer`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmark.method import default_of
from benchmark.protocols import protocol_phrase
from benchmark.report.beside import beside_markdown, beside_protocols
from benchmark.report.curve_law import curve_law_markdown
from benchmark.report.escape import spreadsheet_cell
from benchmark.report.frame import (
    FLAGS,
    by_label,
    format_number,
    group_columns,
    loss_unit,
    mean_over_seeds,
    mean_score_matrix,
    method_colours,
    tokens_per_domain,
    untrained_flag,
)
from benchmark.report.group_text import generated_world_note, group_reading, run_matrices
from benchmark.report.groups import Group
from benchmark.report.law import law_markdown
from benchmark.report.matched import matched_markdown
from benchmark.report.reading import verdict_cells, verdict_text
from benchmark.report.speed import mixed_machines_flag
from benchmark.report.stability_gap import curve_chart, group_stability_gap
from benchmark.report.statistics import GroupStatistics

SITE_FOLDER = "site"
"""The site's folder under ``results/report/``."""
TEMPLATES = Path(__file__).with_name("site_templates")
PLOTLY_ASSET = "assets/plotly.min.js"
"""Plotly's browser bundle, copied from the installed ``plotly`` package: the one file the site does not render."""
ROLE_NAMES = {"naive_continual": "naive continual DAP", "proposed": "the paper's method", "no_dap": "no DAP"}
VERDICT_WORDS = {"F": "forgetting", "G": "general-loss rise", "P": "plasticity"}


@dataclass
class GroupView:
    """What a group's page shows: its header facts, one row per method label, and the chart data."""

    group: Group
    stats: GroupStatistics
    facts: list[tuple[str, str]]
    rows: list[dict]
    charts: dict
    reading: list[str]

    @property
    def key(self) -> str:
        """The group's key (its page is ``group-KEY.html``)."""
        return self.group.key


def site_files(
    sections: list[tuple],
    ladders: list,
    record_files: dict[str, str],
    colours: dict[str, str] | None = None,
    answer: list[str] = (),
) -> dict[str, str]:
    """Every file of the site but Plotly's bundle, as text keyed by its path in the site: ``sections`` are the
    leaderboard's ``(group, statistics, plots)``, ``ladders`` its ladder readings, ``record_files`` each run id's record
    file relative to the output folder's ``results/``, ``colours`` each method label's (the plots' own; by default
    :func:`~benchmark.report.frame.method_colours` of the sections' labels), ``answer`` the short answer's lines
    (:func:`benchmark.report.answer.short_answer`, made once per report)."""
    colours = colours or method_colours([label for _, stats, _ in sections for label in stats.part["method"]])
    views = [_group_view(group, stats, colours) for group, stats, _ in sections]
    env = _environment()
    files = {"index.html": _page(env, "index.html.j2", answer=_markdown(list(answer)[2:]), views=views)}
    for view in views:
        charts = {**view.charts, "ladders": _ladder_charts(ladders, view.key, colours)}
        files[f"group-{view.key}.html"] = _page(
            env,
            "group.html.j2",
            view=view,
            charts=charts,
            columns=group_columns(view.stats.part),
            reading=_markdown(view.reading),
            **_leaderboard_sections(view, ladders),
        )
        files[f"data/{view.key}.csv"] = _table_csv(view)
    for name, appearances in _methods(views).items():
        files[f"method-{name}.html"] = _page(env, "method.html.j2", **_method_facts(name), appearances=appearances)
    for view in views:
        for record in view.group.records:
            files[f"run-{record['run_id']}.html"] = _page(env, "run.html.j2", **_run_facts(record, view, record_files))
    files["submit.html"] = _page(env, "submit.html.j2")
    for asset in ("site.css", "site.js"):
        files[f"assets/{asset}"] = (TEMPLATES / asset).read_text(encoding="utf-8")
    return files


def plotly_bundle() -> str:
    """Plotly's browser bundle (``plotly.min.js``) of the installed ``plotly`` package."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["tojson_script"] = _json_for_script
    env.filters["number"] = _number
    return env


def _page(env, template: str, **values) -> str:
    return env.get_template(template).render(**values)


def _json_for_script(value) -> str:
    """JSON safe inside a ``<script type="application/json">`` element (no ``</`` can end it early)."""
    import markupsafe

    text = json.dumps(value, sort_keys=True, allow_nan=False, ensure_ascii=False)
    return markupsafe.Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _number(value: float | None, kind: str) -> str:
    return "n/a" if value is None else format_number(value, kind)


def _leaderboard_sections(view: GroupView, ladders: list) -> dict:
    """The leaderboard's sections of a group that its page shows as they are, as HTML (None where the group has
    none): the protocol beside (``beside``), the stability gap (``gap``), the verdicts at matched plasticity
    (``matched``) and, on the page of a ladder's top rung, the budget law and the schedule's law on the curves
    (``law``)."""
    records = view.group.records
    sections = {
        "beside": beside_markdown(records) if beside_protocols(records) else [],
        "gap": group_stability_gap(view.stats),
        "matched": matched_markdown(view.stats.part, records),
        "law": [
            line
            for r in ladders
            if r.ladder.rungs[-1].key == view.key
            for line in law_markdown(r) + curve_law_markdown(r.ladder)
        ],
    }
    return {name: _markdown(lines, tables=True) if lines else None for name, lines in sections.items()}


def _markdown(lines: list[str], tables: bool = False):
    """Generated Markdown lines (the answer, a reading; with ``tables``, pipe tables too) as HTML; every string from a
    record in them is already escaped for Markdown (:mod:`benchmark.report.escape`), and raw HTML in them is escaped
    again here."""
    import markdown
    import markupsafe

    source = "\n".join(lines).replace("<", "&lt;")
    extensions = ["tables"] if tables else []
    return markupsafe.Markup(markdown.markdown(source, output_format="html", extensions=extensions))


# -- a group's page ------------------------------------------------------------------------------------------------


def _group_view(group: Group, stats: GroupStatistics, colours: dict[str, str]) -> GroupView:
    first = group.records[0]
    dap = first["config"]["dap"]
    unit, measure = loss_unit(first)
    facts = [
        ("profile", first["profile"]),
        ("model", first["config"]["model"]),
        ("domain order", " → ".join(first["sequence"])),
        (
            "DAP per domain",
            f"{dap['steps']} updates of {dap['batch_size']} x {dap['seq_len']} tokens"
            f" ({tokens_per_domain(first):,} tokens), lr {dap['lr']}",
        ),
        ("held-out loss", f"{unit} ({measure})"),
        ("end tasks", protocol_phrase(first["config"]["finetune"])),
        ("seeds", ", ".join(map(str, sorted({r["seed"] for r in group.records})))),
    ]
    note = generated_world_note(first)
    facts += [("data", note)] if note else []
    roles = {label: role for role, label in stats.references.items()}
    cells = verdict_cells(stats)
    rows = [_row(stats, label, roles.get(label), cells.get(label, {}), colours[label]) for label in _labels(stats)]
    _mark_drawn(rows)
    charts = {
        "colours": {r["method"]: r["colour"] for r in rows},
        "references": stats.references,
        "unit": unit,
        "points": _points(rows),
        "continual": curve_chart(group.records),
        **_matrices(group.records),
    }
    return GroupView(group, stats, facts, rows, charts, group_reading(stats))


LEADERS_DRAWN = 5
"""Rows the group page's charts draw at first besides the references: the trained ones that forget least (the
rest are a click away; forty lines at once overlap into noise)."""


def _mark_drawn(rows: list[dict]) -> None:
    """Set each row's ``drawn``: the reference rows and the :data:`LEADERS_DRAWN` trained rows of least forgetting."""

    def forgetting(row: dict) -> float:
        value = row["values"].get("forgetting") or {}
        return np.inf if value.get("mean") is None else value["mean"]

    trained = [row for row in rows if not row["role"] and not row["untrained"]]
    leaders = {row["method"] for row in sorted(trained, key=forgetting)[:LEADERS_DRAWN]}
    for row in rows:
        row["drawn"] = bool(row["role"]) or row["method"] in leaders


def _labels(stats: GroupStatistics) -> list[str]:
    """The group's method labels, best final gain first (the order the leaderboard's continual table uses)."""
    means = stats.part.groupby("method")["final gain"].mean()
    return sorted(means.index, key=lambda label: -np.nan_to_num(means[label], nan=-np.inf))


def _row(stats: GroupStatistics, label: str, role: str | None, cells: dict, colour: str) -> dict:
    runs = stats.part[stats.part["method"] == label]
    records = [r for r in stats.records if r["method_label"] == label]
    values = {}
    for column in group_columns(stats.part):
        found = stats.interval(label, column)
        values[column.title] = None if found is None else {"mean": found[0], "se": found[1], "n": found[2]}
    capabilities, mixed = records[0]["capabilities"], mixed_machines_flag(records)
    return {
        "method": label,
        "base": records[0]["method"],
        "option_row": label != records[0]["method"],
        "role": role,
        "role_name": ROLE_NAMES.get(role or "", ""),
        "colour": colour,
        "n": len(runs),
        "values": values,
        "verdict": _verdict_text(cells),
        "verdict_long": _verdict_sentences(cells),
        "flags": [name for key, name in FLAGS.items() if capabilities.get(key)] + ([mixed] if mixed else []),
        "untrained": untrained_flag(records),
        "params": int(runs["trainable params"].iloc[0]),
        "runs": [{"run_id": r["run_id"], "seed": r["seed"]} for r in sorted(records, key=lambda r: r["seed"])],
    }


def _verdict_text(cells: dict) -> str:
    return verdict_text(cells, name=str) or "–"


def _verdict_sentences(cells: dict) -> list[str]:
    """Each verdict in words, e.g. "forgetting lower than ncl"; resolved by the seeds' paired t-test and the held-out
    sample's bootstrap alike."""
    out = []
    for (letter, arrow), refs in cells.items():
        direction = "lower" if arrow == "↓" else "higher"
        out.append(f"{VERDICT_WORDS[letter]} {direction} than {', '.join(refs)}")
    return out


def _points(rows: list[dict]) -> list[dict]:
    """Per row, the stability-plasticity chart's point: plasticity against forgetting, with their standard errors."""
    out = []
    for row in rows:
        plasticity, forgetting = row["values"]["plasticity"], row["values"]["forgetting"]
        if plasticity is None or forgetting is None:
            continue
        out.append(
            {
                "method": row["method"],
                "x": plasticity["mean"],
                "y": forgetting["mean"],
                "x_se": plasticity["se"],
                "y_se": forgetting["se"],
            }
        )
    return out


def _matrices(records: list[dict]) -> dict:
    """Per method label, the mean over seeds of its held-out loss matrix (base row first) and of its macro-F1
    matrix A[t][k] (percent); NaN cells (not computed) become None."""
    first = records[0]
    columns = first["lm_loss"]["columns"]
    losses, scores = {}, {}
    for label, runs in by_label(records).items():
        rows = [
            [_loss_row(r["lm_loss"]["base"], columns)]
            + [_loss_row(row, columns) for row in r["lm_loss"]["after_domain"]]
            for r in runs
        ]
        losses[label] = _json_matrix(mean_over_seeds(rows))
        scores[label] = _json_matrix(mean_score_matrix(runs, "macro_f1"))
    stages = ["base", *(f"after {d}" for d in first["sequence"])]
    return {"loss_columns": columns, "stages": stages, "tasks": first["end_tasks"], "losses": losses, "scores": scores}


def _loss_row(row: dict | None, columns: list[str]) -> list[float | None]:
    return [None if not row or row.get(c) is None else row[c] for c in columns]


def _json_matrix(mean: np.ndarray) -> list:
    """A mean matrix for the page's JSON: 5 decimals, a cell no seed computed as None."""
    return [[None if np.isnan(v) else round(float(v), 5) for v in row] for row in mean]


def _ladder_charts(ladders: list, key: str, colours: dict[str, str]) -> list[dict]:
    """The budget ladders a group is a rung of: per metric and row, its mean at each rung's tokens per domain (a gap
    at a rung that flags it untrained, whose point is listed in ``untrained`` to be drawn apart, as the leaderboard's
    plot does), and the reach of its 95% bootstrap interval above and below the mean (``errors``)."""
    from benchmark.report.ladder import budget_series, ladder_columns

    columns = {c.title: c for c in ladder_columns()}
    out = []
    for reading in ladders:
        rungs = reading.ladder.rungs
        if key not in {r.key for r in rungs}:
            continue
        metrics, untrained = {}, {}
        for title, rows in reading.means.items():
            shown = {label: means for label, means in rows.items() if label in colours}
            drawn = {label: budget_series(reading.ladder, label, means, 1.0) for label, means in shown.items()}
            metrics[title] = {label: [_finite(v) for v in line] for label, (line, _) in drawn.items()}
            untrained[title] = {label: flagged for label, (_, flagged) in drawn.items() if flagged}
        chart = {"key": reading.ladder.key, "tokens": [r.tokens_per_domain for r in rungs], "metrics": metrics}
        chart["titles"] = [title for title in columns if title in metrics]  # the order of the leaderboard's plot
        chart["errors"] = {title: _reaches(reading, columns[title], rows) for title, rows in metrics.items()}
        chart["untrained"] = untrained
        out.append(chart)
    return out


def _finite(value: float) -> float | None:
    """A chart value for the page's JSON: None for NaN (a gap in the line)."""
    return None if value is None or not np.isfinite(value) else float(value)


def _reaches(reading, column, rows: dict[str, list]) -> dict[str, dict[str, list[float | None]]]:
    """Per row of a ladder's metric panel, how far its 95% bootstrap interval reaches above (``plus``) and below
    (``minus``) its mean at each rung, as Plotly's error bars take it; None where a rung has no mean or no interval
    (:func:`benchmark.report.ladder.budget_band`)."""
    from benchmark.report.ladder import budget_band

    out = {}
    for label, means in rows.items():
        plus, minus = [], []
        for mean, low, high in zip(means, *budget_band(reading, column, label, 1.0), strict=True):
            known = mean is not None and np.isfinite(low) and np.isfinite(high)  # a gap has no interval either
            plus.append(round(max(0.0, high - mean), 6) if known else None)
            minus.append(round(max(0.0, mean - low), 6) if known else None)
        out[label] = {"plus": plus, "minus": minus}
    return out


def _table_csv(view: GroupView) -> str:
    """The group's table as CSV: per row its label, seeds, each column's mean and standard error, verdicts, flags."""
    import pandas as pd

    rows = []
    for row in view.rows:
        out = {"method": row["method"], "role": row["role"] or "", "n": row["n"]}
        for column in group_columns(view.stats.part):
            value = row["values"][column.title] or {}
            out[column.title] = value.get("mean")
            out[f"{column.title} se"] = value.get("se")
        out |= {"verdicts": row["verdict"], "trainable params": row["params"], "flags": ", ".join(row["flags"])}
        out["untrained"] = row["untrained"]
        rows.append({key: spreadsheet_cell(value) for key, value in out.items()})
    return pd.DataFrame(rows).to_csv(index=False, lineterminator="\n")


# -- method and run pages ------------------------------------------------------------------------------------------


def _methods(views: list[GroupView]) -> dict[str, list[dict]]:
    """Per base method, every group it appears in with its rows there (option rows included)."""
    out: dict[str, list[dict]] = {}
    for view in views:
        for row in view.rows:
            entries = out.setdefault(row["base"], [])
            if not entries or entries[-1]["view"] is not view:
                entries.append({"view": view, "rows": []})
            entries[-1]["rows"].append(row)
    return dict(sorted(out.items()))


def _method_facts(name: str) -> dict:
    """The method's description (its module's docstring, split into a summary and the rest) and its options with
    their defaults, from the plugin installed where the site is generated (None where it is not installed); the only
    thing of the report not read from the records (the leaderboard reads the records alone)."""
    from benchmark.errors import DapbenchError
    from benchmark.registry import default_registry

    try:
        cls = default_registry().get(name)
    except (DapbenchError, ImportError):  # not installed here, or no method package importable: the page says so
        return {"name": name, "summary": None, "details": "", "options": []}
    doc = inspect.getdoc(inspect.getmodule(cls)) or inspect.getdoc(cls) or ""
    summary, _, details = doc.partition("\n\n")
    described = option_docs(cls.config_cls)
    options = [(f.name, _default(f), described.get(f.name, "")) for f in dataclasses.fields(cls.config_cls)]
    return {"name": name, "summary": summary.replace("\n", " "), "details": details, "options": options}


def _default(field) -> str:
    default = default_of(field)
    return "required" if default is dataclasses.MISSING else repr(default)


def option_docs(config_cls: type) -> dict[str, str]:
    """Each option's attribute docstring (the string under its field in the class body), read from the source of
    the class and its bases; an option without one is left out."""
    import textwrap

    out: dict[str, str] = {}
    for klass in reversed(config_cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # built-in bases, or no source where the site is generated
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for field, after in zip(body, body[1:], strict=False):
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) and _is_docstring(after):
                out[field.target.id] = " ".join(after.value.value.split())
    return out


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _run_facts(record: dict, view: GroupView, record_files: dict[str, str]) -> dict:
    relative = record_files.get(record["run_id"])
    command = f"dapbench reproduce results/{relative}" if relative else None
    return {
        "record": record,
        "view": view,
        "record_link": f"../../{relative}" if relative else None,
        "command": command,
        "commit": record["environment"].get("git_commit") or "unknown",
        "config": json.dumps(record["config"], indent=1, sort_keys=True),
        "method_config": json.dumps(record["method_config"], indent=1, sort_keys=True),
        "tables": _markdown(run_matrices(record), tables=True),
    }
