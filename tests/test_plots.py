import numpy as np

from benchmark.plots import _mean_matrix, plot_importance, plot_matrices


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


def test_matrix_panels_average_seeds_and_leave_uncomputed_cells_blank(tmp_path):
    def run(method, seed, matrix):
        return {
            "method": method,
            "method_label": method,
            "seed": seed,
            "sequence": ["a", "b"],
            "end_tasks": ["a_sup", "b_sup"],
            "matrices": {"macro_f1": matrix},
        }

    records = [run("ncl", 1, [[0.5, None], [0.4, 0.6]]), run("ncl", 2, [[0.7, None], [0.6, 0.8]])]
    mean = _mean_matrix(records, "macro_f1")
    assert np.isnan(mean[0, 1]) and np.allclose(mean[[0, 1, 1], [0, 0, 1]], [60.0, 50.0, 70.0])
    records.append(run("one", 1, [[0.5, None], [None, 0.6]]))
    path = plot_matrices(records, tmp_path / "matrices.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    assert plot_matrices([], tmp_path / "empty.png") is None
