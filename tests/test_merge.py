"""merge (issue #50): PEFT's task arithmetic, TIES and DARE merges of per-domain task vectors, checked on a toy case
against a hand computation; the method's hooks start every domain from the base weights and leave the merge of the
domains so far in the model; its state round-trips."""

import dataclasses

import pytest
import torch

from benchmark.method import DomainContext, RunEnv
from benchmark.modeling import load_lm
from methods.merge import Merge, MergeConfig, merge_task_vectors

A = {"w": torch.tensor([3.0, -1.0, 0.5, 2.0])}
B = {"w": torch.tensor([-2.0, -4.0, 1.0, 0.1])}


def _merge(how: str, **options) -> torch.Tensor:
    return merge_task_vectors([A, B], MergeConfig(how=how, **options), seed=7)["w"]


def test_task_arithmetic_is_the_weighted_sum_and_by_default_the_mean():
    assert torch.allclose(_merge("task_arithmetic"), (A["w"] + B["w"]) / 2)
    assert torch.allclose(_merge("task_arithmetic", scale=0.3), 0.3 * (A["w"] + B["w"]))


def test_ties_trims_elects_the_sign_and_averages_what_agrees():
    # density 0.5 keeps two entries of each: a -> [3, 0, 0, 2], b -> [-2, -4, 0, 0]; the signs of the sums
    # [1, -4, 0, 2] elect +, -, (none: both zero), +; the entries that agree are averaged: [3, -4, 0, 2].
    assert torch.equal(_merge("ties", density=0.5), torch.tensor([3.0, -4.0, 0.0, 2.0]))
    # by frequency the signs of entries 1-3 are elected as by the total (entry 0 is a tie of one + and one -)
    assert torch.equal(_merge("ties", density=0.5, majority_sign="frequency")[1:], torch.tensor([-4.0, 0.0, 2.0]))


def test_dare_keeps_everything_at_density_one_and_rescales_what_it_keeps():
    assert torch.allclose(_merge("dare_linear", density=1.0), (A["w"] + B["w"]) / 2)
    dropped = merge_task_vectors([A], MergeConfig(how="dare_linear", density=0.5), seed=7)["w"]
    kept = dropped != 0
    assert torch.allclose(dropped[kept], 2 * A["w"][kept])  # kept entries of one vector are rescaled by 1/density
    again = merge_task_vectors([A], MergeConfig(how="dare_linear", density=0.5), seed=7)["w"]
    assert torch.equal(dropped, again)  # seeded apart from the run's random streams
    state = torch.get_rng_state()
    merge_task_vectors([A, B], MergeConfig(how="dare_ties", density=0.5), seed=3)
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("how", ["task_arithmetic", "ties"])
def test_each_domain_starts_from_the_base_and_ends_as_the_merge_so_far(tiny_model, how):
    base, _ = load_lm(str(tiny_model))
    start = {n: p.detach().clone() for n, p in base.named_parameters()}
    method = Merge(MergeConfig(how=how), env=RunEnv(2, ("a", "b"), 1, base_model=str(tiny_model)))
    model, _ = load_lm(str(tiny_model))
    ctx = DomainContext(0, "a", model, [], None, None)
    deltas = []
    for index in range(2):
        ctx = dataclasses.replace(ctx, index=index)
        method.before_domain(ctx)
        assert all(torch.equal(p, start[n]) for n, p in model.named_parameters())  # from the base, not the merge
        generator = torch.Generator().manual_seed(index)
        delta = {n: torch.randn(p.shape, generator=generator) * 0.01 for n, p in model.named_parameters()}
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.add_(delta[n])
        deltas.append(delta)
        method.after_domain(ctx)
        merged = merge_task_vectors(deltas, MergeConfig(how=how), seed=0)
        for n, p in model.named_parameters():
            assert torch.allclose(p, start[n] + merged[n], atol=1e-6), n
    if how == "task_arithmetic":  # the default merge of two is their mean
        name = next(iter(start))
        expected = start[name] + (deltas[0][name] + deltas[1][name]) / 2
        assert torch.allclose(dict(model.named_parameters())[name], expected, atol=1e-6)
    restored = Merge(MergeConfig(how=how), env=method.env)
    restored.load_state_dict(method.state_dict())
    assert len(restored.task_vectors) == 2
    assert all(torch.equal(restored.task_vectors[1][n], t) for n, t in method.task_vectors[1].items())


def test_merge_options_are_checked():
    from benchmark.errors import DapbenchError

    with pytest.raises(DapbenchError, match="merge.how"):
        MergeConfig.from_options({"how": "average"}, section="merge")
    with pytest.raises(DapbenchError, match="merge.density"):
        MergeConfig.from_options({"density": 0}, section="merge")
