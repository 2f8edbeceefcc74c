import dataclasses
import json
import math

import pytest
import torch

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.engine.workfiles import read_work_file
from benchmark.errors import DapbenchError
from benchmark.families import MASKED_LM
from methods.ncl import NCL


def test_runner_over_two_domains_writes_a_complete_record(tiny_config):
    data = prepare_data(tiny_config)
    record = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    acc = record["matrices"]["acc"]
    assert acc[0][1] is None and all(v is not None for v in (acc[0][0], acc[1][0], acc[1][1]))
    assert record["summary"]["acc"]["forgetting"] == pytest.approx(acc[0][0] - acc[1][0])
    assert record["lm_loss"]["columns"] == ["alpha", "beta", "general"]
    assert len(record["lm_loss"]["after_domain"]) == 2
    assert all(math.isfinite(v) for row in record["lm_loss"]["after_domain"] for v in row.values())
    timing = record["timing"]
    assert timing["tokens_per_second"] > 0 and timing["peak_memory_mb"] > 0
    # Where the time went: every phase timed, the DAP phase holds the updates, and the phases fit in the wall time.
    phases = timing["phase_seconds"]
    assert set(phases) == {"base_evaluation", "dap", "heldout_evaluation", "checkpoint", "end_tasks"}
    assert all(v >= 0 for v in phases.values()) and phases["dap"] > 0 and phases["heldout_evaluation"] > 0
    assert phases["dap"] >= timing["dap_seconds"] - 0.1
    assert sum(phases.values()) <= timing["wall_seconds"] + 0.5
    assert record["trainable_parameters"] > 0
    assert set(record["data_checksums"]) == {
        "corpus/alpha",
        "corpus/beta",
        "corpus/general",
        "task/alpha_sup",
        "task/beta_sup",
        "model",
        "file/general_corpus",
    }
    json.dumps(record)  # the record is plain JSON
    # The step counter really stops at max steps: every domain logged exactly dap.steps updates.
    assert [d["steps"] for d in record["domains"]] == [4, 4]


def test_matrix_final_computes_only_the_diagonal_and_last_row(tiny_config):
    config = dataclasses.replace(tiny_config, matrix="final", sequence="alpha,beta,gamma")
    record = continual_run(config, prepare_data(config), "ncl", 3, show_progress=False).execute()
    acc = record["matrices"]["acc"]
    assert acc[1][0] is None and acc[1][1] is not None and all(v is not None for v in acc[2])


def test_independent_and_no_dap_methods(tiny_config):
    data = prepare_data(tiny_config)
    one = continual_run(tiny_config, data, "one", 3, show_progress=False).execute()
    assert one["summary"]["acc"]["forgetting"] is None  # per-domain models: forgetting undefined
    # Only the diagonal is read by any summary of a per-domain method, so only it is fine-tuned.
    acc = one["matrices"]["acc"]
    assert acc[1][0] is None and acc[0][0] is not None and acc[1][1] is not None
    assert one["summary"]["acc"]["final"] == pytest.approx((acc[0][0] + acc[1][1]) / 2, abs=1e-3)
    none_run = continual_run(tiny_config, data, "none", 3, show_progress=False)
    none = none_run.execute()
    acc = none["matrices"]["acc"]
    assert acc[0][0] == acc[1][0]  # the same base model fine-tuned once per task
    # ... and its time counted once, though both rows list the shared cell A[.][0].
    cells = [read_work_file(none_run.layout.finetune_cell("base", k), "fine-tune result") for k in (0, 1)]
    phases = none["timing"]["phase_seconds"]
    assert phases["end_tasks"] == pytest.approx(sum(c["seconds"] for c in cells), abs=0.01)
    assert sum(phases.values()) <= none["timing"]["wall_seconds"] + 0.5
    assert none["trainable_parameters"] == 0
    # No DAP: the held-out losses after every "domain" are those of the base model.
    assert none["lm_loss"]["after_domain"][-1] == none["lm_loss"]["base"]


