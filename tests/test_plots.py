import numpy as np

from benchmark.metrics import record_loss_metrics
from benchmark.report.frame import mean_score_matrix
from benchmark.report.plots import plot_importance, plot_matrices


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
    mean = mean_score_matrix(records, "macro_f1")
    assert np.isnan(mean[0, 1]) and np.allclose(mean[[0, 1, 1], [0, 0, 1]], [60.0, 50.0, 70.0])
    records.append(run("one", 1, [[0.5, None], [None, 0.6]]))
    path = plot_matrices(records, tmp_path / "matrices.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    assert plot_matrices([], tmp_path / "empty.png") is None


def _loss_record(method: str, seed: int, shift: float, caps: dict | None = None, mask: dict | None = None) -> dict:
    base = {"a": 5.0, "b": 6.0, "general": 4.0}
    after = [
        {"a": 4.0 + shift, "b": 5.9, "general": 4.2 + shift},
        {"a": 4.3 + shift, "b": 5.0 + shift, "general": 4.4 + shift},
    ]
    record = {
        "method": method,
        "method_label": method,
        "seed": seed,
        "sequence": ["a", "b"],
        "capabilities": caps or {},
        "lm_loss": {"base": base, "after_domain": after},
        "domains": [{"method_report": {"mask": mask}} if mask else {"method_report": {}}] * 2,
    }
    record["lm_loss"]["metrics"] = record_loss_metrics(record)
    return record


def test_stability_plasticity_plot_leaves_out_methods_without_forgetting(tmp_path):
    from benchmark.report.plots import plot_stability_plasticity

    records = [_loss_record("ncl", s, 0.01 * s) for s in (1, 2)] + [
        _loss_record("one", 1, 0.0, {"independent_per_domain": True})
    ]
    path = plot_stability_plasticity(records, tmp_path / "sp.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    only_per_domain = [_loss_record("one", 1, 0.0, {"independent_per_domain": True})]
    assert plot_stability_plasticity(only_per_domain, tmp_path / "none.png") is None


def test_damping_plot_needs_a_mask_report(tmp_path):
    from benchmark.report.plots import plot_mask_damping

    mask = {
        "target": "gradient",
        "importance_histogram": {"head": [4, 0, 0, 0, 0, 0, 0, 1, 2, 1]},
        "damping_per_bin": [1.0, None, None, None, None, None, None, 0.99, 0.98, 0.6],
    }
    path = plot_mask_damping([_loss_record("das", 1, 0.0, mask=mask)], tmp_path / "damping.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    assert plot_mask_damping([_loss_record("ncl", 1, 0.0)], tmp_path / "no.png") is None


def _drawn(monkeypatch):
    """Keep the figure a plot function draws instead of only its PNG."""
    from benchmark.report import plots

    figures = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    return figures


def _roles(records: list[dict]) -> list[dict]:
    for record in records:
        record["comparison_role"] = {"ncl": "naive_continual", "none": "no_dap"}.get(record["method"])
    return records


def test_an_outlier_is_drawn_at_the_edge_and_does_not_collapse_the_axes(tmp_path, monkeypatch):
    from matplotlib.collections import PathCollection
    from matplotlib.colors import to_hex

    from benchmark.report.frame import method_colours
    from benchmark.report.plots import plot_stability_plasticity

    figures = _drawn(monkeypatch)
    records = _roles([_loss_record(m, 1, shift) for m, shift in (("ncl", 0.0), ("none", 0.6), ("ewc", 0.2))])
    outlier = _loss_record("broken", 1, 0.0)
    outlier["lm_loss"]["metrics"]["plasticity"] = -5.0
    plot_stability_plasticity([*records, outlier], tmp_path / "sp.png")
    (ax,) = figures[0].axes
    assert ax.get_xlim()[0] > -1.0  # the bulk keeps its scale
    assert any("broken (x=-5.00" in t.get_text() for t in ax.texts)  # named, with its value, at the edge
    assert ax.get_legend() is None and {"★ ncl", "★ none", "ewc"} <= {t.get_text() for t in ax.texts}
    colours = method_colours(["ncl", "none", "ewc", "broken"])
    drawn = [to_hex(c.get_facecolor()[0]) for c in ax.collections if isinstance(c, PathCollection)]
    assert sorted(drawn) == sorted(colours.values())  # one colour per method, none repeated


def test_loss_curves_are_small_multiples_with_the_naive_reference_behind_each(tmp_path, monkeypatch):
    from benchmark.report.plots import plot_heldout_losses

    figures = _drawn(monkeypatch)
    records = _roles([_loss_record(m, 1, 0.1 * i) for i, m in enumerate(("ncl", "none", "ewc", "kd"))])
    for record in records:
        record["lm_loss"]["columns"] = ["a", "b", "general"]
    plot_heldout_losses(records, tmp_path / "curves.png")
    panels = [ax for ax in figures[0].axes if ax.get_visible() and ax.lines]
    assert [ax.get_title() for ax in panels] == ["ncl ★", "none ★", "ewc", "kd"]  # references first, one per panel
    assert all(len(ax.lines) == 4 for ax in panels[1:]) and len(panels[0].lines) == 2  # own two, ncl's two behind
    assert all(ax.get_legend() is None for ax in figures[0].axes)


def test_the_forgetting_plot_leads_with_the_held_out_loss_as_the_tables_do(tmp_path, monkeypatch):
    from benchmark.report.plots import plot_forgetting

    figures = _drawn(monkeypatch)
    records = _roles([_loss_record(m, s, 0.0) for m in ("ncl", "ewc") for s in (1, 2)])
    for record in records:
        record["summary"] = {"macro_f1": {"forgetting": 0.01}}
        record["lm_loss"]["metrics"]["forgetting"] = 0.2 if record["method"] == "ncl" else 0.1
    plot_forgetting(records, tmp_path / "forgetting.png")
    left, right = figures[0].axes
    assert "held-out loss" in left.get_title() and "end-task" in right.get_title()
    assert [t.get_text() for t in left.get_yticklabels()] == ["ewc", "★ ncl"]  # least forgetting first
