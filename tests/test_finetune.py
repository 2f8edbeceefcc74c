import dataclasses
import random

import numpy as np
import pytest
import torch

from benchmark.config import FinetuneConfig
from benchmark.data.endtasks import EncodedTask
from benchmark.errors import DapbenchError
from benchmark.protocols import get_protocol
from benchmark.protocols.finetune import _train_loader
from benchmark.protocols.linear_probe import encoder_features, probe_and_evaluate


def _features(n: int) -> list[dict]:
    rng = random.Random(0)
    return [{"input_ids": [1] * rng.randint(5, 120), "index": i} for i in range(n)]


def _padded_tokens(loader) -> int:
    return sum(max(len(f["input_ids"]) for f in batch) * len(batch) for batch in loader)


def test_length_grouped_batches_cover_every_example_once_and_pad_less():
    features = _features(240)
    cfg = FinetuneConfig(batch_size=16)

    def epoch(grouped: bool) -> list[list[dict]]:
        torch.manual_seed(7)
        loader = _train_loader(features, dataclasses.replace(cfg, group_by_length=grouped), collator=list)
        return list(loader)

    uniform, grouped = epoch(False), epoch(True)
    assert sorted(f["index"] for batch in grouped for f in batch) == list(range(240))
    assert [len(b) for b in grouped] == [len(b) for b in uniform]
    # Similar lengths per batch: well under the padding of uniformly shuffled batches.
    assert _padded_tokens(grouped) < 0.8 * _padded_tokens(uniform)
    # Seeded by the global RNG like the uniform loader: the same seed gives the same batches.
    assert [[f["index"] for f in b] for b in epoch(True)] == [[f["index"] for f in b] for b in grouped]


def _pad(batch: list[dict]) -> dict:
    width = max(len(f["input_ids"]) for f in batch)
    ids = [f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in batch]
    mask = [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in batch]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def _classifier():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24, num_labels=2
    )
    return BertForSequenceClassification(config)


def test_probe_features_ignore_padding_and_keep_the_input_order():
    model = _classifier()
    features = [{"input_ids": [2, 7, 9, 3]}, {"input_ids": [2] + [11] * 20 + [3]}, {"input_ids": [2, 5, 3]}]
    together = encoder_features(model, features, _pad, batch_size=3, device="cpu")
    alone = np.stack([encoder_features(model, [f], _pad, batch_size=1, device="cpu")[0] for f in features])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_linear_probe_separates_a_separable_task_and_leaves_the_model_untouched(tiny_model):
    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=2)
    before = {n: p.clone() for n, p in model.state_dict().items()}

    def examples(n: int) -> list[dict]:
        # class 0 repeats one word, class 1 another: mean-pooled features are linearly separable
        rng = random.Random(n)
        out = []
        for i in range(n):
            word = "alpha" if i % 2 == 0 else "beta"
            ids = tokenizer(" ".join([word] * rng.randint(3, 8)))["input_ids"]
            out.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": i % 2})
        return out

    train, test = examples(40), examples(20)
    task = EncodedTask("toy", 2, train, test, [f["labels"] for f in test])
    settings = get_protocol("linear_probe").settings_of(FinetuneConfig(protocol="linear_probe"))
    result = probe_and_evaluate(model, task, tokenizer, settings, Accelerator(cpu=True))
    assert result["acc"] == 1.0 and result["protocol"] == "linear_probe"
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())


def test_an_end_task_classifier_is_fp32_even_from_a_bf16_checkpoint(tiny_model, tmp_path):
    import shutil

    from transformers import AutoModelForMaskedLM

    from benchmark.modeling import classifier_from_checkpoint

    stored = tmp_path / "bf16"
    shutil.copytree(tiny_model, stored)
    AutoModelForMaskedLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(stored)
    assert AutoModelForMaskedLM.from_pretrained(stored).dtype == torch.bfloat16  # what transformers 5 loads by itself
    classifier = classifier_from_checkpoint(stored, num_labels=3)
    assert {p.dtype for p in classifier.parameters()} == {torch.float32}  # fine-tuned in fp32, as DAP trains