def test_no_dap_stages_take_the_base_evaluation_bit_for_bit(tiny_config, monkeypatch):
    from benchmark.engine import stages
    from benchmark.engine.evaluation import heldout_evaluation, heldout_features, representation_drift
    from benchmark.modeling import load_lm

    data = prepare_data(tiny_config)
    run = continual_run(tiny_config, data, "none", 3, show_progress=False)
    assert stages.serves_base_model(run.parts) and not stages.serves_base_model(
        continual_run(tiny_config, data, "ncl", 3, show_progress=False).parts
    )

    def measured(*args, **kwargs):
        raise AssertionError("a no-DAP stage measured its held-out sets again")

    monkeypatch.setattr(stages, "heldout_evaluation", measured)
    monkeypatch.setattr(stages, "heldout_features", measured)
    record = run.execute()
    # What measuring the stage's model (the base model) gives, number for number.
    model, _ = load_lm(tiny_config.model)
    own = heldout_evaluation(model, data.heldout_batches, "cpu")
    drift = representation_drift(run.base.features(), heldout_features(model, data.feature_batches(), "cpu"))
    for t in (0, 1):
        assert record["lm_loss"]["after_domain"][t] == own.losses
        assert record["representation"]["after_domain"][t] == drift
    assert record["lm_loss"]["chunks"]["after_domain"][1] == own.chunk_sums


def test_linear_probe_protocol_fills_the_matrix(tiny_config):
    config = dataclasses.replace(
        tiny_config, finetune=dataclasses.replace(tiny_config.finetune, protocol="linear_probe")
    )
    run = continual_run(config, prepare_data(config), "ncl", 3, show_progress=False)
    record = run.execute()
    acc = record["matrices"]["acc"]
    assert all(0 <= v <= 1 for v in (acc[0][0], acc[1][0], acc[1][1]))
    pair = read_work_file(run.layout.finetune_cell("row1", 0), "fine-tune result")
    assert pair["protocol"] == "linear_probe" and pair["n_train"] == 24
    assert record["config"]["finetune"]["protocol"] == "linear_probe"


def test_interrupted_run_resumes_and_matches_an_uninterrupted_one(tiny_config, tmp_path, monkeypatch):
    data = prepare_data(tiny_config)
    full = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()

    resumed_cfg = dataclasses.replace(tiny_config, work_dir=str(tmp_path / "resume-work"))
    original = NCL.after_domain

    def crash_on_second_domain(self, ctx):
        if ctx.index == 1:
            raise KeyboardInterrupt("simulated interruption")
        return original(self, ctx)

    monkeypatch.setattr(NCL, "after_domain", crash_on_second_domain)
    with pytest.raises(KeyboardInterrupt):
        continual_run(resumed_cfg, data, "ncl", 3, show_progress=False).execute()
    run_dir = next((tmp_path / "resume-work" / "runs").iterdir())
    assert (run_dir / "domain-0.json").exists() and not (run_dir / "domain-1.json").exists()
    assert not (run_dir / "checkpoint-1").exists()  # no half-written checkpoint
    first_mtime = (run_dir / "domain-0.json").stat().st_mtime_ns
    pair_mtime = (run_dir / "finetune" / "row0-task0.json").stat().st_mtime_ns
    kept_seconds = json.loads((run_dir / "elapsed.json").read_text())["seconds"]
    assert kept_seconds > 0

    monkeypatch.setattr(NCL, "after_domain", original)
    resumed = continual_run(resumed_cfg, data, "ncl", 3, show_progress=False).execute()
    assert (run_dir / "domain-0.json").stat().st_mtime_ns == first_mtime  # domain 0 skipped
    assert (run_dir / "finetune" / "row0-task0.json").stat().st_mtime_ns == pair_mtime  # fine-tune skipped
    assert resumed["matrices"] == full["matrices"]
    assert resumed["lm_loss"] == full["lm_loss"]
    # The record's wall time covers the kept work of both invocations, not only the resumed one.
    timing = resumed["timing"]
    assert timing["invocations"] == 2 and full["timing"]["invocations"] == 1
    assert timing["wall_seconds"] == pytest.approx(kept_seconds + timing["last_invocation_seconds"], abs=0.2)
    # The phases of the kept stages and cells are counted once, whichever invocation made them.
    kept_dap = sum(d["phase_seconds"]["dap"] for d in resumed["domains"])
    assert timing["phase_seconds"]["dap"] == pytest.approx(kept_dap, abs=0.1)


def test_phase_seconds_are_left_out_rather_than_partial():
    from benchmark.records.build import phase_seconds

    timed = {"phase_seconds": {"dap": 2.0, "heldout_evaluation": 1.0, "checkpoint": 0.5}}
    assert phase_seconds([timed, timed], 3.0, 4.0) == {
        "base_evaluation": 3.0,
        "dap": 4.0,
        "heldout_evaluation": 2.0,
        "checkpoint": 1.0,
        "end_tasks": 4.0,
    }
    assert phase_seconds([timed, {}], 3.0, 4.0) is None  # a stage made before phases were timed
    assert phase_seconds([timed], None, 4.0) is None
    assert phase_seconds([timed], 3.0, None) is None


