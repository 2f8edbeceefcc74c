"""The README's plugin example, installed as a real third-party entry point, passes the method contract."""

import re
import subprocess
import sys
from pathlib import Path

from test_method_contract import check_method_contract

from benchmark.registry import default_registry

README = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def _block(language: str) -> str:
    """The first ``language`` code block of the README's "Adding a method" section."""
    section = README.read_text().split("## Adding a method", 1)[1]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def test_readme_plugin_example_is_a_working_third_party_method(tiny_config, tmp_path, monkeypatch):
    """The page's module and ``pyproject.toml``, built and installed by pip as a user would (into a folder of the
    test's, offline, with this environment's setuptools), register ``l2sp`` and pass the contract."""
    package, site = tmp_path / "dapbench-l2sp", tmp_path / "site"
    package.mkdir()
    (package / "dapbench_l2sp.py").write_text(_block("python"))
    (package / "pyproject.toml").write_text(_block("toml"))
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run([*command, "--target", str(site), str(package)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert (site / "dapbench_l2sp.py").is_file()  # py-modules: the one-file plugin is installed
    monkeypatch.syspath_prepend(str(site))
    default_registry.cache_clear()
    try:
        assert "l2sp" in default_registry().names()
        check_method_contract("l2sp", tiny_config)
    finally:
        default_registry.cache_clear()
