"""Calibration of the report's one comparison (issue #85): on simulated null groups (every row drawn from one
distribution) with the seed correlations of the committed groups, each verdict kind the report prints flags at most
5% of its comparisons: the group tables (every row against a reference), the end tasks against no DAP, the budget
ladder's pairwise verdicts at a rung, the stability gap's depths (issue #90) and the verdicts at matched plasticity.
Also: a tie states the difference its seeds could have resolved, and that difference is what the test finds 80% of
the time."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from benchmark.records.store import load_records
from benchmark.report.beside import beside_rows
from benchmark.report.comparison import paired_test, resolvable_difference
from benchmark.report.frame import loss_columns
from benchmark.report.ladder import rung_verdicts
from benchmark.report.statistics import compare

ROOT = Path(__file__).resolve().parents[1]
TOP_RUNG = ROOT / "results" / "mini-pass"
GROUPS = 300
ROWS = 8
REPLICATES = 200


def seed_correlation(values: pd.DataFrame) -> float:
    """The mean correlation between rows of their per-seed values around each row's mean (what a shared seed, the
    same data order and masks, makes rows share)."""
    centred = values.sub(values.mean(axis=0), axis=1).dropna(axis=1)
    corr = np.corrcoef(centred.to_numpy().T)
    return float(np.nanmean(corr[np.triu_indices_from(corr, 1)]))


@pytest.fixture(scope="module")
def committed_correlations():
    """Seed correlations of the committed top-rung group: forgetting, and the fine-tuned final macro-F1."""
    records = load_records(TOP_RUNG)
    frame = pd.DataFrame(
        {
            "method": r["method_label"],
            "seed": r["seed"],
            "forgetting": r["lm_loss"]["metrics"]["forgetting"],
            "fine-tuned": r["end_tasks_beside"]["finetune"]["summary"]["macro_f1"]["final"],
        }
        for r in records
        if r["method_label"] != "none"
    )
    return {
        name: seed_correlation(frame.pivot_table(index="seed", columns="method", values=name))
        for name in ("forgetting", "fine-tuned")
    }


def null_group(rng, seeds: int, rho: float, eval_share: float = 0.5):
    """ROWS rows x ``seeds`` seeds drawn from one distribution: a seed effect shared by every row (correlation
    ``rho``), and an evaluation-sample error per record, part of it shared by every record (the one sample), with
    bootstrap replicates of it; returns the frame and an evaluation-sample stand-in."""
    shared_seed = rng.normal(size=seeds)
    values = np.sqrt(rho) * shared_seed + np.sqrt(1 - rho) * rng.normal(size=(ROWS, seeds))
    sample_error = 0.3 * (np.sqrt(eval_share) * rng.normal() + np.sqrt(1 - eval_share) * rng.normal(size=(ROWS, seeds)))
    values = values + sample_error
    shared_draws = rng.normal(size=REPLICATES)
    rows, replicates = [], {}
    for m in range(ROWS):
        for s in range(seeds):
            run = f"m{m}-s{s}"
            own = rng.normal(size=REPLICATES)
            replicates[run] = values[m, s] + 0.3 * (np.sqrt(eval_share) * shared_draws + np.sqrt(1 - eval_share) * own)
            rows.append({"method": f"m{m}", "pair": (0, s), "seed": s, "run_id": run, "forgetting": values[m, s]})
    sample = SimpleNamespace(of=lambda run, metric: replicates[run])
    return pd.DataFrame(rows), sample


FORGETTING = next(c for c in loss_columns() if c.title == "forgetting")


@pytest.mark.parametrize("seeds", [3, 5])
def test_calibration_of_group_verdicts(committed_correlations, seeds):
    rng = np.random.default_rng(seeds)
    flagged = tested = 0
    for rho in (0.0, committed_correlations["forgetting"], 0.9):
        for _ in range(GROUPS // 3):
            part, sample = null_group(rng, seeds, max(0.0, min(rho, 0.95)))
            found = compare(part, "m0", "forgetting", sample, "forgetting")
            flagged += sum(c.resolved() for c in found)
            tested += len(found)
    assert tested == GROUPS // 3 * 3 * (ROWS - 1)
    assert flagged / tested <= 0.05, f"{flagged}/{tested} null comparisons resolved"


@pytest.mark.parametrize("seeds", [3, 5])
def test_calibration_of_ladder_verdicts(committed_correlations, seeds):
    rng = np.random.default_rng(100 + seeds)
    flagged = tested = 0
    for _ in range(GROUPS // 2):
        part, sample = null_group(rng, seeds, max(0.0, committed_correlations["forgetting"]))
        stats = SimpleNamespace(part=part, sample=sample)
        flagged += len(rung_verdicts(stats, FORGETTING, [f"m{m}" for m in range(ROWS)]))
        tested += ROWS * (ROWS - 1) // 2
    assert flagged / tested <= 0.05, f"{flagged}/{tested} null pairs resolved"


@pytest.fixture(scope="module")
def committed_depth_correlation():
    """The seed correlation of the earlier domains' stability-gap depth between the rows of the committed mini group
    that measured curves (3 seeds each)."""
    from benchmark.metrics import stability_gap

    rows = []
    for record in load_records(ROOT / "results" / "mini"):
        gap = stability_gap(record)
        if gap is not None and record["sequence"][0] == "restaurant":
            rows.append({"method": record["method_label"], "seed": record["seed"], "depth": gap["earlier_depth"]})
    return seed_correlation(pd.DataFrame(rows).pivot_table(index="seed", columns="method", values="depth"))


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_calibration_of_stability_gap_verdicts(committed_depth_correlation, seeds):
    """Each row's depth against the naive reference (paired t over seeds, BH over the rows per measure), on null
    groups: 2 seeds is what the committed top rung's curves have."""
    from benchmark.report.stability_gap import depth_verdicts

    rng = np.random.default_rng(300 + seeds)
    flagged = tested = 0
    for rho in (0.0, max(0.0, committed_depth_correlation), 0.9):
        for _ in range(GROUPS // 3):
            shared = rng.normal(size=(2, seeds))  # per measure, the seed effect every row shares
            depths = {
                f"m{m}": {
                    (s, ("seq0",)): {
                        measure: 0.3 + 0.02 * (np.sqrt(rho) * shared[i, s] + np.sqrt(1 - rho) * rng.normal())
                        for i, measure in enumerate(("earlier_depth", "general_depth"))
                    }
                    for s in range(seeds)
                }
                for m in range(ROWS)
            }
            for rows in depth_verdicts(depths, "m0").values():
                flagged += sum(resolved for _, _, resolved in rows)
                tested += len(rows)
    assert tested == GROUPS // 3 * 3 * 2 * (ROWS - 1)
    assert flagged / tested <= 0.05, f"{flagged}/{tested} null depth comparisons resolved"


@pytest.mark.parametrize("rows", [8, 12])
def test_calibration_of_rank_agreement_above_zero(rows):
    """'tau distinguishable from 0' between two rungs (Kendall's one-sided test) on null ladders, where the rows'
    order at one rung says nothing of their order at the other: at most 5% of them are called above 0."""
    from benchmark.report.ladder import rank_agreement

    rng = np.random.default_rng(400 + rows)
    labels = [f"m{m}" for m in range(rows)]
    called = 0
    for _ in range(GROUPS * 3):
        means = {label: [float(rng.normal()), float(rng.normal())] for label in labels}
        samples = [{label: means[label][k] + 0.1 * rng.normal(size=20) for label in labels} for k in (0, 1)]
        (result,) = rank_agreement(FORGETTING, samples, means, (0, 1, rng), labels)
        called += result.above_zero()
        assert result.low <= result.tau <= result.high  # the interval holds its point estimate
    assert called / (GROUPS * 3) <= 0.05, f"{called}/{GROUPS * 3} null ladders called tau > 0"


def _beside_records(values: np.ndarray) -> list[dict]:
    labels = ["none", *(f"m{m}" for m in range(1, len(values)))]
    return [
        {
            "method_label": labels[m],
            "seed": s,
            "summary": {"macro_f1": {"final": 0.5}},
            "end_tasks_beside": {"finetune": {"summary": {"macro_f1": {"final": float(values[m, s])}}}},
        }
        for m in range(len(values))
        for s in range(values.shape[1])
    ]


@pytest.mark.parametrize("seeds", [3, 5])
def test_calibration_of_end_task_verdicts_against_no_dap(committed_correlations, seeds):
    rng = np.random.default_rng(200 + seeds)
    rho = max(0.0, committed_correlations["fine-tuned"])
    flagged = tested = 0
    for _ in range(GROUPS):
        values = 0.4 + 0.02 * (
            np.sqrt(rho) * rng.normal(size=seeds) + np.sqrt(1 - rho) * rng.normal(size=(ROWS, seeds))
        )
        rows = beside_rows(_beside_records(values), "finetune")
        flagged += sum(row.resolved() for row in rows)
        tested += sum(row.test is not None for row in rows)
    assert tested == GROUPS * (ROWS - 1)
    assert flagged / tested <= 0.05, f"{flagged}/{tested} null rows resolved against none"


def test_the_comparison_resolves_real_differences():
    """Power, so the calibration is not bought by a test that never rejects: a shift of 2 seed sds is found."""
    rng = np.random.default_rng(7)
    part, sample = null_group(rng, 5, 0.5, eval_share=0.5)
    part.loc[part["method"] == "m3", "forgetting"] += 3.0
    found = {c.label: c for c in compare(part, "m0", "forgetting", sample, "forgetting")}
    assert found["m3"].resolved() and found["m3"].mean > 2


def test_the_resolvable_difference_is_found_80_percent_of_the_time():
    rng = np.random.default_rng(11)
    se, n = 1.0 / np.sqrt(3), 3
    delta = resolvable_difference(se, n - 1)
    hits = sum(paired_test(delta + rng.normal(size=n)).p < 0.05 for _ in range(4000))
    assert 0.77 <= hits / 4000 <= 0.83
    assert resolvable_difference(se, n - 1) > resolvable_difference(1.0 / np.sqrt(5), 4)


def test_a_tie_says_what_its_seeds_could_have_resolved(report_records):
    from benchmark.report.frame import leaderboard_frame, reference_labels
    from benchmark.report.groups import group_records
    from benchmark.report.reading import loss_reading
    from benchmark.report.statistics import GroupStatistics

    (group,), _ = group_records(report_records)
    part = leaderboard_frame(group.records, group_of=lambda r: group.key)
    stats = GroupStatistics(part, group.records, group.sample_key, reference_labels(group.records))
    text = "\n".join(loss_reading(stats))
    assert "not separated" in text and "with 80% power" in text


def test_calibration_of_verdicts_at_matched_plasticity():
    """Null: every row lies on the family's curve (forgetting a fixed function of plasticity) up to seed noise."""
    from benchmark.report.matched import Family, matched

    rng = np.random.default_rng(300)
    family = Family("m", "schedule.lr_scale", ((0.5, "m[lr=0.5]"), (1.0, "m"), (2.0, "m[lr=2]")))
    flagged = tested = 0
    for _ in range(GROUPS):
        rows = []
        for s in range(3):
            shared = rng.normal()
            for m, (_, label) in enumerate(family.rows):
                p = 0.5 + 0.2 * m + 0.02 * rng.normal()
                rows.append((label, s, p, 0.1 + 0.5 * p + 0.01 * (shared + rng.normal())))
            for k in range(ROWS - 3):
                p = rng.uniform(0.55, 0.85)
                rows.append((f"x{k}", s, p, 0.1 + 0.5 * p + 0.01 * (shared + rng.normal())))
        part = pd.DataFrame([{"method": m, "pair": (0, s), "plasticity": p, "forgetting": f} for m, s, p, f in rows])
        found = matched(part, family, "forgetting")
        flagged += sum(c.resolved() for c in found)
        tested += len(found)
    assert tested > GROUPS  # most rows lie inside the curve at 2+ seeds
    assert flagged / tested <= 0.05, f"{flagged}/{tested} null rows resolved off the curve"


def test_a_strength_family_is_found_from_the_records_alone(report_records):
    from benchmark.report.matched import families, option_value

    record = next(r for r in report_records if r["method"] == "ncl")
    assert option_value(record, "schedule.lr_scale") == 1.0 and option_value(record, "replay.general") == 0.0
    variants = []
    for value in (0.5, 2.0):
        copy = json.loads(json.dumps(record))
        copy["method_label"] = f"ncl[schedule.lr_scale={value:g}]"
        copy["config"]["schedule"]["lr_scale"] = value
        variants.append(copy)
    (family,) = [f for f in families([*report_records, *variants]) if f.option == "schedule.lr_scale"]
    assert [label for _, label in family.rows] == ["ncl[schedule.lr_scale=0.5]", "ncl", "ncl[schedule.lr_scale=2]"]


def test_a_curve_no_row_falls_on_is_stated_with_its_span():
    """A strength family whose plasticity no other row reaches still gets a line: where its curve lies, and that
    nothing was read against it (issue #85: DER++'s alpha moves plasticity by a few thousandths)."""
    from benchmark.report.matched import matched_markdown

    part = pd.DataFrame(
        [
            {"method": label, "pair": (0, seed), "plasticity": p + 0.001 * seed, "forgetting": 0.1, "general rise": 0.2}
            for seed in range(3)
            for label, p in (("derpp[alpha=0.125]", 0.331), ("derpp", 0.333), ("derpp[alpha=2]", 0.335), ("ncl", 0.4))
        ]
    )
    records = [
        {"method": "derpp", "method_label": label, "method_config": {"alpha": alpha}, "config": {}}
        for label, alpha in (("derpp[alpha=0.125]", 0.125), ("derpp", 0.5), ("derpp[alpha=2]", 2.0))
    ]
    records.append({"method": "ncl", "method_label": "ncl", "method_config": {}, "config": {}})
    text = "\n".join(matched_markdown(part, records))
    assert "`derpp` along alpha (0.125, 0.5, 2): its rows' plasticity spans 0.332 to 0.336 nats" in text
    assert "no row is read against it" in text and "`ncl` +" not in text


def test_a_curve_at_one_seed_says_it_waits_for_a_second():
    """A family whose strengths share one seed is named with that reason, not as a curve no row falls on."""
    from benchmark.report.matched import matched_markdown

    rows = [
        ("das[contrast_lambda=0.25]", 0, 0.30),
        ("das", 0, 0.28),
        ("das", 1, 0.29),
        ("das[contrast_lambda=4]", 0, 0.23),
    ]
    rows += [("ncl", seed, 0.29) for seed in range(2)]
    part = pd.DataFrame(
        [{"method": m, "pair": (0, s), "plasticity": p, "forgetting": 0.1, "general rise": 0.2} for m, s, p in rows]
    )
    records = [
        {"method": "das", "method_label": label, "method_config": {"contrast_lambda": value}, "config": {}}
        for label, value in (("das[contrast_lambda=0.25]", 0.25), ("das", 1.0), ("das[contrast_lambda=4]", 4.0))
    ]
    text = "\n".join(matched_markdown(part, records))
    assert "`das` along contrast_lambda (0.25, 1, 4): every strength is measured together at 1 seed only" in text
    assert "plasticity spans" not in text
