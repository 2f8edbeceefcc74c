"""The committed site in a real headless browser (issue #49): Debian's Chromium driven by Playwright, as CI runs it
(``pytest -m browser``; ``.ci/run`` installs the ``chromium`` package). Every page loads without a console error or
a request to another host; a table sorts; picking methods changes a chart; the index answers as the leaderboard does.
Set ``DAPBENCH_SCREENSHOTS`` to a folder to keep screenshots of the index and a group page."""

import os
import re
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "results" / "report" / "site"
CHROMIUM = os.environ.get("DAPBENCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).is_file():
        hint = "install Debian's package (apt-get install -y chromium) or set DAPBENCH_CHROMIUM to a Chromium binary"
        pytest.fail(f"no Chromium at {CHROMIUM}: {hint}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.problems = []
    page.on("console", lambda m: page.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: page.problems.append(f"page error: {e}"))
    page.on("request", lambda r: None if r.url.startswith("file://") else page.problems.append(f"request {r.url}"))
    yield page
    page.close()


def _open(page, name: str):
    page.goto((SITE / name).as_uri())
    page.wait_for_load_state("load")
    return page


def _group_pages() -> list[str]:
    """The group pages, the one with the most method rows first (the sort and pick tests need rows besides the
    reference ones; a group of reference rows only, such as a new group's first records, has nothing else to pick)."""
    pages = sorted(SITE.glob("group-*.html"))
    return [p.name for p in sorted(pages, key=lambda p: -p.read_text(encoding="utf-8").count('class="pick"'))]


def test_every_page_loads_without_a_console_error_or_a_request_elsewhere(page):
    pages = sorted(p.relative_to(SITE).as_posix() for p in SITE.glob("*.html"))
    assert "index.html" in pages and _group_pages()
    for name in pages:
        _open(page, name)
        if name.startswith("group-"):
            page.wait_for_function("document.getElementById('chart-sp').data !== undefined")
    assert page.problems == []


def test_sorting_a_column_reorders_the_table(page):
    _open(page, _group_pages()[0])
    methods = "Array.from(document.querySelectorAll('#board tbody tr')).map(r => r.dataset.method)"
    values = "Array.from(document.querySelectorAll('#board tbody tr')).map(r => r.cells[COL].dataset.value)"
    headers = page.eval_on_selector_all("#board thead th", "hs => hs.map(h => h.textContent.trim())")
    column = next(i for i, h in enumerate(headers) if h.startswith("forgetting"))
    before = page.evaluate(methods)
    page.click(f"#board thead th:nth-child({column + 1})")
    ascending = [float(v) for v in page.evaluate(values.replace("COL", str(column))) if v != ""]
    assert ascending == sorted(ascending) and page.evaluate(methods) != before
    page.click(f"#board thead th:nth-child({column + 1})")
    descending = [float(v) for v in page.evaluate(values.replace("COL", str(column))) if v != ""]
    assert descending == sorted(descending, reverse=True)
    page.fill("#filter-text", "ncl")
    shown = page.evaluate("Array.from(document.querySelectorAll('#board tbody tr:not([hidden])')).length")
    assert 0 < shown < len(before)
    assert page.problems == []


def test_picking_methods_changes_what_the_charts_draw(page):
    _open(page, _group_pages()[0])
    drawn = "document.getElementById('chart-sp').data.map(t => t.name)"
    page.wait_for_function("document.getElementById('chart-sp').data !== undefined")
    at_first = page.evaluate(drawn)
    page.click("[data-pick=all]")
    everything = page.evaluate(drawn)
    assert 0 < len(at_first) < len(everything)  # the references and the leaders, not every row at once
    page.click("[data-pick=references]")
    references = page.evaluate(drawn)
    assert 0 < len(references) < len(everything) and set(references) <= set(everything)
    first = page.eval_on_selector("input.pick:not(:checked)", "box => box.value")
    page.check(f"input.pick[value='{first}']")
    assert page.evaluate(drawn) == [m for m in everything if m in {*references, first}]
    curves = set(page.evaluate("document.getElementById('chart-curves').data.map(t => t.name)"))
    assert curves and curves <= {*references, first}
    # the committed mini group measured continual evaluation for ncl, das, derpp and a replay row
    continual = set(page.evaluate("document.getElementById('chart-continual').data.map(t => t.name)"))
    assert continual and continual <= {*references, first}
    assert page.problems == []


def test_the_index_answers_with_the_leaderboards_best_rows(page):
    board = (ROOT / "leaderboard.md").read_text(encoding="utf-8")
    answer = board.split("## The short answer", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`([^`]+)`", answer)
    shown = _open(page, "index.html").inner_text("#answer")
    assert named and all(name in shown for name in named)
    best = re.findall(r"- `([^`]+)` (?:forgets least|keeps general knowledge best)", answer)
    assert best and all(f"{name} forgets least" in shown or f"{name} keeps general" in shown for name in best)
    folder = os.environ.get("DAPBENCH_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / "site-index.png"), full_page=True)
        _open(page, _group_pages()[0]).screenshot(path=str(Path(folder) / "site-group.png"), full_page=True)
    assert page.problems == []


HOSTILE = '<span style="background:url(http://example.invalid/bg.png)">x</span>'


def test_a_label_written_as_html_is_drawn_as_text_and_contacts_no_host(page, tmp_path):
    from cli_helpers import record_with_options

    from benchmark.cli import main

    for source in sorted((ROOT / "results" / "ci").glob("*.json"))[:2]:
        record_with_options(source, tmp_path / "results" / "hostile", note=HOSTILE)
    assert main(["report", "--output-dir", str(tmp_path), "--quiet"]) == 0
    (group,) = (tmp_path / "results" / "report" / "site").glob("group-*.html")
    page.goto(group.as_uri())
    page.wait_for_load_state("load")
    page.wait_for_function("document.getElementById('chart-sp').data !== undefined")
    page.wait_for_timeout(500)  # a background image would be fetched as the chart's text is laid out
    names = page.evaluate("document.getElementById('chart-sp').data.map(t => t.name)")
    assert names and all("&lt;span" in name for name in names)
    assert page.problems == []


def test_an_end_task_name_written_as_html_is_drawn_as_text_on_the_heatmap(page, tmp_path):
    """The heatmap's axis labels come from the records' end-task names: drawn as text, no request elsewhere."""
    import json

    from cli_helpers import copy_record

    from benchmark.cli import main
    from benchmark.report.site import _json_for_script

    for source in sorted((ROOT / "results" / "ci").glob("*.json"))[:2]:
        copy_record(source, tmp_path / "results" / "hostile")
    assert main(["report", "--output-dir", str(tmp_path), "--quiet"]) == 0
    (group,) = (tmp_path / "results" / "report" / "site").glob("group-*.html")
    html = group.read_text(encoding="utf-8")
    start = html.index('id="chart-data">') + len('id="chart-data">')
    end = html.index("</script>", start)
    data = json.loads(html[start:end])
    data["tasks"][0] = HOSTILE  # as a record's end-task name would bring it
    group.write_text(html[:start] + str(_json_for_script(data)) + html[end:], encoding="utf-8")
    page.goto(group.as_uri())
    page.wait_for_load_state("load")
    page.wait_for_function("document.getElementById('chart-score-matrix').data !== undefined")
    page.wait_for_timeout(500)
    labels = page.evaluate("document.getElementById('chart-score-matrix').data[0].x")
    assert labels[0].startswith("&lt;span") and page.problems == []


def test_the_key_columns_and_verdicts_fit_a_1366_pixel_screen(browser):
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.goto((SITE / _group_pages()[0]).as_uri())
    page.wait_for_load_state("load")
    right = page.eval_on_selector_all(
        "#board thead th",
        "hs => Object.fromEntries(hs.map(h => [h.textContent.trim(), h.getBoundingClientRect().right]))",
    )
    key = ["method", "n", "verdicts", "plasticity ↑", "forgetting ↓", "general rise ↓"]
    assert all(right[name] <= 1366 for name in key), {name: right[name] for name in key}
    page.close()