def test_unknown_method_gets_did_you_mean(tiny_config):
    with pytest.raises(DapbenchError, match="unknown method 'nlc'.*did you mean 'ncl'"):
        continual_run(tiny_config, prepare_data(tiny_config), "nlc", 3)


def test_unknown_method_option_is_rejected(tiny_config):
    config = dataclasses.replace(tiny_config, method_options={"ncl": {"lambda": 1}})
    with pytest.raises(DapbenchError, match="unknown option"):
        continual_run(config, prepare_data(config), "ncl", 3)


def test_mlm_loss_matches_the_full_vocabulary_loss(tiny_model):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from benchmark.data.masking import MlmCollator
    from benchmark.modeling import mlm_loss

    model = AutoModelForMaskedLM.from_pretrained(tiny_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids = tokenizer(["the cat was very happy today and we left"] * 4, return_special_tokens_mask=True)
    batch = MlmCollator(tokenizer, 0.3, generator=torch.Generator().manual_seed(0), family=MASKED_LM)(
        [{k: torch.tensor(v[i]) for k, v in ids.items()} for i in range(4)]
    )
    labels = torch.full_like(batch["input_ids"], -100).view(-1)
    labels[batch["mlm_positions"]] = batch["mlm_targets"]
    with torch.no_grad():
        reference = model(input_ids=batch["input_ids"], labels=labels.view_as(batch["input_ids"])).loss
        assert mlm_loss(model, batch).item() == pytest.approx(reference.item(), rel=1e-5)


def test_packed_chunks_carry_no_attention_mask_and_train_as_with_an_all_ones_mask(tiny_model):
    """Full chunks go to the encoder without a mask (no mask built, no host check of an all-ones mask on a GPU): the
    loss, hidden states and gradients, dropout included, are bit-identical to an all-ones mask's."""
    from transformers import AutoTokenizer

    from benchmark.data.masking import MlmCollator
    from benchmark.modeling import load_lm, mlm_forward

    model, _ = load_lm(str(tiny_model))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids = tokenizer(["the cat was very happy today and we left"] * 4, return_special_tokens_mask=True)
    batch = MlmCollator(tokenizer, 0.3, generator=torch.Generator().manual_seed(0), family=MASKED_LM)(
        [{k: torch.tensor(v[i]) for k, v in ids.items()} for i in range(4)]
    )
    assert "attention_mask" not in batch
    model.train()
    results = []
    for inputs in (batch, {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}):
        torch.manual_seed(0)  # the same dropout masks
        loss, hidden, _ = mlm_forward(model, inputs)
        loss.backward()
        results.append([loss.detach(), hidden.detach(), *(p.grad.clone() for p in model.parameters())])
        model.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_heldout_batches_are_bit_identical_whatever_the_global_rng_did(tiny_config):
    import random

    import numpy as np

    torch.manual_seed(0)
    first = prepare_data(tiny_config)
    torch.manual_seed(1)
    torch.rand(1000)
    random.random()
    np.random.rand(7)
    second = prepare_data(tiny_config)
    assert first.heldout_batches.keys() == second.heldout_batches.keys()
    for name, batches in first.heldout_batches.items():
        for a, b in zip(batches, second.heldout_batches[name], strict=True):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert first.heldout_checksums() == second.heldout_checksums()


def test_base_losses_and_heldout_batches_are_identical_across_methods_of_a_group(tiny_config, tmp_path):
    data = prepare_data(tiny_config)
    records = []
    for method in ("ncl", "das", "hat"):
        torch.manual_seed(len(records))  # each method finds the global RNG in another state
        # each in its own work folder, so each measures the base model (no cache entry to copy)
        config = dataclasses.replace(tiny_config, work_dir=str(tmp_path / method))
        records.append(continual_run(config, data, method, 3, show_progress=False).execute())
    for record in records[1:]:
        assert record["lm_loss"]["base"] == records[0]["lm_loss"]["base"]
        assert record["lm_loss"]["batch_checksums"] == records[0]["lm_loss"]["batch_checksums"]
        assert record["representation"]["base_anisotropy"] == records[0]["representation"]["base_anisotropy"]


def _refuse_to_measure_the_base(monkeypatch):
    """Make the base model's evaluation fail if it is measured (not copied from the work folder's cache)."""
    import benchmark.engine.heldout as heldout

    def refuse(*args, **kwargs):
        raise AssertionError("the base model was evaluated again")

    monkeypatch.setattr(heldout, "load_lm", refuse)


def test_a_run_copies_the_base_evaluation_another_method_and_seed_measured(tiny_config, monkeypatch):
    """Issue #46: every run of a group evaluates the same base model on the same batches, so the second run of a work
    folder copies the first one's numbers (bit for bit) instead of measuring them again."""
    data = prepare_data(tiny_config)
    first = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    _refuse_to_measure_the_base(monkeypatch)
    run = continual_run(tiny_config, data, "das", 4, show_progress=False)
    second = run.execute()
    assert second["lm_loss"]["base"] == first["lm_loss"]["base"]
    assert second["lm_loss"]["batch_checksums"] == first["lm_loss"]["batch_checksums"]
    assert second["representation"]["base_anisotropy"] == first["representation"]["base_anisotropy"]
    copied = read_work_file(run.layout.base_losses, "base MLM-loss file")
    assert copied["measured_seconds"] > copied["seconds"] >= 0  # this run's time is the copy's; the measurement's kept


def test_an_edited_base_evaluation_cache_entry_is_measured_anew_to_the_same_numbers(tiny_config, capsys):
    from benchmark.engine.heldout import BaseEvaluationCache

    data = prepare_data(tiny_config)
    first = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    entry = BaseEvaluationCache.of(continual_run(tiny_config, data, "ncl", 3, show_progress=False).parts)
    stored = json.loads(entry.losses.read_text())
    stored["content"]["losses"]["alpha"] += 1.0  # a wrong number must never reach a record
    entry.losses.write_text(json.dumps(stored))
    second = continual_run(tiny_config, data, "das", 4, show_progress=False).execute()
    assert second["lm_loss"]["base"] == first["lm_loss"]["base"]
    assert "cache entry" in capsys.readouterr().err


def test_the_base_evaluation_cache_key_changes_with_what_moves_its_numbers(tiny_config):
    from benchmark.engine.heldout import base_evaluation_key

    data = prepare_data(tiny_config)
    parts = continual_run(tiny_config, data, "ncl", 3, show_progress=False).parts
    key = base_evaluation_key(parts)
    assert base_evaluation_key(continual_run(tiny_config, data, "das", 4, show_progress=False).parts) == key
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)  # another thread count can round the sums another way
        assert base_evaluation_key(parts) != key
    finally:
        torch.set_num_threads(threads)
    masked = dataclasses.replace(tiny_config, dap=dataclasses.replace(tiny_config.dap, mlm_probability=0.2))
    assert base_evaluation_key(continual_run(masked, prepare_data(masked), "ncl", 3, show_progress=False).parts) != key


