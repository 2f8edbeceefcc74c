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


def test_every_dotted_reference_in_docstrings_comments_and_docs_resolves():
    files = [*REPO.glob("benchmark/**/*.py"), *REPO.glob("methods/**/*.py"), *REPO.glob("docs/**/*.md")]
    files.append(REPO / "README.md")
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
