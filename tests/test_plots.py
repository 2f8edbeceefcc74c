from benchmark.plots import plot_importance


def _record(method: str, seed: int, units: dict[str, list[float]] | None) -> dict:
    report = {"importance": {u: {"mean_per_layer": v} for u, v in units.items()}} if units else {}
    return {"method": method, "method_label": method, "seed": seed, "domains": [{"method_report": report}]}


def test_importance_plot_takes_methods_with_different_unit_types(tmp_path):
    das = {"head": [0.2, 0.4], "intermediate": [0.1, 0.3], "output": [0.5, 0.6]}
    records = [
        _record("das", 1, das),
        _record("das", 2, das),
        _record("dga", 1, {"head": [0.7, 0.9]}),  # heads only
        _record("ncl", 1, None),  # no importance: left out
    ]
    path = plot_importance(records, tmp_path / "importance.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    assert plot_importance([_record("ncl", 1, None)], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
