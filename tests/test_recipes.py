"""Recipe options of every method (issue #28): data replay and learning-rate schedules."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import REPO, one_thread_env
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmark.config import DapConfig, ReplayConfig, ScheduleConfig, apply_overrides
from benchmark.data.sampling import DOMAIN, ReplayPlan, StageMicroBatches
from benchmark.engine.recipe import learning_rate_curve
from benchmark.errors import DapbenchError


@settings(max_examples=80, deadline=None)
@given(
    general=st.floats(0, 0.6),
    past=st.floats(0, 0.39),
    micro=st.integers(1, 16),
    per_update=st.integers(1, 8),
    updates=st.integers(1, 40),
)
def test_replay_fractions_are_met_over_the_stage_and_within_one_chunk_per_update(
    general, past, micro, per_update, updates
):
    plan = ReplayPlan((general, past), (100, 50), micro, per_update)
    chunks = micro * per_update
    per_update_counts = []
    for u in range(updates):
        update = [plan.counts(i) for i in range(u * per_update, (u + 1) * per_update)]
        assert all(sum(c) <= micro and min(c) >= 0 for c in update)
        per_update_counts.append([sum(c[p] for c in update) for p in (0, 1)])
        assert per_update_counts[-1] == plan.totals(u)  # the micro-batches of an update hold its totals
    first = [counts[0] for counts in per_update_counts]
    assert all(math.floor(general * chunks) <= n <= math.ceil(general * chunks) for n in first)
    assert abs(sum(first) - general * chunks * updates) <= 0.5 + 1e-9  # the stage's total is the nearest whole number
    if math.ceil(general * chunks) + math.ceil(past * chunks) <= chunks:  # the second pool is never cut short
        second = sum(counts[1] for counts in per_update_counts)
        assert abs(second - past * chunks * updates) <= 0.5 + 1e-9


def test_a_share_that_is_a_multiple_of_one_chunk_is_the_same_in_every_update_and_a_small_one_is_not_lost():
    quarter = ReplayPlan((0.25,), (10,), micro=16, micro_per_update=1)
    assert {quarter.totals(u)[0] for u in range(24)} == {4}
    percent = ReplayPlan((0.01,), (10,), micro=16, micro_per_update=1)  # the mini profile's 16 chunks per update
    assert sum(percent.totals(u)[0] for u in range(24)) == 4  # 3.84 chunks over a domain's 24 updates, rounded
    five = ReplayPlan((0.05,), (10,), micro=16, micro_per_update=1)  # 0.8 chunks per update: 4 in every 5 updates
    assert [five.totals(u)[0] for u in range(10)] == [1, 1, 0, 1, 1, 1, 1, 0, 1, 1]


def _take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def test_replayed_chunks_replace_domain_chunks_and_do_not_depend_on_the_process_layout():
    plan = ReplayPlan((0.25, 0.25), (30, 20), micro=4, micro_per_update=2)  # 2 + 2 of every 8 chunks
    one = _take(StageMicroBatches(size=40, micro=4, seed=5, stage=1, replay=plan), 8)
    rank0 = _take(StageMicroBatches(size=40, micro=4, seed=5, stage=1, rank=0, world=2, replay=plan), 4)
    rank1 = _take(StageMicroBatches(size=40, micro=4, seed=5, stage=1, rank=1, world=2, replay=plan), 4)
    assert one[0::2] == rank0 and one[1::2] == rank1
    assert all(len(batch) == 4 for batch in one)  # the token budget of every micro-batch stays
    for u in range(4):
        sources = [source for batch in one[2 * u : 2 * u + 2] for _, source, _ in batch]
        assert sources.count(DOMAIN) == 4 and sources.count(1) == 2 and sources.count(2) == 2
    plain = _take(StageMicroBatches(size=40, micro=4, seed=5, stage=1), 8)
    assert [b[: sum(s == DOMAIN for _, s, _ in b)] for b in one] == [
        p[: sum(s == DOMAIN for _, s, _ in b)] for p, b in zip(plain, one, strict=True)
    ]  # the domain's own chunks are the replay-free stream's, cut short


def test_replay_options_are_checked():
    with pytest.raises(DapbenchError, match="leaves no chunk of the current domain"):
        ReplayConfig(general=0.6, past=0.4)
    with pytest.raises(DapbenchError):
        ReplayConfig(general=-0.1)
    with pytest.raises(DapbenchError):
        ScheduleConfig(name="triangle")


def test_the_general_heldout_text_never_enters_a_replay_batch(tiny_config):
    """By construction the pool is ``general_corpus``; shown here by every replayed chunk of a stage."""
    from benchmark.data.corpora import load_heldout_text
    from benchmark.data.inputs import prepare_data
    from benchmark.data.sampling import stage_stream
    from benchmark.engine.stages import replay_pools

    config = apply_overrides(tiny_config, ["replay.general=0.5"])
    data = prepare_data(config)
    cache = Path(config.work_dir) / "cache"
    heldout, _ = load_heldout_text(
        "general", config.general_heldout, data.tokenizer, config.dap.seq_len, cache, family=data.family
    )
    parts = type("Parts", (), {"config": config, "data": data})()
    probe = type("Probe", (), {"training_chunks": lambda self: _general_chunks(config, data, cache)})()
    pools = replay_pools(parts, 0, probe)
    (share, pool), plan = pools[0], ReplayPlan((0.5,), (len(pools[0][1]),), 4, 2)
    assert share == 0.5
    stream = stage_stream(
        data.training_set([0]), data.tokenizer, 4, 0.15, 3, 0, 0, 1, family=data.family, replay=(plan, (pool,))
    )
    heldout_rows = {tuple(row["input_ids"].tolist()) for row in heldout}
    pool_rows = {tuple(row["input_ids"].tolist()) for row in pool}
    replayed = 0
    for _, batch in itertools.islice(iter(stream), 6):
        for row in batch["input_ids"][-2:]:  # the last 2 of every micro-batch of 4 are replayed
            original = tuple(torch.where(row == data.tokenizer.mask_token_id, -1, row).tolist())
            assert not any(_matches(original, h) for h in heldout_rows)
            assert any(_matches(original, p) for p in pool_rows)
            replayed += 1
    assert replayed == 12


def _general_chunks(config, data, cache):
    from benchmark.data.corpora import load_heldout_text

    return load_heldout_text(
        "general-train", config.general_corpus, data.tokenizer, config.dap.seq_len, cache, family=data.family
    )[0]


def _matches(masked: tuple[int, ...], row: tuple[int, ...]) -> bool:
    """Whether a masked row (masked and randomly replaced tokens aside) is ``row``: at least 70% of positions equal."""
    return sum(a == b for a, b in zip(masked, row, strict=True)) >= 0.7 * len(row)


def test_replay_of_the_heldout_text_and_replay_without_a_past_are_refused(tiny_config):
    from benchmark.preflight import check_recipe

    chunks = tiny_config.dap.batch_size * tiny_config.dap.steps  # 8 x 4: 1% would be 0.32 chunks per domain
    with pytest.raises(DapbenchError, match=r"replay.general=0.01 replays no chunk") as refused:
        check_recipe(apply_overrides(tiny_config, ["replay.general=0.01"]))
    assert f"at least {0.5 / chunks:.2g}" in refused.value.fix

    same = dataclasses.replace(tiny_config, general_corpus=tiny_config.general_heldout)
    with pytest.raises(DapbenchError, match="general held-out text"):
        check_recipe(apply_overrides(same, ["replay.general=0.1"]))
    with pytest.raises(DapbenchError, match="does not pre-train"):
        check_recipe(dataclasses.replace(apply_overrides(tiny_config, ["replay.past=0.1"]), methods=("none",)))
    with pytest.raises(DapbenchError, match="no past to replay"):
        check_recipe(dataclasses.replace(apply_overrides(tiny_config, ["replay.past=0.1"]), methods=("one",)))
    check_recipe(dataclasses.replace(apply_overrides(tiny_config, ["replay.past=0.1"]), methods=("ncl", "das")))


def _formula(name: str, s: int, t: int, n: int, domains: int, warmup_ratio: float, floor: float, decay: float):
    """Each schedule's factor of lr at update ``s`` of domain ``t`` (the docstrings of ``benchmark.schedules``)."""
    if name in ("cyclic_cosine", "rsqrt", "schedule_free"):
        return _new_formula(name, s, t, n, warmup_ratio, floor, decay)
    if name == "global":
        s, n = t * n + s, domains * n
    w = int(warmup_ratio * n)
    if name == "per_domain_linear":
        return s / max(1, w) if s < w else max(0.0, (n - s) / max(1, n - w))
    if name in ("rewarm_cosine", "global"):
        return s / max(1, w) if s < w else floor + (1 - floor) * (1 + math.cos(math.pi * (s - w) / max(1, n - w))) / 2
    d = int(decay * n)
    if s < w:
        return floor + (1 - floor) * s / max(1, w)
    if s < n - d:
        return 1.0
    return floor + (1 - floor) * (1 - (s - (n - d)) / max(1, d))