def _beside(config, protocol: str, beside: str | None):
    finetune = dataclasses.replace(config.finetune, protocol=protocol, beside=beside)
    return dataclasses.replace(config, finetune=finetune)


def test_a_protocol_beside_scores_every_cell_again_without_moving_the_runs_own_numbers(tiny_config, tmp_path):
    """Issue #46: ``finetune.beside`` fine-tunes the diagonal and last row the linear probe scores, from the same
    checkpoints; the probe's numbers are those of a run without it, and the record checks both sets against their
    predictions."""
    from benchmark.api import continual_run
    from benchmark.data.inputs import prepare_data
    from benchmark.records.checks import check_record
    from benchmark.records.reproduce import Tolerance, compare_records, key_numbers

    data = prepare_data(tiny_config)
    alone = continual_run(_beside(tiny_config, "linear_probe", None), data, "ncl", 3, show_progress=False).execute()
    both_config = dataclasses.replace(_beside(tiny_config, "linear_probe", "finetune"), work_dir=str(tmp_path / "b"))
    run = continual_run(both_config, data, "ncl", 3, show_progress=False)
    both = run.execute()
    assert both["run_id"] != alone["run_id"]
    assert both["matrices"] == alone["matrices"] and both["predictions"] == alone["predictions"]
    assert both["lm_loss"] == alone["lm_loss"]
    fine_tuned = both["end_tasks_beside"]["finetune"]
    assert set(fine_tuned["predictions"]) == set(both["predictions"]) == {"0/0", "1/0", "1/1"}  # two domains: all
    assert fine_tuned["summary"]["macro_f1"]["final"] is not None
    assert (run.layout.root / "finetune" / "row1-task1-finetune.json").is_file()
    check_record(both)
    assert compare_records(both, both, Tolerance(score=0.0, loss=0.0)) == []  # reproduce classifies every number
    assert any(name.startswith("end_tasks_beside/finetune/matrices/") for name in key_numbers(both))
    fine_tuned["matrices"]["acc"][1][1] = 1.5 - fine_tuned["matrices"]["acc"][1][1]  # an edited beside score
    with pytest.raises(DapbenchError, match=r"end_tasks_beside\.finetune\.matrices\.acc\[1\]\[1\]"):
        check_record(both)


@pytest.mark.parametrize(
    ("beside", "message"),
    [("linear_probe", "is the run's protocol already"), ("nope", "invalid finetune.beside='nope'")],
)
def test_a_protocol_beside_that_cannot_be_is_refused_by_name_before_any_work(tiny_config, beside, message):
    from benchmark.api import validate_config

    with pytest.raises(DapbenchError, match=message) as caught:
        validate_config(_beside(tiny_config, "linear_probe", beside))
    assert caught.value.fix


def test_the_leaderboard_sets_fine_tuned_cells_against_the_probe_and_against_no_dap(world_root, tiny_model, tmp_path):
    """The group's section on the protocol beside its own: per method both final macro-F1s, their gap, and the
    fine-tuned score against ``none`` with a seed-bootstrap interval, on the leaderboard and the site."""
    from conftest import TINY_DAP, TINY_FINETUNE, world_config

    from benchmark.api import continual_run
    from benchmark.data.inputs import prepare_data
    from benchmark.io import atomic_write_json
    from benchmark.report.beside import final_macro_f1
    from benchmark.report.frame import backbone_flag
    from benchmark.report.writer import write_report

    world = world_config(world_root, tiny_model, tmp_path, TINY_DAP, TINY_FINETUNE)
    config = _beside(world, "linear_probe", "finetune")
    data = prepare_data(config)
    records = [
        continual_run(config, data, method, seed, show_progress=False).execute()
        for method in ("none", "ncl")
        for seed in (1, 2)
    ]
    for record in records:
        atomic_write_json(tmp_path / "results" / "beside" / f"{record['run_id']}.json", record)
    write_report(tmp_path)
    board = (tmp_path / "leaderboard.md").read_text()
    section = board[board.index("### End tasks: fine-tune beside the linear probe") :]
    ncl = [r for r in records if r["method"] == "ncl"]
    probe = np.mean([final_macro_f1(r) for r in ncl])
    tuned = np.mean([final_macro_f1(r, "finetune") for r in ncl])
    row = next(line for line in section.splitlines() if line.startswith("| `ncl` |"))
    assert f"| {probe:.2f} ± " in row and f"| {tuned:.2f} ± " in row and f"| {tuned - probe:.2f} ± " in row
    # the tiny world's fine-tuned heads may collapse: then the section says why it states no verdict
    collapsed = any(backbone_flag([r], "finetune") for r in records)
    assert ("No verdict for" in section) if collapsed else ("beyond seed noise" in section)
    assert "beside it, fine-tuning" in board
    (page,) = (tmp_path / "results" / "report" / "site").glob("group-*.html")
    page = page.read_text()
    assert "fine-tune beside the linear probe" in page
    beside = page[page.index('<section class="beside">') :]
    assert "<table>" in beside[: beside.index("</section>")]  # its table drawn as one, not as a paragraph of pipes


