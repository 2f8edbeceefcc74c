"""Every row measures its method (issue #45): a method's own parameter groups train at their own rate, HAT's gates
learn, and every record says how far each group moved."""

import dataclasses

import pytest
import torch

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.engine.optimizers import build_optimizers
from benchmark.method import ParameterGroup
from benchmark.metrics import GATE_DECISIONS, UNTRAINED_BELOW, untrained_groups
from methods._shared.hat import attention_regularizer


def _hat_config(tiny_config, steps: int = 24, **options):
    dap = dataclasses.replace(tiny_config.dap, steps=steps, log_every=steps)
    return dataclasses.replace(tiny_config, dap=dap, method_options={"hat": options} if options else {})


def test_hats_gate_decisions_change_during_a_domain_and_its_first_domain_is_learned(tiny_config):
    """Paper fidelity: the task embeddings train by SGD at the HAT paper's rate, so the masks are learned, not the
    sign of their random start; the first domain's held-out loss falls below the base model's."""
    config = _hat_config(tiny_config)
    record = continual_run(config, prepare_data(config), "hat", 3, show_progress=False).execute()
    first = record["domains"][0]
    assert first["method_report"]["gate_decisions_changed"] > 0.02
    assert first["update_sizes"]["task_embeddings"]["relative"] > UNTRAINED_BELOW
    domain = record["sequence"][0]
    plasticity = record["lm_loss"]["base"][domain] - record["lm_loss"]["after_domain"][0][domain]
    assert plasticity >= 0, plasticity
    assert not untrained_groups(record["domains"])


def test_hats_reference_fidelity_leaves_the_masks_where_they_started(tiny_config):
    """ContinualLM's code (the embeddings in the model's AdamW): the same budget changes far fewer gate decisions
    than the paper's SGD, and its embeddings are no group of their own."""
    paper = _hat_config(tiny_config)
    reference = _hat_config(tiny_config, fidelity="reference")
    data = prepare_data(paper)
    moved = [
        continual_run(config, data, "hat", 3, show_progress=False).execute()["domains"][0]
        for config in (paper, reference)
    ]
    assert set(moved[1]["update_sizes"]) == {"weights"}
    changed = [m["method_report"]["gate_decisions_changed"] for m in moved]
    assert changed[1] < changed[0] / 3, changed


def test_the_regulariser_is_finite_when_earlier_domains_hold_every_unit():
    gates = {"head": torch.full((2, 4), 0.7, requires_grad=True)}
    taken = {"head": torch.ones(2, 4)}
    value = attention_regularizer(gates, taken)
    value.backward()
    assert float(value.detach()) == 0.0 and torch.isfinite(gates["head"].grad).all()


def test_an_adamw_group_at_the_dap_rate_steps_the_other_parameters_exactly_as_without_it(tiny_config):
    """Declaring a group leaves every other parameter's optimisation untouched (methods that declare none keep their
    numbers: the CI key numbers guard it end to end)."""
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    dap = tiny_config.dap
    plain = build_optimizers(list(models[0].named_parameters()), [], dap)
    head = list(models[1][1].named_parameters())
    grouped = build_optimizers(list(models[1].named_parameters()), [ParameterGroup("head", head, dap.lr)], dap)
    assert len(plain) == len(grouped) == 1 and len(grouped[0].param_groups) == 4
    x = torch.randn(8, 4)
    for model, (optimizer,) in zip(models, (plain, grouped), strict=True):
        for _ in range(3):
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_sgd_group_gets_its_own_optimizer_at_its_own_rate(tiny_config):
    model = torch.nn.Linear(3, 3)
    group = ParameterGroup("gates", [("bias", model.bias)], 0.05, optimizer="sgd", clip=False)
    adamw, sgd = build_optimizers(list(model.named_parameters()), [group], tiny_config.dap)
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["lr"] == 0.05
    assert all(model.bias is not p for g in adamw.param_groups for p in g["params"])