def test_bf16_on_cpu_is_its_own_run_that_trains_under_autocast_and_evaluates_in_float32(tiny_config, tmp_path):
    """Issue #46: bf16 autocast on CPU is a named setting (``dap.mixed_precision=bf16``) with its own run id and
    group, never a silent change; fp16, the GPU default, stays float32 on CPU as before."""
    data = prepare_data(tiny_config)

    def run(precision: str, work: str):
        dap = dataclasses.replace(tiny_config.dap, mixed_precision=precision)
        config = dataclasses.replace(tiny_config, dap=dap, work_dir=str(tmp_path / work))
        return continual_run(config, data, "ncl", 3, show_progress=False)

    fp32 = run("no", "first")
    first = fp32.execute()
    fp16 = run("fp16", "fp16")
    assert fp16.parts.accelerator.mixed_precision == "no"
    bf16 = run("bf16", "bf16")
    assert bf16.parts.accelerator.mixed_precision == "bf16" and bf16.run_id != fp32.run_id
    second = bf16.execute()
    assert second["environment"]["mixed_precision"] == "bf16"
    assert second["lm_loss"]["base"] == first["lm_loss"]["base"]  # held-out evaluation stays float32
    assert [d["loss_log"] for d in second["domains"]] != [d["loss_log"] for d in first["domains"]]
    assert all(math.isfinite(v) for row in second["lm_loss"]["after_domain"] for v in row.values())
    again = run("no", "again").execute()  # the same process back in float32: the first run's numbers
    assert again["environment"]["mixed_precision"] == "no"
    assert [d["loss_log"] for d in again["domains"]] == [d["loss_log"] for d in first["domains"]]
    assert again["lm_loss"] == first["lm_loss"]