def _new_formula(name: str, s: int, t: int, n: int, warmup_ratio: float, floor: float, decay: float) -> float:
    """``cyclic_cosine`` (re-warming peak 0.5 after the first domain), ``rsqrt`` and ``schedule_free``'s warmup (issue
    #50), written out."""
    w = int(warmup_ratio * n)
    if name == "schedule_free":
        return (s + 1) / w if s < w else 1.0
    if name == "cyclic_cosine":
        peak = 1.0 if t == 0 else 0.5
        return peak * s / w if s < w else floor + (peak - floor) * (1 + math.cos(math.pi * (s - w) / (n - w))) / 2
    g, d = t * n + s, int(decay * n)
    value = g / w if g < w else (w / g) ** 0.5
    return value * (floor + (1 - floor) * (1 - (s - (n - d)) / d)) if s >= n - d else value


@pytest.mark.parametrize(
    "name", ["per_domain_linear", "rewarm_cosine", "global", "wsd", "cyclic_cosine", "rsqrt", "schedule_free"]
)
def test_each_schedule_follows_its_formula_at_every_update(name):
    from benchmark.schedules import SETTINGS

    dap = DapConfig(lr=3e-4, warmup_ratio=0.1)
    reads = {f.name for f in dataclasses.fields(SETTINGS[name])}  # a setting the schedule does not read is refused
    schedule = ScheduleConfig(name=name, **{k: v for k, v in {"decay_fraction": 0.25}.items() if k in reads})
    curve = learning_rate_curve(dap, schedule, [40, 40, 40])
    expected = [3e-4 * _formula(name, s, t, 40, 3, 0.1, 0.1, 0.25) for t in range(3) for s in range(40)]
    assert curve == pytest.approx(expected, rel=1e-9, abs=1e-15)
    if name == "global":
        assert curve[40] < curve[39] and curve[0] == 0  # no re-warming at a domain's start
    elif name == "rsqrt":
        assert curve[39] < curve[40] < curve[29]  # after the cooldown the curve resumes where it was, no re-warming
    elif name == "cyclic_cosine":
        assert max(curve[40:80]) == pytest.approx(0.5 * max(curve[:40]))  # a lower peak for every later domain
    else:
        assert curve[40] == curve[0]  # every domain starts its schedule again


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = one_thread_env()
    return subprocess.run(
        [sys.executable, "-m", "benchmark.cli", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=900
    )


def test_recipe_options_label_the_row_enter_the_id_and_leave_defaults_ids_alone(tiny_config, tmp_path):
    from benchmark.api import planned_run_ids

    default = planned_run_ids(tiny_config)
    spelled = planned_run_ids(apply_overrides(tiny_config, ["replay.general=0", "schedule.name=per_domain_linear"]))
    replayed = planned_run_ids(apply_overrides(tiny_config, ["replay.general=0.05"]))
    assert default == spelled and not set(default.values()) & set(replayed.values())


def _replayed_ncl_record(world_root: Path, model: Path, out: Path, schedule: str) -> dict:
    """The record of a synthetic NCL run with 25% general and 25% past replay under ``schedule``."""
    args = ["run", "--profile", "synthetic", "--model", str(model), "--data-root", str(world_root)]
    args += ["--general-heldout", str(world_root / "general_heldout.txt"), "--sequence", "alpha,beta"]
    args += ["--methods", "ncl", "--seeds", "1", "--output-dir", str(out), "--quiet"]
    for setting in (
        "dap.steps=4",
        "dap.per_device_batch_size=16",
        "finetune.default_epochs=1",
        f"general_corpus={world_root / 'general.txt'}",
        "replay.general=0.25",
        "replay.past=0.25",
        f"schedule.name={schedule}",
    ):
        args += ["--set", setting]
    result = _cli(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = (out / "results" / "synthetic").glob("ncl-*.json")
    return json.loads(path.read_text())


def test_a_run_with_replay_and_a_schedule_records_them(world_root, tiny_model, tmp_path):
    record = _replayed_ncl_record(world_root, tiny_model, tmp_path, "wsd")
    assert record["method_label"] == "ncl[replay.general=0.25,replay.past=0.25,schedule.name=wsd]"
    assert record["config"]["replay"] == {"general": 0.25, "past": 0.25}
    assert record["config"]["schedule"]["name"] == "wsd" and record["comparison_role"] is None
    assert "ncl[replay.general=0.25" in (tmp_path / "leaderboard.md").read_text()


def test_tensorboard_event_files_hold_every_update_and_the_stage_results(world_root, tiny_model, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = ["run", "--profile", "synthetic", "--model", str(tiny_model), "--data-root", str(world_root)]
    args += ["--general-heldout", str(world_root / "general_heldout.txt"), "--sequence", "alpha,beta"]
    args += ["--methods", "ncl", "--seeds", "1", "--output-dir", str(tmp_path), "--quiet", "--report-to"]
    args += ["tensorboard", "--set", "dap.steps=4", "--set", "finetune.default_epochs=1"]
    result = _cli(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    (record_path,) = (tmp_path / "results" / "synthetic").glob("ncl-*.json")
    record = json.loads(record_path.read_text())
    (run_dir,) = (tmp_path / "tracking").iterdir()
    assert run_dir.name == record["run_id"]
    events = EventAccumulator(str(run_dir)).Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert [step for step, _ in scalars["dap/mlm"]] == list(range(1, 9))  # every update of both domains
    assert [step for step, _ in scalars["dap/lr"]] == list(range(1, 9)) and scalars["dap/lr"][0][1] >= 0
    logged = [value for step, value in scalars["dap/mlm"] if step in (2, 4)]
    assert logged and all(math.isfinite(v) for v in logged)
    losses = record["lm_loss"]["after_domain"]
    assert scalars["heldout/alpha"][-1][1] == pytest.approx(losses[-1]["alpha"], abs=1e-5)
    assert [step for step, _ in scalars["heldout/alpha"]] == [4, 8]  # at each stage's last update
    assert any(tag.startswith("end_task/") for tag in scalars) and any(tag.startswith("final/") for tag in scalars)


def test_a_records_learning_rate_curve_is_its_schedule_and_plots(tmp_path):
    from benchmark.api import learning_rates, plot_learning_rates
    from benchmark.config import RunConfig, spelled_config

    (path,) = (REPO / "results" / "ci").glob("ncl-*.json")
    record = json.loads(path.read_text())
    config = RunConfig.from_dict(spelled_config(record["config"]))
    steps, domains = config.dap.steps, len(record["sequence"])
    rates = learning_rates(record)
    assert len(rates) == steps * domains and rates[:steps] == rates[steps : 2 * steps]  # re-warmed per domain
    assert rates == pytest.approx(
        [
            config.dap.lr * _formula("per_domain_linear", s, t, steps, domains, 0.1, 0, 0)
            for t in range(domains)
            for s in range(steps)
        ]
    )
    out = plot_learning_rates([path], tmp_path / "lr.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_and_a_schedule_run_on_a_decoder(world_root, tiny_llama, tmp_path):
    """The recipe options work for causal LMs too: the general pool is packed as the decoder's text is."""
    record = _replayed_ncl_record(world_root, tiny_llama, tmp_path, "rewarm_cosine")
    assert record["model_kind"] == "causal" and record["method_label"].startswith("ncl[replay.general=0.25")


def test_a_schedule_is_added_by_registering_one_function():
    """A new schedule is one registered function with its typed settings: ``schedule.name`` accepts it, the runner
    schedules with it and hands it those settings, and a setting it does not read is refused."""
    import torch

    from benchmark.schedules import SCHEDULES, SETTINGS, FloorSettings, describe_schedules, register_schedule

    with pytest.raises(DapbenchError, match="one of: per_domain_linear"):
        ScheduleConfig(name="halving")
    given = []
    try:

        @register_schedule("halving", FloorSettings)
        def halving(optimizer, settings: FloorSettings, span):
            """Half the rate in every domain after the first, never below the floor."""
            given.append(settings)
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(settings.min_lr_ratio, 0.5**span.index))

        curve = learning_rate_curve(DapConfig(lr=1.0), ScheduleConfig(name="halving", min_lr_ratio=0.3), [3, 3, 3])
        assert curve == [1.0] * 3 + [0.5] * 3 + [0.3] * 3
        assert given[0] == FloorSettings(min_lr_ratio=0.3)  # its own typed settings, not the whole section
        with pytest.raises(DapbenchError, match=r"schedule.rewarm_ratio=0.2 is not read by schedule.name=halving"):
            ScheduleConfig(name="halving", rewarm_ratio=0.2)
        with pytest.raises(ValueError, match="already registered"):
            register_schedule("halving")(lambda optimizer, options, span: None)  # another function, the same name
        assert describe_schedules()["halving"].startswith("Half the rate in every domain after the first")
    finally:
        SCHEDULES.remove("halving")  # the registration is this test's own
        SETTINGS.pop("halving", None)


def test_a_setting_no_chosen_schedule_reads_is_refused_naming_the_ones_that_do():
    with pytest.raises(DapbenchError, match="choose a schedule that reads it: wsd, rsqrt"):
        ScheduleConfig(name="cyclic_cosine", decay_fraction=0.3)
    assert ScheduleConfig(name="wsd", decay_fraction=0.3).decay_fraction == 0.3


def test_a_schedule_whose_settings_the_section_lacks_is_refused_when_named():
    from dataclasses import dataclass

    from benchmark.plugins import RegistrationError
    from benchmark.schedules import SCHEDULES, SETTINGS, register_schedule

    @dataclass(frozen=True)
    class Unknown:
        momentum: float

    try:
        register_schedule("odd", Unknown)(lambda optimizer, settings, span: None)
        with pytest.raises(RegistrationError, match="declares settings momentum that schedule.\\* does not have"):
            ScheduleConfig(name="odd")
    finally:
        SCHEDULES.remove("odd")
        SETTINGS.pop("odd", None)


def test_an_infinite_schedule_runs_a_method_end_to_end(world_root, tiny_model, tmp_path):
    record = _replayed_ncl_record(world_root, tiny_model, tmp_path, "rsqrt")
    assert record["method_label"].endswith(",schedule.name=rsqrt]") and record["config"]["schedule"]["name"] == "rsqrt"
    assert all(stage["trained"] and stage["steps"] == 4 for stage in record["domains"])


def test_schedule_free_trains_with_its_own_optimizer_and_is_evaluated_at_its_average():
    import schedulefree
    import torch

    from benchmark.engine.optimizers import build_optimizers
    from benchmark.engine.recipe import stage_plan
    from benchmark.engine.training import _optimizer_mode

    dap = DapConfig(lr=0.1, warmup_ratio=0.25)
    layer = torch.nn.Linear(3, 1)
    plan = stage_plan(dap, ScheduleConfig(name="schedule_free"), 8, 0, 8)
    (optimizer,) = build_optimizers(list(layer.named_parameters()), [], dap, plan=plan)
    assert isinstance(optimizer, schedulefree.AdamWScheduleFree)
    _optimizer_mode(optimizer, "train")
    for _ in range(4):
        layer(torch.ones(2, 3)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    trained_at = layer.weight.detach().clone()
    _optimizer_mode(optimizer, "eval")  # what the runner does at the end of a stage
    assert not optimizer.param_groups[0]["train_mode"] and not torch.equal(layer.weight, trained_at)
    plain = build_optimizers(list(layer.named_parameters()), [], dap, plan=stage_plan(dap, ScheduleConfig(), 8, 0, 8))
    assert type(plain[0]) is torch.optim.AdamW  # every other schedule keeps the DAP AdamW
    _optimizer_mode(plain[0], "eval")  # AdamW has no modes: left alone


def test_a_schedule_free_run_ends_with_finite_numbers(world_root, tiny_model, tmp_path):
    record = _replayed_ncl_record(world_root, tiny_model, tmp_path, "schedule_free")
    assert record["method_label"].endswith(",schedule.name=schedule_free]")
    assert all(math.isfinite(v) for row in record["lm_loss"]["after_domain"] for v in row.values())


@pytest.mark.parametrize("name", ["das", "hat", "prompt_one"])
def test_schedule_free_trains_methods_with_hooks_and_groups_of_their_own(name, tiny_config):
    """Methods whose hooks act on gradients (DAS), that add an SGD group (HAT) or an Adafactor one (prompts)."""
    from test_method_contract import check_method_contract

    check_method_contract(name, apply_overrides(tiny_config, ["schedule.name=schedule_free"]))


@pytest.mark.parametrize("name", ["per_domain_linear", "wsd", "schedule_free"])
def test_a_learning_rate_scale_multiplies_every_rate_and_labels_a_row_of_the_same_group(name):
    from benchmark.records.identity import canonical_config, canonical_recipe, recipe_label

    dap = DapConfig()
    plain = learning_rate_curve(dap, ScheduleConfig(name=name), [8, 8])
    half = learning_rate_curve(dap, ScheduleConfig(name=name, lr_scale=0.5), [8, 8])
    assert half == pytest.approx([0.5 * lr for lr in plain], rel=1e-12, abs=0)
    base = {"schedule": {"name": name}}
    scaled = {"schedule": {"name": name, "lr_scale": 0.5}}
    assert canonical_config(base) == canonical_config(scaled)  # the same group
    assert "schedule.lr_scale=0.5" in recipe_label(canonical_recipe(scaled))
    assert "lr_scale" not in json.dumps(canonical_recipe(base))  # the default changes no run id