def test_a_group_with_an_unknown_optimizer_or_no_rate_is_refused():
    with pytest.raises(ValueError, match="optimizer"):
        ParameterGroup("x", [], 0.1, optimizer="lion")
    with pytest.raises(ValueError, match="learning rate"):
        ParameterGroup("x", [], 0.0)


def test_every_record_carries_update_sizes_and_a_group_that_did_not_move_is_named(tiny_config):
    record = continual_run(tiny_config, prepare_data(tiny_config), "ncl", 3, show_progress=False).execute()
    sizes = [stage["update_sizes"]["weights"] for stage in record["domains"]]
    assert all(s["relative"] > UNTRAINED_BELOW and s["parameters"] == record["trainable_parameters"] for s in sizes)
    stalled = [{"update_sizes": {"prompts": {"relative": 2e-4}, "weights": {"relative": 0.02}}}]
    assert untrained_groups(stalled) == {"prompts": 2e-4}
    assert untrained_groups([{"update_sizes": {"lora": {"relative": None}}}, {}]) == {}
    gated = [{"method_report": {"gate_decisions_changed": share}} for share in (0.012, 0.018)]
    assert untrained_groups(gated) == {GATE_DECISIONS: 0.018}
    assert untrained_groups([*gated, {"method_report": {"gate_decisions_changed": 0.2}}]) == {}


def test_the_leaderboard_flags_and_explains_a_row_whose_masks_did_not_learn(tiny_config):
    """A row whose gates barely changed is flagged in the tables and named in the reading with the measured share."""
    import copy

    from benchmark.report.frame import leaderboard_frame, loss_columns, reference_labels
    from benchmark.report.groups import group_records
    from benchmark.report.markdown import table
    from benchmark.report.statistics import GroupStatistics
    from benchmark.report.training_reading import training_reading

    record = continual_run(tiny_config, prepare_data(tiny_config), "ncl", 3, show_progress=False).execute()
    gated = copy.deepcopy(record)
    for stage in gated["domains"]:
        stage["method_report"] = {"gate_decisions_changed": 0.012, "gates_open": 0.51}
    (group,), _ = group_records([gated])
    part = leaderboard_frame(group.records, lambda r: group.key)
    stats = GroupStatistics(part, group.records, group.sample_key, reference_labels(group.records))
    (row,) = [line for line in table(stats, loss_columns(), "final gain") if line.startswith("| `ncl`")]
    flags = row.rstrip(" |").rsplit("|", 1)[-1]  # the row's last cell: its flags (the tiny world's end tasks add one)
    assert flags.strip().startswith("untrained: gate decisions ≤ 1.2%")
    (line,) = training_reading(stats)
    assert "at most 1.2% of its gate decisions changed" in line and "keep 51-51% of the units" in line
    # a record made before update sizes were measured: the reading says its rows' training is not recorded yet
    old = copy.deepcopy(record)
    del old["domains"][1]["update_sizes"]
    (group,), _ = group_records([old])
    part = leaderboard_frame(group.records, lambda r: group.key)
    stats = GroupStatistics(part, group.records, group.sample_key, reference_labels(group.records))
    (line,) = training_reading(stats)
    assert line.startswith("- Whether these rows' parameters moved is not recorded yet") and line.endswith(": `ncl`.")


def test_a_record_made_before_update_sizes_reproduces_without_them_and_one_with_them_is_compared_on_them():
    from benchmark.records.reproduce import CI_TOLERANCE, compare_records

    old = {"domains": [{"steps": 4, "lm_loss": {"general": 5.0}}]}
    sizes = {"weights": {"parameters": 10, "start_norm": 3.0, "change_norm": 0.1, "relative": 0.0333}}
    new = {"domains": [{"steps": 4, "lm_loss": {"general": 5.0}, "update_sizes": sizes}]}
    assert compare_records(old, new, CI_TOLERANCE) == []
    moved = {"domains": [{**new["domains"][0], "update_sizes": {"weights": {**sizes["weights"], "relative": 0.5}}}]}
    assert [m.name for m in compare_records(new, moved, CI_TOLERANCE)] == ["domains/0/update_sizes/weights/relative"]
