import dataclasses
import json

import pytest
import torch

from benchmark.data.corpora import load_corpus, read_corpus_lines
from benchmark.data.endtasks import Example, load_end_task, repartition
from benchmark.data.suite import load_suite
from benchmark.errors import DapbenchError
from benchmark.families import MASKED_LM
from tests.conftest import SHARED_DATA, requires_shared_data

PAPER_SIZES = {
    "restaurant_sup": (3452, 1120),
    "phone_sup": (239, 553),
    "camera_sup": (230, 626),
    "aclarc_sup": (1520, 421),
    "scierc_sup": (2260, 2388),
    "chemprot_sup": (2667, 7398),
}


@requires_shared_data()
@pytest.mark.parametrize("task", sorted(PAPER_SIZES))
def test_paper_split_sizes_on_the_real_release(task):
    suite = load_suite()
    data = load_end_task(suite.end_tasks[task], SHARED_DATA)
    assert (len(data.train), len(data.test)) == PAPER_SIZES[task]
    assert all(0 <= ex.label < len(data.labels) for ex in data.train + data.test)


@requires_shared_data()
def test_asc_examples_carry_the_aspect():
    data = load_end_task(load_suite().end_tasks["restaurant_sup"], SHARED_DATA)
    assert data.train[0].aspect == "server" and data.train[0].text.startswith("Our server")


def test_repartition_moves_the_first_k_of_each_label():
    train = [Example(str(i), label) for i, label in enumerate([0, 1, 0, 1, 0, 1, 0, 0, 1, 1])]
    new_train, new_test = repartition(train, [], num_labels=2, train_ratio=0.6)
    # k = int((10 * 0.4) // 2) = 2 per label: texts 0, 2 (label 0) and 1, 3 (label 1)
    assert [ex.text for ex in new_test] == ["0", "2", "1", "3"]
    assert len(new_train) == 6


def test_sequences_named_and_custom():
    suite = load_suite()
    assert suite.sequence("seq0") == ("restaurant", "acl", "ai", "phone", "pubmed", "camera")
    assert suite.sequence("camera,acl") == ("camera", "acl")
    with pytest.raises(DapbenchError, match="unknown sequence"):
        suite.sequence("restaurant,mars")


def test_missing_data_root_is_a_clear_error(tmp_path):
    with pytest.raises(DapbenchError, match="data root not found.*\n.*fix: pass --data-root"):
        load_end_task(load_suite().end_tasks["aclarc_sup"], tmp_path / "nowhere")


def test_missing_data_root_setting_is_a_clear_error():
    with pytest.raises(DapbenchError, match="DAPBENCH_DATA"):
        load_end_task(load_suite().end_tasks["aclarc_sup"], None)


def _write_jsonl(folder, name, rows):
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_unknown_label_names_the_label_and_file(tmp_path):
    _write_jsonl(
        tmp_path,
        "citation_intent/train.jsonl",
        [{"text": "x", "label": "Uses"}, {"text": "y", "label": "Bogus"}],
    )
    _write_jsonl(tmp_path, "citation_intent/test.jsonl", [])
    _write_jsonl(tmp_path, "citation_intent/dev.jsonl", [])
    with pytest.raises(DapbenchError, match="unknown label 'Bogus'.*train.jsonl"):
        load_end_task(load_suite().end_tasks["aclarc_sup"], tmp_path)


def test_corrupt_end_task_file_is_a_clear_error(tmp_path):
    (tmp_path / "SemEval14-res").mkdir()
    (tmp_path / "SemEval14-res" / "train.json").write_text('{"1": {"term": "x", ')
    with pytest.raises(DapbenchError, match="corrupt file .*train.json"):
        load_end_task(load_suite().end_tasks["restaurant_sup"], tmp_path)


def test_wrong_split_sizes_fail_loudly(tmp_path):
    for split in ("train", "test", "dev"):
        _write_jsonl(tmp_path, f"citation_intent/{split}.jsonl", [{"text": "x", "label": "Uses"}] * 3)
    with pytest.raises(DapbenchError, match="differ from the paper's"):
        load_end_task(load_suite().end_tasks["aclarc_sup"], tmp_path)


def test_empty_corpus_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(DapbenchError, match="is empty"):
        read_corpus_lines(str(empty))


