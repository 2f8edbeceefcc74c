"""oracle (issue #50): every stage re-trains the base model on the union of the domains seen so far with the budget a
continual run has spent by then; its schedule, its run and its learning-rate curve say so."""

import dataclasses

import pytest

from benchmark.api import learning_rates, run_benchmark
from benchmark.engine.schedule import StageSchedule
from benchmark.method import Capabilities


def test_the_oracle_stage_t_starts_from_the_base_and_trains_on_domains_0_to_t_for_t_plus_1_budgets():
    schedule = StageSchedule(Capabilities(retrains_on_seen=True), num_domains=3, steps_per_domain=10, matrix="full")
    assert schedule.stages() == [0, 1, 2] and all(schedule.starts_fresh(t) for t in range(3))
    assert [schedule.training_domains(t) for t in range(3)] == [[0], [0, 1], [0, 1, 2]]
    assert [schedule.updates(t) for t in range(3)] == [10, 20, 30]
    assert [schedule.step_offset(t) for t in range(3)] == [0, 0, 0]  # each stage a run of its own
    assert schedule.total_updates(2) == 30 and not schedule.carries_method_state(1)
    assert schedule.row_tasks(2) == [0, 1, 2]  # a full matrix, as a continual method's
    continual = StageSchedule(Capabilities(), num_domains=3, steps_per_domain=10, matrix="full")
    assert [continual.updates(t) for t in range(3)] == [10, 10, 10] and continual.step_offset(2) == 20


def test_an_oracle_run_records_its_growing_budget_and_a_full_loss_matrix(tiny_config):
    config = dataclasses.replace(tiny_config, methods=("oracle",))
    (record,) = run_benchmark(config, write_leaderboard=False)
    steps = tiny_config.dap.steps
    assert [stage["steps"] for stage in record["domains"]] == [steps, 2 * steps]
    assert [stage["tokens"] for stage in record["domains"]][1] == 2 * record["domains"][0]["tokens"]
    after = record["lm_loss"]["after_domain"]
    assert all(after[t][domain] is not None for t in range(2) for domain in record["sequence"][: t + 1])
    assert record["lm_loss"]["metrics"]["forgetting"] is not None
    assert len(learning_rates(record)) == steps + 2 * steps  # one curve per stage, each its own run


def test_the_report_shows_each_rows_regret_against_the_oracle_of_its_seed(tiny_config, tmp_path):
    import json

    import numpy as np

    from benchmark.metrics import mean_regret
    from benchmark.report.frame import served_losses

    config = dataclasses.replace(tiny_config, methods=("ncl", "oracle", "one"), output_dir=str(tmp_path / "out"))
    records = {r["method"]: r for r in run_benchmark(config)}
    oracle = served_losses(records["oracle"])
    ncl = served_losses(records["ncl"])
    expected = np.mean([ncl[t, k] - oracle[t, k] for t in range(2) for k in range(t + 1)])
    assert float(mean_regret(ncl, oracle)) == pytest.approx(expected)
    one = served_losses(records["one"])
    assert one[1, 0] == one[0, 0]  # a per-domain method serves domain 0 with its own model at every stage
    board = (tmp_path / "out" / "leaderboard.md").read_text()
    header = next(line for line in board.splitlines() if line.startswith("| method | n | plasticity"))
    assert "mean regret ↓" in header
    ncl_row = next(line for line in board.splitlines() if line.startswith("| `ncl` |"))
    column = header.split(" | ").index("mean regret ↓")
    assert ncl_row.split(" | ")[column].startswith(f"{expected:.3f}")
    json.dumps(records["oracle"])


def test_joint_training_has_no_regret_since_its_one_model_is_the_oracles_last_stage():
    from benchmark.report.frame import oracle_partners

    def record(method, **capabilities):
        return {"run_id": method, "method": method, "seed": 1, "sequence": ["a", "b"], "capabilities": capabilities}

    records = [record("oracle", retrains_on_seen=True), record("ncl"), record("pool", joint_training=True)]
    partners = oracle_partners(records, lambda r: "group")
    assert {run_id: oracle["run_id"] for run_id, oracle in partners.items()} == {"oracle": "oracle", "ncl": "oracle"}