def _beside_record(label: str, tuned: float, probe: float = 0.45) -> dict:
    """A record reduced to what the fine-tune-beside section reads: its row, protocol and both final macro-F1s."""
    return {
        "method_label": label,
        "config": {"finetune": {"protocol": "linear_probe"}},
        "summary": {"macro_f1": {"final": probe}},
        "end_tasks_beside": {"finetune": {"summary": {"macro_f1": {"final": tuned}}}},
    }


def _row(lines: list[str], label: str) -> str:
    return next(line for line in lines if line.startswith(f"| `{label}` |"))


def test_a_row_of_one_seed_is_never_resolved_against_no_dap_on_the_protocol_beside():
    """One seed has no seed noise to resample: its interval against ``none`` would show ``none``'s noise alone, so the
    row gets its difference without an interval and is not named as beating no DAP; two seeds a side are compared."""
    from benchmark.report.beside import _section

    records = [{**_beside_record("none", t), "seed": s} for s, t in enumerate((0.33, 0.35, 0.38))]
    records.append({**_beside_record("ncl", 0.40), "seed": 0})
    lines = _section(records, "finetune")
    assert _row(lines, "ncl").endswith("| +4.67 (one seed: seed noise not measured) |")
    assert "No method beats `none` on fine-tuned end tasks beyond seed noise." in lines
    records.append({**_beside_record("ncl", 0.42), "seed": 1})  # a second seed: compared, and resolved above
    lines = _section(records, "finetune")
    assert " resolved |" in _row(lines, "ncl")
    assert "Beating `none` on fine-tuned end tasks beyond seed noise: `ncl`." in lines


def test_a_rows_interval_against_no_dap_does_not_move_when_another_row_is_added():
    """A row's comparison with ``none`` is its own paired test: a row added (here listed first) leaves every other
    row's difference and interval as they were, to the last digit; only the family's q-values take the new row in."""
    from benchmark.report.beside import _section, beside_rows

    def seeded(label: str, scores: tuple[float, ...]) -> list[dict]:
        return [{**_beside_record(label, t), "seed": s} for s, t in enumerate(scores)]

    records = seeded("none", (0.311, 0.334, 0.352, 0.379, 0.363)) + seeded("ncl", (0.362, 0.401, 0.433, 0.471))
    before = {row.label: row for row in beside_rows(records, "finetune")}
    grown = records + seeded("one", (0.502, 0.547, 0.519))
    after = {row.label: row for row in beside_rows(grown, "finetune")}
    lines = _section(grown, "finetune")
    assert lines.index(_row(lines, "one")) < lines.index(_row(lines, "ncl"))
    assert after["ncl"].versus == before["ncl"].versus and after["ncl"].test == before["ncl"].test