def test_corpus_packing_holds_out_the_first_lines(world_root, tiny_model, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    corpus = load_corpus("alpha", str(world_root / "alpha.txt"), tokenizer, 32, 0.05, None, tmp_path, MASKED_LM)
    assert corpus.train[0]["input_ids"].shape == (32,)
    heldout_text = read_corpus_lines(str(world_root / "alpha.txt"))[:5]
    first_ids = tokenizer(heldout_text[0])["input_ids"][:32]
    assert corpus.heldout[0]["input_ids"].tolist()[: len(first_ids)] == first_ids[:32]
    again = load_corpus("alpha", str(world_root / "alpha.txt"), tokenizer, 32, 0.05, None, tmp_path, MASKED_LM)
    assert len(again.train) == len(corpus.train)  # served from the cache


def _tiny_recipe(monkeypatch, tmp_path, lines: list[str], spec):
    """Register recipe ``tiny``: ``spec`` trained on ``lines`` written under a temporary shared folder."""
    import benchmark.config
    from benchmark.data import bases

    shared = tmp_path / "shared"
    (shared / "text").mkdir(parents=True)
    (shared / "text" / "general.txt").write_text("".join(f"{line}\n" for line in lines))
    monkeypatch.setattr(bases, "RECIPES", {"tiny": bases.Recipe("text/general.txt", spec, "a tiny test decoder")})
    monkeypatch.setattr(benchmark.config, "shared_root", lambda: shared)
    return bases


def test_a_recipe_base_model_is_built_once_and_a_missing_corpus_is_named(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    from benchmark.data.pretrain import BaseModelSpec

    lines = [f"line {i} of the general text says the {w} thing ." for i in range(300) for w in ("same", "other")]
    spec = BaseModelSpec(
        vocab_size=200,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        intermediate_size=32,
        seq_len=16,
        steps=2,
        batch_size=4,
        causal=True,
        kv_heads=1,
    )
    bases = _tiny_recipe(monkeypatch, tmp_path, lines, spec)
    said: list[str] = []
    first = bases.build_recipe("recipe:tiny", tmp_path / "work", echo=said.append)
    again = bases.build_recipe("recipe:tiny", tmp_path / "work", echo=said.append)
    assert first == again and len(said) == 1  # cached: built on first use only
    assert AutoModelForCausalLM.from_pretrained(first).config.num_key_value_heads == 1
    numerics = json.loads((first / "pretraining.json").read_text())["numerics"]
    assert numerics == bases.pinned_numerics_env()  # the child process built with the pinned arithmetic
    monkeypatch.setattr(bases, "RECIPES", {"tiny": bases.Recipe("text/missing.txt", spec, "no corpus")})
    with pytest.raises(DapbenchError, match="corpus of recipe 'tiny' is missing"):
        bases.build_recipe("recipe:tiny", tmp_path / "other-work")
    with pytest.raises(DapbenchError, match="unknown base-model recipe"):
        bases.build_recipe("recipe:nothing", tmp_path / "work")


def test_the_pinned_numerics_fix_the_kernels_on_x86_and_the_threads_everywhere():
    from benchmark.data.bases import pinned_numerics_env

    x86 = pinned_numerics_env("x86_64")
    assert x86["ATEN_CPU_CAPABILITY"] == "avx2" and x86["MKL_CBWR"] == "AVX2,STRICT"
    assert pinned_numerics_env("aarch64") == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert x86["OMP_NUM_THREADS"] == x86["MKL_NUM_THREADS"] == "1"


def test_a_recipe_base_model_has_the_same_weights_whatever_instruction_set_the_calling_process_asks_for(
    monkeypatch, tmp_path
):
    from benchmark.data.pretrain import BaseModelSpec
    from benchmark.records.identity import FileHashCache, model_checksum

    lines = [f"passage {i} tells of the {w} river and {i % 7} hills ." for i in range(400) for w in ("north", "far")]
    spec = BaseModelSpec(
        vocab_size=300,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=64,
        seq_len=32,
        steps=6,
        batch_size=8,
        causal=True,
        kv_heads=2,
    )
    bases = _tiny_recipe(monkeypatch, tmp_path, lines, spec)
    checksums = set()
    for asked in ("avx512", "default"):
        # the caller's environment asks for other kernels; the build's child must not inherit that
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", asked)
        built = bases.build_recipe("recipe:tiny", tmp_path / f"work-{asked}", echo=lambda _: None)
        checksums.add(model_checksum(str(built), FileHashCache(tmp_path / f"hashes-{asked}.json")))
    assert len(checksums) == 1


def test_the_synthetic_base_model_is_built_with_pinned_arithmetic_whatever_threads_the_run_has(
    world_root, monkeypatch, tmp_path
):
    """The synthetic profile's base model is built in a pinned child (one thread, AVX2 kernels), so a run at two
    threads and one at one build the same weights, and the tokenizer covers the domain corpora as well."""
    from transformers import AutoTokenizer

    from benchmark.data import synthetic
    from benchmark.data.bases import pretrain_pinned
    from benchmark.records.identity import FileHashCache, model_checksum

    spec = dataclasses.replace(
        synthetic.synthetic_base_spec(MASKED_LM), vocab_size=400, hidden_size=16, steps=4, batch_size=8
    )
    general, vocabulary = synthetic.synthetic_base_corpora(world_root)
    checksums = set()
    for threads in ("1", "2"):
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        out = tmp_path / f"base-{threads}"
        pretrain_pinned(general, out, spec, vocabulary)
        checksums.add(model_checksum(str(out), FileHashCache(tmp_path / f"hashes-{threads}.json")))
    assert len(checksums) == 1
    domain_only = {w for w in (world_root / "alpha.txt").read_text().split()} - set(general.read_text().split())
    vocab = AutoTokenizer.from_pretrained(tmp_path / "base-1").get_vocab()
    assert domain_only and any(w.lower() in vocab for w in domain_only)  # the vocabulary read the domain text too


def test_a_failed_recipe_build_is_named_and_caches_nothing(monkeypatch, tmp_path):
    from benchmark.data.pretrain import BaseModelSpec

    spec = BaseModelSpec(
        vocab_size=50,
        hidden_size=8,
        num_layers=1,
        num_heads=2,
        intermediate_size=16,
        seq_len=8,
        steps=2,
        batch_size=2,
        causal=True,
    )
    bases = _tiny_recipe(monkeypatch, tmp_path, [], spec)  # an empty corpus: nothing to train on
    with pytest.raises(DapbenchError, match="building the base model 'tiny' failed"):
        bases.build_recipe("recipe:tiny", tmp_path / "work", echo=lambda _: None)
    assert not [p for p in (tmp_path / "work" / "bases").iterdir() if not p.name.endswith(".lock")]


def test_a_rounded_recipe_builds_the_same_files_from_the_float32_model_and_from_a_half_precision_copy(
    monkeypatch, tmp_path
):
    from safetensors.torch import load_file, save_file

    import benchmark.config
    from benchmark.data import bases
    from benchmark.records.identity import FileHashCache, model_checksum

    tensors = {"w": torch.randn(5, 7, generator=torch.Generator().manual_seed(0)), "ids": torch.arange(4)}
    for name, cast in (("full", lambda t: t), ("half", lambda t: t.half() if t.is_floating_point() else t)):
        folder = tmp_path / name / "models" / "m"
        folder.mkdir(parents=True)
        save_file({k: cast(v) for k, v in tensors.items()}, folder / "model.safetensors")
        (folder / "config.json").write_text('{"model_type": "bert"}')
    monkeypatch.setattr(bases, "RECIPES", {"m-half": bases.Rounded("models/m", "float16", "a test model")})
    built = {}
    for name in ("full", "half"):
        monkeypatch.setattr(benchmark.config, "shared_root", lambda name=name: tmp_path / name)
        built[name] = bases.build_recipe("recipe:m-half", tmp_path / f"work-{name}", echo=lambda _: None)
    checksums = {model_checksum(str(d), FileHashCache(tmp_path / f"hashes-{n}.json")) for n, d in built.items()}
    assert len(checksums) == 1  # byte-identical wherever it is built from
    rounded = load_file(built["full"] / "model.safetensors")
    assert rounded["w"].dtype == torch.float32 and torch.equal(rounded["w"], tensors["w"].half().float())
    assert torch.equal(rounded["ids"], tensors["ids"]) and (built["full"] / "config.json").is_file()
    monkeypatch.setattr(benchmark.config, "shared_root", lambda: tmp_path / "nowhere")
    with pytest.raises(DapbenchError, match="model of recipe 'm-half' is missing"):
        bases.build_recipe("recipe:m-half", tmp_path / "work-new", echo=lambda _: None)


def test_a_table_is_read_in_slices_with_the_rows_a_row_by_row_read_gives():
    from datasets import Dataset

    from benchmark.data.masking import table_rows

    ids = torch.arange(60).reshape(10, 6)
    table = Dataset.from_dict({"input_ids": ids.tolist(), "special_tokens_mask": (ids % 5 == 0).long().tolist()})
    table = table.with_format("torch")
    rows = table_rows(table, 2, 7)
    assert len(rows) == 5
    for got, want in zip(rows, (table[i] for i in range(2, 7)), strict=True):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    assert table_rows([{"a": 1}, {"a": 2}, {"a": 3}], 1, 3) == [{"a": 2}, {"a": 3}]


def test_each_built_in_task_file_declares_the_epochs_the_fine_tune_defaults_to():
    """Issue #87: a task's facts live in its file; ``finetune.epochs``'s default is read from them, unchanged."""
    from benchmark.config import FinetuneConfig
    from benchmark.data.suite import load_suite

    suite = load_suite(None)
    assert FinetuneConfig().epochs == {name: spec.paper_epochs for name, spec in suite.end_tasks.items()}
    assert FinetuneConfig().epochs == {
        "restaurant_sup": 5,
        "aclarc_sup": 10,
        "scierc_sup": 5,
        "phone_sup": 15,
        "chemprot_sup": 10,
        "camera_sup": 15,
    }  # the paper's (reference utils/model.py:345-352), in the suite's order: committed run ids keep their hashes
    assert list(FinetuneConfig().epochs) == [suite.domains[d].end_task for d in suite.domains]
