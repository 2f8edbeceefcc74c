"""The code stays a place one can read at once: short parts, no import cycle, public seams, no method internals."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = sorted((ROOT / "benchmark").rglob("*.py"))


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_class_or_function_in_the_core_is_over_60_lines():
    long = [
        f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in CORE
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long, long


def test_no_module_of_the_engine_or_the_report_is_over_300_lines():
    folders = ("engine", "report", "records")
    long = {
        str(p.relative_to(ROOT)): n
        for folder in folders
        for p in (ROOT / "benchmark" / folder).glob("*.py")
        if (n := len(p.read_text().splitlines())) > 300
    }
    assert not long, long


def test_the_import_graph_has_no_cycle():
    """Every ``import`` of a benchmark module, at module level or inside a function, is an edge."""
    modules = {_module(p): p for p in CORE}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("benchmark"):
                targets.add(node.module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("benchmark")}
        graph[name] = {t for t in targets if t in modules and t != name}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            assert state.get(target) != 1, "import cycle: " + " -> ".join([*trail, node, target])
            if target not in state:
                visit(target, [*trail, node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_the_core_imports_no_method_internals():
    offenders = []
    for path in CORE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("methods._shared"):
                offenders.append(f"{path.name}: from {node.module}")
    assert not offenders, offenders


def test_tests_and_benchmarks_use_no_private_member_of_the_runner():
    pattern = re.compile(r"\brun\._[a-z]")
    files = [*sorted((ROOT / "tests").glob("*.py")), ROOT / "benchmark" / "tools" / "bench.py"]
    hits = [
        f"{p.name}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)
    ]
    assert not hits, hits