def test_record_carries_loss_metrics_and_representation_drift(tiny_config):
    record = continual_run(tiny_config, prepare_data(tiny_config), "ncl", 3, show_progress=False).execute()
    metrics = record["lm_loss"]["metrics"]
    base, after = record["lm_loss"]["base"], record["lm_loss"]["after_domain"]
    assert metrics["plasticity"] == pytest.approx(
        ((base["alpha"] - after[0]["alpha"]) + (base["beta"] - after[1]["beta"])) / 2
    )
    assert metrics["forgetting"] == pytest.approx(after[1]["alpha"] - after[0]["alpha"])
    drift = record["representation"]["after_domain"]
    assert len(drift) == 2 and set(drift[0]) == {"alpha", "beta", "general", "all"}
    for stage in drift:
        assert 0 < stage["all"]["cka_to_base"] <= 1 + 1e-9 and -1 <= stage["all"]["cosine_to_base"] <= 1
        assert -1 <= stage["all"]["anisotropy"] <= 1


def test_loader_workers_change_no_number_and_not_the_run_id(tiny_config, tmp_path):
    """Every micro-batch is masked from its own seed, so masking in worker processes trains the same model."""
    records = []
    for workers in (0, 2):
        config = dataclasses.replace(
            tiny_config,
            work_dir=str(tmp_path / f"work{workers}"),
            dap=dataclasses.replace(tiny_config.dap, loader_workers=workers),
        )
        records.append(continual_run(config, prepare_data(config), "das", 3, show_progress=False).execute())
    serial, parallel = records
    assert serial["run_id"] == parallel["run_id"]
    assert serial["lm_loss"] == parallel["lm_loss"] and serial["matrices"] == parallel["matrices"]
    assert [d["loss_log"] for d in serial["domains"]] == [d["loss_log"] for d in parallel["domains"]]


def test_fused_adamw_is_chosen_on_cuda_only_and_takes_the_same_steps(tiny_model):
    """The fused AdamW used on CUDA takes the for-each implementation's steps (checked with the CPU fused kernel)."""
    from transformers import AutoModelForMaskedLM

    from benchmark.acceleration.fused import fused_adamw
    from benchmark.config import DapConfig
    from benchmark.engine.optimizers import build_optimizer

    assert fused_adamw("cuda", "bf16") and fused_adamw(torch.device("cuda", 1)) and not fused_adamw("cpu")
    assert not fused_adamw("cuda", "fp16"), "under fp16 accelerate must still see an overflowed step skipped"
    dap = DapConfig(weight_decay=0.01)
    models = [AutoModelForMaskedLM.from_pretrained(tiny_model) for _ in range(2)]
    optimizers = [
        build_optimizer(list(m.named_parameters()), dap, fused=f) for m, f in zip(models, (False, True), strict=True)
    ]
    assert optimizers[1].defaults["fused"] and not optimizers[0].defaults["fused"]
    ids = torch.randint(5, 600, (4, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        for model, optimizer in zip(models, optimizers, strict=True):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    start = AutoModelForMaskedLM.from_pretrained(tiny_model).state_dict()
    moved = [name for name, p in models[1].named_parameters() if not torch.equal(p.detach(), start[name])]
    assert len(moved) == len(list(models[1].parameters())), "every parameter took a step"


def test_a_run_started_before_the_losses_were_renamed_resumes_to_the_same_record(tiny_config):
    """Stage progress files written by the code before schema 4 name the held-out losses ``mlm_loss``; a run resumed
    by this code reads them under their names of now and builds the same record."""
    from benchmark.engine.workfiles import write_work_file

    data = prepare_data(tiny_config)
    run = continual_run(tiny_config, data, "ncl", 3, show_progress=False)
    fresh = run.execute()
    for t in run.parts.schedule.stages():
        path = run.parts.layout.domain_done(t)
        stats = read_work_file(path, "domain progress file")
        old = {{"lm_loss": "mlm_loss", "lm_loss_chunks": "mlm_loss_chunks"}.get(k, k): v for k, v in stats.items()}
        assert "mlm_loss" in old and "mlm_loss_chunks" in old
        write_work_file(path, old)
    resumed = continual_run(tiny_config, data, "ncl", 3, show_progress=False).execute()
    assert resumed["lm_loss"] == fresh["lm_loss"]
    assert [d["lm_loss"] for d in resumed["domains"]] == [d["lm_loss"] for d in fresh["domains"]]