def test_the_short_answer_states_what_the_fine_tuned_end_tasks_of_a_rung_say_against_no_dap():
    """A rung that fine-tunes beside its probe adds a line to the short answer: whether a row beats ``none`` beyond
    seed noise (else the closest row of two seeds or more, never a one-seed row), the rows resolved below it with
    their intervals, and the range of the fine-tune-minus-probe gap over rows; the summary says it in a clause."""
    from types import SimpleNamespace

    from benchmark.report.answer import _beside_line, _end_task_sentence
    from benchmark.report.beside import beside_rows

    def seeded(label: str, scores: tuple[float, ...], probe: float = 0.45) -> list[dict]:
        return [{**_beside_record(label, t, probe), "seed": n} for n, t in enumerate(scores)]

    records = seeded("none", (0.33, 0.35, 0.38)) + seeded("ncl", (0.34, 0.37)) + seeded("hat", (0.20, 0.22), 0.50)
    records += seeded("kd", (0.60,))  # one seed: far above, yet neither closest nor beating
    rung = SimpleNamespace(steps=288, stats=SimpleNamespace(records=records))
    line = _beside_line(rung, "finetune")
    rows = {row.label: row for row in beside_rows(records, "finetune")}
    ncl, hat = rows["ncl"].versus, rows["hat"].versus
    assert line.startswith("at 288 updates per domain the end tasks are also fine-tuned (1-3 seeds per row;")
    assert f"no method beats no DAP (`none`) beyond seed noise (closest: `ncl` {ncl[0]:+.2f} [" in line
    assert f"; below it: `hat` {hat[0]:+.2f} [{hat[1]:+.2f}, {hat[2]:+.2f}] points" in line and hat[2] < 0
    assert line.endswith("; fine-tuned minus probe macro-F1: +15.00 (`kd`) to -29.00 (`hat`) points")
    stats = SimpleNamespace(records=records, comparisons=lambda reference, column: [])  # the probe: nothing resolved
    said = _end_task_sentence(stats, "none", rung)
    assert said == (
        "On the end tasks, no method's score (linear probe) is separated from no DAP (`none`) at that budget;"
        " fine-tuned at 288 updates per domain, no method beats it beyond seed noise and `hat` scores below it."
    )
    records += [{**_beside_record("kd", 0.61), "seed": 1}]  # a second seed: now compared, and resolved above
    assert "above no DAP (`none`) beyond seed noise: `kd`; below it: `hat`" in _beside_line(rung, "finetune")
    assert "fine-tuned at 288 updates per domain, `kd` beats it beyond seed noise and `hat` scores below it." in (
        _end_task_sentence(stats, "none", rung)
    )


def test_compiled_fine_tuning_compiles_every_block_and_predicts_as_the_plain_one(tiny_model):
    """``finetune.compile``: the classifier's blocks run through compiled graphs (inputs of several lengths, train
    and eval modes) and the fine-tuned model predicts what the plain fine-tune predicts."""
    from accelerate import Accelerator
    from torch._dynamo.utils import counters
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from benchmark.acceleration.sharding import transformer_blocks
    from benchmark.protocols.finetune import finetune_and_evaluate

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rng = random.Random(0)
    examples = []
    for i in range(24):
        ids = tokenizer(" ".join(["alpha" if i % 2 else "beta"] * rng.randint(2, 9)))["input_ids"]
        examples.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": i % 2})
    task = EncodedTask("toy", 2, examples[:16], examples[16:], [f["labels"] for f in examples[16:]])
    results, models = {}, {}
    torch._dynamo.reset()  # graphs an earlier test compiled for the same tiny blocks would be reused, not counted
    for compiled in (False, True):
        torch.manual_seed(0)
        models[compiled] = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=2)
        cfg = get_protocol("finetune").settings_of(FinetuneConfig(batch_size=4, default_epochs=2, compile=compiled))
        counters.clear()
        results[compiled] = finetune_and_evaluate(models[compiled], task, tokenizer, cfg, 1, Accelerator(cpu=True))
    assert all(block._compiled_call_impl is not None for block in transformer_blocks(models[True]))
    assert counters["stats"]["unique_graphs"] >= 2  # at least one training and one evaluation graph
    assert results[True]["predictions"] == results[False]["predictions"]
    # the next fine-tune (a fresh classifier of the same blocks: the run's next cell) compiles nothing again
    torch.manual_seed(0)
    again = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=2)
    counters.clear()
    repeated = finetune_and_evaluate(again, task, tokenizer, cfg, 1, Accelerator(cpu=True))
    assert counters["stats"]["unique_graphs"] == 0 and repeated["predictions"] == results[True]["predictions"]
