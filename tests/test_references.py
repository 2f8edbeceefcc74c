"""Every dotted reference to the project's code in a docstring, a comment or the docs names something that exists
(issue #48): a module moved or renamed leaves no pointer behind to a place that is gone."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

from cli_helpers import REPO

REFERENCE = re.compile(r"(?<![\w/.])((?:benchmark|methods|tasks)(?:\.[A-Za-z_]\w*)+)")
"""``benchmark.engine.runner.ContinualRun``-style names (not file paths such as ``benchmark/io.py``)."""


def _prose(path: Path) -> str:
    """The docstrings and comments of a Python file; a Markdown file whole."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return text
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    parts = [ast.get_docstring(node) or "" for node in ast.walk(ast.parse(text)) if isinstance(node, documented)]
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    parts += [token.string for token in tokens if token.type == tokenize.COMMENT]
    return "\n".join(parts)


def _resolves(reference: str) -> bool:
    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_every_dotted_reference_in_docstrings_comments_tests_and_docs_resolves():
    files = [*REPO.glob("benchmark/**/*.py"), *REPO.glob("methods/**/*.py"), *REPO.glob("tests/**/*.py")]
    files += [*REPO.glob("docs/**/*.md"), REPO / "README.md"]
    broken = sorted(
        f"{path.relative_to(REPO)}: {ref}"
        for path in files
        for ref in {m.group(1) for m in REFERENCE.finditer(_prose(path))}
        if not ref.endswith((".py", ".md", ".json", ".txt")) and not _resolves(ref)
    )
    assert not broken, "references to code that does not exist:\n" + "\n".join(broken)


def test_the_check_tells_a_moved_name_from_a_present_one():
    assert _resolves("benchmark.records.checks.check_record")
    assert not _resolves("benchmark.record_checks.check_record")  # where it lived before the records package
    assert {m.group(1) for m in REFERENCE.finditer("see benchmark/io.py and :func:`benchmark.io.read_json`.")} == {
        "benchmark.io.read_json"
    }


LINK = re.compile(r"\]\(([^()\s]+)\)")
"""The target of a Markdown link or image, ``[text](target)``."""


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but hyphens and underscores dropped, spaces as
    hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text(encoding="utf-8"))  # a comment in a code block is no heading
    return {_anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def _broken_links(page: Path) -> list[str]:
    """The relative links of a Markdown page whose file, or heading in it, does not exist."""
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not checked offline
            continue
        path, _, anchor = target.partition("#")
        if path.startswith("results/report/"):  # built by `dapbench report`, not committed; its --check covers it
            continue
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(f"{page.relative_to(REPO)}: {target}")
    return broken


def test_every_relative_link_of_the_readme_and_docs_names_a_file_and_heading_that_exist():
    pages = [REPO / "README.md", REPO / "leaderboard.md", REPO / "CHANGELOG.md", *REPO.glob("docs/**/*.md")]
    broken = [link for page in pages for link in _broken_links(page)]
    assert not broken, "links to files or headings that do not exist:\n" + "\n".join(broken)


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    (tmp_path / "a.md").write_text("# A page\n\n## What a run guarantees\n\n```\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#what-a-run-guarantees) [gone](c.md) [no heading](a.md#not-a-heading) [web](https://x)")
    assert _broken_links(page) == ["b.md: c.md", "b.md: a.md#not-a-heading"]
