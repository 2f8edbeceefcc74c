"""Run identity hashes what determines a run's numbers: contents, not paths (benchmark.records.identity)."""

import dataclasses
import json
import shutil

from conftest import TINY_BASE

from benchmark.api import planned_run_ids
from benchmark.config import apply_overrides


def _ids(config, methods=("ncl", "das")) -> dict:
    return planned_run_ids(dataclasses.replace(config, methods=methods))


def test_locations_do_not_change_the_run_id(tiny_config, tmp_path):
    before = _ids(tiny_config)
    moved_model = tmp_path / "elsewhere" / "model"
    shutil.copytree(tiny_config.model, moved_model)  # the same files at another path (another checkout)
    (moved_model / "pretraining.json").write_text("{}")  # a training report is not part of the model
    moved = dataclasses.replace(
        tiny_config,
        model=str(moved_model) + "/",
        output_dir=str(tmp_path / "other-out"),
        work_dir=str(tmp_path / "other-work"),
        sequence="alpha, beta",
        profile="mini",
    )
    assert _ids(moved) == before


def test_a_method_option_changes_only_that_methods_id(tiny_config):
    before = _ids(tiny_config)
    after = _ids(apply_overrides(tiny_config, ["das.fidelity=reference"]))
    seed = tiny_config.seeds[0]
    assert after[("ncl", seed)] == before[("ncl", seed)]
    assert after[("das", seed)] != before[("das", seed)]
    assert _ids(apply_overrides(tiny_config, ["dap.steps=5"]))[("ncl", seed)] != before[("ncl", seed)]


def test_changed_input_contents_give_a_new_id(tiny_config, world_root, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(world_root, data)
    config = dataclasses.replace(tiny_config, data_root=str(data), general_heldout=str(data / "general_heldout.txt"))
    original = _ids(config, ("ncl",))
    assert original == _ids(tiny_config, ("ncl",))  # a copy of the data is the same data

    train = data / "alpha_train.jsonl"
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    other = next(r["label"] for r in rows if r["label"] != rows[0]["label"])
    rows[0]["label"] = other
    lines = [json.dumps(r) for r in rows]
    train.write_text("\n".join(lines) + "\n")  # one label changed in place
    relabelled = _ids(config, ("ncl",))
    assert relabelled != original

    corpus = data / "beta.txt"
    text = corpus.read_bytes()
    corpus.write_bytes(text[:100] + (b"x" if text[100:101] != b"x" else b"y") + text[101:])  # one byte
    assert _ids(config, ("ncl",)) not in (original, relabelled)


def test_changed_model_weights_give_a_new_id(tiny_config, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_config.model, model)
    config = dataclasses.replace(tiny_config, model=str(model))
    before = _ids(config, ("ncl",))
    weights = load_file(model / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + torch.ones_like(weights[name]) * 1e-3
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    assert _ids(config, ("ncl",)) != before


def test_the_same_recipe_on_the_same_text_gives_the_same_base_model_byte_for_byte(world_root, tmp_path):
    """The WordPiece trainer numbers its alphabet in hash order; unfixed, every pre-training gave other token ids,
    so another model checksum, another run id and other numbers."""
    from benchmark.data.synthetic import pretrain_synthetic_base

    built = [pretrain_synthetic_base(world_root, tmp_path / name, TINY_BASE, show_progress=False) for name in "ab"]
    for name in ("tokenizer.json", "model.safetensors"):
        assert (built[0] / name).read_bytes() == (built[1] / name).read_bytes(), name


def test_a_masked_tokenizer_learns_the_same_vocabulary_every_time(world_root):
    """Unfixed, the WordPiece trainer broke ties between equally frequent merges by numbers it gives continuation
    symbols in hash order: on the synthetic world's text at its base model's vocabulary size, repeated trainings in
    one process learned different tokens."""
    from benchmark.data.corpora import read_corpus_lines
    from benchmark.data.synthetic import DOMAINS, synthetic_base_spec
    from benchmark.families import MASKED_LM

    files = [world_root / "general.txt", *(world_root / f"{d}.txt" for d in DOMAINS)]
    lines = [line for file in files for line in read_corpus_lines(str(file))]
    size = synthetic_base_spec(MASKED_LM).vocab_size
    vocabularies = [MASKED_LM.train_tokenizer(lines, size, 32).get_vocab() for _ in range(4)]
    assert all(v == vocabularies[0] for v in vocabularies)
    assert vocabularies[0]["[PAD]"] == 0 and vocabularies[0]["[MASK]"] == 4


def test_the_recorded_commit_is_dirty_for_changed_code_not_for_generated_results(tmp_path):
    import subprocess

    from benchmark.engine.environment import git_commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    clean = git_commit(tmp_path)
    assert clean and not clean.endswith("-dirty")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "ncl-seq0-seed1-0123456789.json").write_text("{}")
    (tmp_path / "leaderboard.md").write_text("# x\n")
    assert git_commit(tmp_path) == clean  # records an earlier run wrote do not make the next one dirty
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == clean + "-dirty"


def test_a_copy_without_git_records_the_commit_it_names_and_none_otherwise(tmp_path, monkeypatch):
    from benchmark.engine.environment import git_commit

    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no checkout above tmp_path is found
    monkeypatch.delenv("DAPBENCH_GIT_COMMIT", raising=False)
    assert git_commit(tmp_path) is None
    monkeypatch.setenv("DAPBENCH_GIT_COMMIT", "0123abcd")
    assert git_commit(tmp_path) == "0123abcd"


def test_spelling_out_a_default_keeps_the_run_id(tiny_config):
    before = _ids(tiny_config)
    spelled = apply_overrides(
        tiny_config,
        ["das.contrast_lambda=1.0", "das.fidelity=paper", "das.importance_abs=per_example", "ncl.__unused__=1"][:3],
    )
    assert _ids(spelled) == before
    lr = tiny_config.dap.lr
    assert _ids(apply_overrides(tiny_config, [f"dap.lr={lr:.10e}", "finetune.default_epochs=1"])) == before


def test_a_field_added_later_at_its_default_keeps_every_id():
    from benchmark.config import profile_config
    from benchmark.records.identity import canonical_config

    config = profile_config("mini").to_dict()
    older = {k: v for k, v in config.items() if k != "keep_checkpoints"}
    older["dap"] = {k: v for k, v in config["dap"].items() if k not in ("heldout_mask_draws", "feature_chunks")}
    older["dap"]["feature_chunks"] = config["dap"]["feature_chunks"]
    without = {k: v for k, v in older["dap"].items() if k != "heldout_mask_draws"}
    assert canonical_config({**older, "dap": without}) == canonical_config(config)
