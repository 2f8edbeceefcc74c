"""The core stays a place one can read at once (issue 14): short parts, public seams, no method internals."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = sorted((ROOT / "benchmark").glob("*.py"))


def test_no_class_or_function_in_the_core_is_over_60_lines():
    long = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in CORE
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long, long
    assert len((ROOT / "benchmark" / "runner.py").read_text().splitlines()) < 300


def test_the_core_imports_no_method_internals():
    offenders = []
    for path in CORE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("methods._shared"):
                offenders.append(f"{path.name}: from {node.module}")
    assert not offenders, offenders


def test_tests_and_benchmarks_use_no_private_member_of_the_runner():
    pattern = re.compile(r"\brun\._[a-z]")
    files = [*sorted((ROOT / "tests").glob("*.py")), ROOT / "benchmark" / "bench.py"]
    hits = [
        f"{p.name}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)
    ]
    assert not hits, hits
