"""Hand-computed cases for the baselines' pure algorithms."""

import pytest
import torch
from torch import nn

from methods._shared.distill import distillation_loss, reference_hidden_kl
from methods._shared.ewc import diagonal_fisher, ewc_penalty, merge_fisher


def test_ewc_penalty_by_hand():
    w = nn.Parameter(torch.tensor([1.0, 2.0]))
    b = nn.Parameter(torch.tensor([0.5]))
    fisher = {"w": torch.tensor([2.0, 0.5]), "b": torch.tensor([4.0])}
    anchor = {"w": torch.tensor([0.0, 1.0]), "b": torch.tensor([0.0])}
    # 10/2 * (2*1^2 + 0.5*1^2 + 4*0.5^2) = 5 * 3.5 = 17.5
    penalty = ewc_penalty([("w", w), ("b", b)], fisher, anchor, strength=10.0)
    assert float(penalty.detach()) == pytest.approx(17.5)
    penalty.backward()
    # d/dw = strength * F * (w - w*) = 10 * [2*1, 0.5*1]
    assert torch.allclose(w.grad, torch.tensor([20.0, 5.0]))


def test_ewc_penalty_is_zero_at_the_anchor():
    w = nn.Parameter(torch.tensor([1.0, 2.0]))
    assert ewc_penalty([("w", w)], {"w": torch.ones(2)}, {"w": w.detach().clone()}, 5000.0).item() == 0.0


def test_fisher_merge_is_a_running_average():
    f0, f1, f2 = ({"w": torch.tensor([v])} for v in (3.0, 6.0, 0.0))
    merged = merge_fisher(None, f0, 0)
    merged = merge_fisher(merged, f1, 1)  # (6 + 1*3) / 2 = 4.5
    assert float(merged["w"]) == pytest.approx(4.5)
    merged = merge_fisher(merged, f2, 2)  # (0 + 2*4.5) / 3 = 3 = mean(3, 6, 0)
    assert float(merged["w"]) == pytest.approx(3.0)


def test_diagonal_fisher_is_batch_size_times_squared_gradient():
    w = nn.Parameter(torch.tensor([2.0]))
    batches = [
        {"input_ids": torch.zeros(4, 1), "x": torch.tensor([1.0])},
        {"input_ids": torch.zeros(2, 1), "x": torch.tensor([3.0])},
    ]
    # loss = w * x -> grad = x; Fisher = mean(4 * 1^2, 2 * 3^2) = (4 + 18) / 2 = 11
    fisher = diagonal_fisher([("w", w)], batches, lambda batch: (w * batch["x"]).sum())
    assert float(fisher["w"]) == pytest.approx(11.0)
    assert w.grad is None  # parameters' .grad untouched


def test_kd_loss_is_zero_when_student_equals_teacher():
    logits = torch.randn(5, 11)
    assert float(distillation_loss(logits, logits.clone(), temperature=2.0)) == pytest.approx(0.0, abs=1e-6)
    assert float(distillation_loss(logits, torch.randn(5, 11), temperature=2.0)) > 0
    hidden = torch.randn(2, 7, 4)
    assert float(reference_hidden_kl(hidden, hidden.clone())) == pytest.approx(0.0, abs=1e-6)


def test_kd_temperature_scaling():
    student, teacher = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]])
    p = torch.softmax(teacher / 2, -1)
    q = torch.softmax(student / 2, -1)
    expected = 4 * float((p * (p.log() - q.log())).sum())
    assert float(distillation_loss(student, teacher, temperature=2.0)) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    ("name", "options", "term", "in_first_domain"),
    [("kd", {}, "kd", True), ("kd", {"target": "hidden_states"}, "kd", True), ("ewc", {}, "ewc", False)],
)
def test_baselines_add_their_loss_terms(name, options, term, in_first_domain, tiny_config):
    import dataclasses

    from benchmark.api import continual_run
    from benchmark.data.inputs import prepare_data

    config = dataclasses.replace(tiny_config, method_options={name: options})
    record = continual_run(config, prepare_data(config), name, 3, show_progress=False).execute()
    first, second = (d["loss_log"] for d in record["domains"])
    assert all(term in entry for entry in second)
    assert all((term in entry) == in_first_domain for entry in first)


def test_reservoir_keeps_a_uniform_sample_within_budget():
    import random

    from methods._shared.replay import Reservoir

    stream, capacity, trials = 200, 20, 600
    counts = [0] * stream
    rng = random.Random(0)
    for _ in range(trials):
        reservoir = Reservoir(capacity=capacity)
        for i in range(stream):
            if (slot := reservoir.decide(rng)) is not None:
                reservoir.place(slot, i)
        assert len(reservoir.items) == capacity and reservoir.seen == stream
        for item in reservoir.items:
            counts[item] += 1
    frequencies = [c / trials for c in counts]
    # every item is kept with probability capacity / stream = 0.1 (3 sigma over 600 trials ~ 0.037)
    assert max(abs(f - 0.1) for f in frequencies) < 0.05
    assert abs(sum(frequencies[:100]) - sum(frequencies[100:])) < 1.0  # early and late items alike


def test_replay_collation_offsets_positions_per_row():
    from methods._shared.replay import ReplayItem, collate_replay

    items = [
        ReplayItem(torch.arange(4), torch.tensor([1]), torch.tensor([7]), torch.ones(1, 3)),
        ReplayItem(torch.arange(4), torch.tensor([0, 3]), torch.tensor([8, 9]), torch.zeros(2, 3)),
    ]
    batch = collate_replay(items, "cpu")
    assert batch["mlm_positions"].tolist() == [1, 4, 7]
    assert batch["mlm_targets"].tolist() == [7, 8, 9] and batch["stored_outputs"].shape == (3, 3)


def test_replay_collation_works_under_a_cpu_runs_bf16_autocast():
    # DER++ stores its outputs in float16; CPU bf16 autocast refused to concatenate them (found rehearsing the
    # gpu-small profile, bf16, on a CPU: every derpp update after the first failed)
    from methods._shared.replay import ReplayItem, collate_replay

    items = [ReplayItem(torch.arange(4), torch.tensor([i]), torch.tensor([i]), torch.ones(1, 3).half()) for i in (1, 2)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        batch = collate_replay(items, "cpu")
    assert batch["stored_outputs"].dtype == torch.float16 and batch["stored_outputs"].tolist() == [[1.0] * 3] * 2


def test_derpp_buffer_respects_the_token_budget(tiny_config):
    import dataclasses

    from benchmark.api import continual_run
    from benchmark.data.inputs import prepare_data

    config = dataclasses.replace(tiny_config, method_options={"derpp": {"tokens_per_domain": 96}})
    run = continual_run(config, prepare_data(config), "derpp", 3, show_progress=False)
    record = run.execute()
    assert [len(r.items) for r in run.method.reservoirs] == [3, 3]  # 96 tokens // 32-token chunks
    assert all(r.seen == 4 * 8 for r in run.method.reservoirs)  # 4 steps x batch 8 offered
    assert all("replay_mse" in entry for entry in record["domains"][1]["loss_log"])
