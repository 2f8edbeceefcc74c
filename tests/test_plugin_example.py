"""The README's plugin example, installed as a real third-party entry point, passes the method contract."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_thread_env
from test_method_contract import check_method_contract

from benchmark.registry import default_registry

README = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def _block(language: str) -> str:
    """The first ``language`` code block of the README's "Adding a method" section."""
    section = README.read_text().split("## Adding a method", 1)[1]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def _installed_plugin(tmp_path: Path) -> Path:
    """The page's module and ``pyproject.toml``, built and installed by pip as a user would (into a folder of the
    test's, offline, with this environment's setuptools); the folder it is installed in."""
    package, site = tmp_path / "dapbench-l2sp", tmp_path / "site"
    package.mkdir()
    (package / "dapbench_l2sp.py").write_text(_block("python"))
    (package / "pyproject.toml").write_text(_block("toml"))
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run([*command, "--target", str(site), str(package)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert (site / "dapbench_l2sp.py").is_file()  # py-modules: the one-file plugin is installed
    return site


def test_readme_plugin_example_is_a_working_third_party_method(tiny_config, tmp_path, monkeypatch):
    """The installed example registers ``l2sp`` and passes the contract."""
    site = _installed_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    default_registry.cache_clear()
    try:
        assert "l2sp" in default_registry().names()
        check_method_contract("l2sp", tiny_config)
    finally:
        default_registry.cache_clear()


@pytest.mark.slow
def test_the_plugin_gets_verdicts_against_the_committed_synthetic_rows_on_this_machine(tmp_path):
    """Issue #89: what docs/plugins.md promises a method author in their first hour: run the plugin at the committed
    synthetic group's seeds, copy the committed records beside its own, and the report puts it in that group with
    verdicts against every reference, none of them re-run (3 synthetic runs, a few minutes at one thread)."""
    site, out = _installed_plugin(tmp_path), tmp_path / "try-l2sp"
    env = one_thread_env(PYTHONPATH=str(site))
    run = [sys.executable, "-m", "benchmark.cli", "run", "--methods", "l2sp", "--seeds", "2021,111,222", "--quiet"]
    done = subprocess.run([*run, "--output-dir", str(out)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    committed = Path(__file__).resolve().parents[1] / "results" / "synthetic"
    for path in committed.iterdir():
        shutil.copy(path, out / "results" / "synthetic" / path.name)
    report = [sys.executable, "-m", "benchmark.cli", "report", "--quiet", "--output-dir", str(out)]
    reported = subprocess.run(report, capture_output=True, text=True, env=env)
    assert reported.returncode == 0, reported.stderr[-3000:]
    board = (out / "leaderboard.md").read_text()
    rows = [line for line in board.splitlines() if line.startswith("| `l2sp` | 3 |")]
    assert rows, "l2sp is not a row of 3 seeds"
    assert board.count("\n## ") == 1 or "`l2sp`" in board.split("| `ncl` |", 1)[1]  # one group with ncl's row
    assert any(verdict in rows[0] for verdict in ("`ncl`", "`das`", "`none`")), rows[0]  # verdicts, not blanks
    versus = [sys.executable, "-m", "benchmark.cli", "versus", "l2sp", "--output-dir", str(out)]
    against = subprocess.run(versus, capture_output=True, text=True, env=env)
    assert against.returncode == 0, against.stderr[-3000:]
    rows = {line.split(" | ")[0]: line for line in against.stdout.splitlines() if line.startswith("| `")}
    assert {"| `das`", "| `derpp`", "| `none`"} <= set(rows)  # every committed row, each with its verdict or tie
    assert all(("q = " in rows[r]) or ("80% power" in rows[r]) for r in ("| `das`", "| `derpp`", "| `none`"))
    repository = Path(__file__).resolve().parents[1]
    check = [sys.executable, "-m", "benchmark.cli", "report", "--check", "--quiet", "--output-dir", str(repository)]
    checked = subprocess.run(check, capture_output=True, text=True, env=env)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]  # installed, it moves no line
