"""The static site (issue #49): a page per group, method and run from the same records as the leaderboard, nothing
that asks another host, downloads beside it, and ``dapbench report --check`` naming what is stale."""

import csv
import io
import json
import re

import pytest

from benchmark.cli import main
from benchmark.io import atomic_write_json
from benchmark.report.frame import method_colours
from benchmark.report.site import PLOTLY_ASSET, _json_for_script
from benchmark.report.writer import write_report


def _write(out, records):
    for record in records:
        atomic_write_json(out / "results" / record["profile"] / f"{record['run_id']}.json", record)


@pytest.fixture
def site(report_records, tmp_path):
    out = tmp_path / "out"
    _write(out, report_records)
    write_report(out)
    return out, out / "results" / "report" / "site"


def _chart_data(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="chart-data">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_the_report_writes_a_page_per_group_method_and_run(site, report_records):
    out, folder = site
    (group_page,) = folder.glob("group-*.html")
    key = group_page.stem.removeprefix("group-")
    page = group_page.read_text()
    data = _chart_data(page)
    assert set(data["losses"]) == set(data["colours"]) == {"none", "ncl", "das"}
    assert data["references"] == {"naive_continual": "ncl", "proposed": "das", "no_dap": "none"}
    assert len(data["losses"]["ncl"]) == 1 + len(report_records[0]["sequence"])  # base row, then each stage
    for method in ("none", "ncl", "das"):
        assert f"method-{method}.html" in page and (folder / f"method-{method}.html").is_file()
    rows = list(csv.DictReader(io.StringIO((folder / "data" / f"{key}.csv").read_text())))
    assert sorted(r["method"] for r in rows) == ["das", "ncl", "none"] and all(r["n"] == "3" for r in rows)
    assert "Which method" in (folder / "index.html").read_text() and (folder / "submit.html").is_file()
    assert (folder / PLOTLY_ASSET).stat().st_size > 1_000_000


def test_a_run_page_links_its_record_and_the_command_that_reproduces_it(site, report_records):
    out, folder = site
    for record in report_records:
        page = (folder / f"run-{record['run_id']}.html").read_text()
        relative = f"{record['profile']}/{record['run_id']}.json"
        assert f"dapbench reproduce results/{relative}" in page
        link = re.search(r'href="(\.\./\.\./[^"]+\.json)"', page).group(1)
        assert (folder / link).resolve() == (out / "results" / relative).resolve()
        # its numbers rounded, its matrices drawn, and a footer that says they are this run's own
        forgetting = record["lm_loss"]["metrics"]["forgetting"]
        assert re.search(f">{forgetting:.4f}</td>", page) and "<h2>macro_f1 (%)</h2>" in page
        assert not re.search(r"\d\.\d{9,}", page), "an unrounded float on the run page"
        assert "this run's own (one seed)" in page and "mean over seeds" not in page


def test_no_page_refers_to_another_host(site):
    _, folder = site
    for page in folder.rglob("*.html"):
        text = page.read_text()
        assert not re.search(r'(src|href)="(https?:)?//', text), page.name  # only files beside the page
        for target in re.findall(r'(?:src|href)="([^"#]+)"', text):
            assert (page.parent / target).exists(), f"{page.name} links {target}, which is not there"


def test_check_names_what_is_stale_and_writes_nothing(site, capsys):
    out, folder = site
    assert write_report(out, check=True)["stale"] == []
    index = folder / "index.html"
    index.write_text("edited by hand")
    (out / "leaderboard.md").unlink()
    assert main(["report", "--output-dir", str(out), "--check", "--quiet"]) == 1
    said = capsys.readouterr().out
    assert "stale: results/report/site/index.html" in said and "stale: leaderboard.md" in said
    assert index.read_text() == "edited by hand" and not (out / "leaderboard.md").exists()
    write_report(out)
    assert main(["report", "--output-dir", str(out), "--check", "--quiet"]) == 0


def test_a_removed_record_takes_its_run_page_and_nothing_else(site, report_records):
    out, folder = site
    mine = folder / "notes.html"  # a file the report did not write
    mine.write_text("keep me")
    gone = report_records[0]
    (out / "results" / gone["profile"] / f"{gone['run_id']}.json").unlink()
    write_report(out)
    assert not (folder / f"run-{gone['run_id']}.html").exists() and mine.read_text() == "keep me"
    assert (folder / f"run-{report_records[1]['run_id']}.html").is_file()


def test_page_json_cannot_end_its_script_element():
    text = str(_json_for_script({"label": "</script><script>alert(1)</script>"}))
    assert "</" not in text and json.loads(text) == {"label": "</script><script>alert(1)</script>"}


def test_every_method_keeps_one_colour_and_no_two_methods_share_one():
    labels = [f"method{i}" for i in range(60)]
    colours = method_colours(labels)
    assert len(set(colours.values())) == 60
    assert method_colours(list(reversed(labels)) + labels[:5]) == colours  # one mapping, whatever order labels come in


def test_a_method_page_gives_each_option_its_default_and_its_meaning(site):
    from benchmark.report.site import option_docs
    from methods.freeze_bottom import FreezeBottomConfig

    assert option_docs(FreezeBottomConfig) == {
        "layers": "k: the bottom transformer layers frozen (with the input embeddings)."
    }
    _, folder = site
    page = (folder / "method-das.html").read_text()
    assert "<code>fidelity</code></td><td><code>&#39;paper&#39;</code></td><td>``paper`` (default) or" in page


def test_every_option_of_every_method_says_what_it_means():
    """A method page lists each option with its meaning (the docstring under its field): none left blank."""
    import dataclasses

    from benchmark.registry import default_registry
    from benchmark.report.site import option_docs

    registry = default_registry()
    blank = {
        name: [f.name for f in dataclasses.fields(cls.config_cls) if not option_docs(cls.config_cls).get(f.name)]
        for name in registry.names()
        for cls in [registry.get(name)]
    }
    assert {name: fields for name, fields in blank.items() if fields} == {}


def test_a_group_page_states_the_verdicts_at_matched_plasticity(report_records, tmp_path, monkeypatch):
    """The leaderboard's "At matched plasticity" lines (issue #85) appear on the group page too, as the same lines."""
    from benchmark.report import site

    said = []

    def matched(part, records):
        said.append(sorted({r["method_label"] for r in records}))
        return ["### At matched plasticity", "", "- `ncl` along schedule.lr_scale (0.5, 1, 2): `das` +0.020"]

    monkeypatch.setattr(site, "matched_markdown", matched)
    out = tmp_path / "out"
    _write(out, report_records)
    write_report(out)
    (page,) = (out / "results" / "report" / "site").glob("group-*.html")
    section = page.read_text().split('<div class="matched">')[1].split("</div>")[0]
    assert "<h3>At matched plasticity</h3>" in section and "<code>das</code> +0.020" in section
    assert said == [["das", "ncl", "none"]]  # asked once, with the group's records
