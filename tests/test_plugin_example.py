"""The README's plugin example, installed as a real third-party entry point, passes the method contract."""

import re
from pathlib import Path

from test_method_contract import check_method_contract

from benchmark.registry import ENTRY_POINT_GROUP, default_registry

README = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def _block(language: str) -> str:
    """The first ``language`` code block of the README's "Adding a method" section."""
    section = README.read_text().split("## Adding a method", 1)[1]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def test_readme_plugin_example_is_a_working_third_party_method(tiny_config, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "dapbench_l2sp.py").write_text(_block("python"))
    name, target = re.search(r'^(\w+) = "([\w.]+:\w+)"', _block("toml"), re.M).groups()
    dist = site / "dapbench_l2sp-0.1.dist-info"  # what `pip install` of the plugin package writes
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dapbench-l2sp\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{name} = {target}\n")
    monkeypatch.syspath_prepend(str(site))
    default_registry.cache_clear()
    try:
        assert name == "l2sp" and name in default_registry().names()
        check_method_contract(name, tiny_config)
    finally:
        default_registry.cache_clear()
