"""Every module the package and its tests import is declared in ``pyproject.toml``: a fresh virtual environment that
installs what the README says has everything the code and the test suite need (a package that only happens to be
installed beside another one is a missing install step that CI would not see)."""

import ast
import functools
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("benchmark", "methods", "tasks")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads the file with the same library under its older name
    import tomli as tomllib


def _normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Scikit_Learn`` and ``scikit-learn`` are one)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normalise(re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group(0))


def _declared() -> tuple[set[str], set[str], set[str]]:
    """The distributions of the main dependencies, of the ``test`` extra and of every other extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    main = {_requirement_name(r) for r in project["dependencies"]}
    test = {_requirement_name(r) for r in extras.get("test", [])}
    optional = {_requirement_name(r) for name, reqs in extras.items() if name != "test" for r in reqs}
    return main, test, optional


def _first_party() -> set[str]:
    """Modules of this repository: its packages and the test folder's own helper modules."""
    return {*PACKAGE_FOLDERS, "tests", *(p.stem for p in (ROOT / "tests").glob("*.py"))}


def _imported_modules(folders: tuple[str, ...]) -> dict[str, set[str]]:
    """Top-level module name -> the files that import it (any ``import``, at module level or inside a function)."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


@functools.cache
def _installed() -> dict[str, list[str]]:
    return packages_distributions()


def _distributions(module: str) -> set[str]:
    """The distributions that provide ``module`` here; a module installed by none is taken to be its own name (how
    optional trackers such as ``wandb`` are named)."""
    return {_normalise(d) for d in _installed().get(module, [module])}


def _undeclared(folders: tuple[str, ...], allowed: set[str]) -> list[str]:
    skip = set(sys.stdlib_module_names) | _first_party() | {"tomli"}
    return [
        f"{module} (imported by {', '.join(sorted(files)[:3])}; distribution {' or '.join(sorted(dists))})"
        for module, files in sorted(_imported_modules(folders).items())
        if module not in skip and not (dists := _distributions(module)) & allowed
    ]


def test_every_import_of_the_package_is_a_declared_dependency():
    main, _, optional = _declared()
    missing = _undeclared(PACKAGE_FOLDERS, main | optional)
    assert not missing, "add to [project] dependencies in pyproject.toml: " + "; ".join(missing)


def test_every_import_of_the_tests_is_declared_in_the_main_or_test_dependencies():
    main, test, _ = _declared()
    missing = _undeclared(("tests",), main | test)
    assert not missing, "add to the `test` extra in pyproject.toml: " + "; ".join(missing)


def test_the_check_sees_an_undeclared_import():
    """The checks above are not vacuous: a module of an installed but undeclared distribution is reported."""
    main, test, _ = _declared()
    assert "hypothesis" in test and "filelock" in main
    assert _undeclared(("tests",), (main | test) - {"hypothesis"})
    assert not {"torch", "transformers"} - main
