"""One registry pattern (issue #87): every variation point is a :class:`benchmark.plugins.Registry` with lazy targets,
entry points, named errors for clashes and unknown names, and a broken entry that leaves the others working."""

from importlib.metadata import EntryPoint

import pytest

from benchmark.errors import DapbenchError, did_you_mean
from benchmark.families import FAMILIES
from benchmark.metrics import LOSS_METRIC_REGISTRY
from benchmark.plugins import RegistrationError, Registry, named_entry
from benchmark.protocols import PROTOCOLS, EndTaskProtocol
from benchmark.registry import default_registry
from benchmark.schedules import SCHEDULES


def test_every_variation_point_is_one_kind_of_registry():
    for registry in (default_registry(), FAMILIES, PROTOCOLS, SCHEDULES, LOSS_METRIC_REGISTRY):
        assert isinstance(registry, Registry) and registry.group.startswith("dapbench.")
    assert {"masked", "causal"} <= set(FAMILIES) and {"finetune", "linear_probe", "lm_eval"} <= set(PROTOCOLS)
    assert "per_domain_linear" in SCHEDULES and "forgetting" in LOSS_METRIC_REGISTRY


def test_a_lazy_target_loads_on_first_use_and_a_broken_one_is_named_without_harming_the_rest():
    registry = Registry("widget", None, "register one in a test", targets={"circle": "math:pi", "broken": "math:nope"})
    assert registry["circle"] == pytest.approx(3.14159, abs=1e-5) and registry.find("absent") is None
    with pytest.raises(DapbenchError, match="widget 'broken' is registered as math:nope, which cannot be loaded"):
        registry.get("broken")
    with pytest.raises(DapbenchError, match="unknown widget 'cirlce'. did you mean 'circle'"):
        registry.get("cirlce")
    assert registry.get("circle") > 3


def test_every_unknown_name_hint_names_the_closest_known_names_as_registered():
    assert did_you_mean("cirlce", ["circle", "square"]) == "did you mean 'circle'?"
    assert did_you_mean("DAS", ["das", "ncl"]) == "" and did_you_mean("DAS", ["das"], ignore_case=True) == (
        "did you mean 'das'?"
    )
    assert did_you_mean("ncl_x", ["ncl", "ncl_a", "ncl_b"], n=2).count("'") == 4  # at most n names
    assert did_you_mean("zzzz", ["circle"]) == "" == did_you_mean("zzzz", ["circle"], form=" ({})")
    assert did_you_mean("cirlce", ["circle"], form=" ({})") == " (did you mean 'circle'?)"  # no brackets when empty


def test_a_name_registered_twice_is_a_named_error_that_is_also_a_value_error():
    registry = Registry("widget", None, "register one in a test")
    registry.add("a", "math:pi")
    registry.add("a", "math:pi")  # the same entry again: nothing to refuse
    with pytest.raises(RegistrationError, match="registered twice: already registered as math:pi") as raised:
        registry.add("a", "math:e")
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, DapbenchError)
    assert registry["a"] > 3
    registry.add("a", "math:pi")  # the same target again after it was loaded: still no clash
    registry.remove("a")
    registry.add("a", "math:e")
    assert registry.names() == ["a"] and registry["a"] < 3


def test_an_installed_packages_entry_point_registers_a_protocol_checked_by_its_kind(monkeypatch):
    points = [
        EntryPoint("linear_probe", "benchmark.protocols.linear_probe:LinearProbe", "dapbench.protocols"),
        EntryPoint("misnamed", "benchmark.protocols.linear_probe:LinearProbe", "dapbench.protocols"),
    ]
    monkeypatch.setattr("benchmark.plugins.entry_points", lambda group: [p for p in points if p.group == group])
    registry = Registry(
        "end-task protocol",
        "dapbench.protocols",
        "a test",
        load=named_entry("end-task protocol", EndTaskProtocol, True),
    )
    assert registry.names() == ["linear_probe", "misnamed"]
    assert registry.get("linear_probe").words == "linear probe"
    with pytest.raises(DapbenchError, match="which is no EndTaskProtocol named 'misnamed'"):
        registry.get("misnamed")
