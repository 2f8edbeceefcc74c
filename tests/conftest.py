"""Shared fixtures: a generated task suite and a tiny base model, both built in the test session."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from benchmark.api import quiet_libraries as _quiet_libraries
from benchmark.config import RunConfig, profile_config
from benchmark.data.pretrain import BaseModelSpec
from benchmark.data.synthetic import build_world, pretrain_synthetic_base, write_world

_quiet_libraries()
SHARED = Path(os.environ.get("DAPBENCH_SHARED", Path(__file__).resolve().parents[2] / "shared"))
SHARED_DATA = SHARED / "data" / "continuallm-layout"


@pytest.fixture(scope="session")
def world_root(tmp_path_factory) -> Path:
    return write_world(build_world(seed=1), tmp_path_factory.mktemp("world") / "data")


TINY_BASE = BaseModelSpec(
    vocab_size=600,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    intermediate_size=64,
    seq_len=32,
    steps=10,
    batch_size=16,
    lr=1e-3,
)
"""The tiny masked base model's recipe (pre-trained on the test world's general text in a second)."""


@pytest.fixture(scope="session")
def tiny_model(world_root, tmp_path_factory) -> Path:
    return pretrain_synthetic_base(
        world_root, tmp_path_factory.mktemp("model") / "tiny", TINY_BASE, show_progress=False
    )


def _tiny_decoder(world_root: Path, out: Path, architecture: str) -> Path:
    """A randomly initialised GPT-2- or Llama-style decoder (4 query heads; Llama: 2 key/value heads, gated MLP)
    with a byte-level BPE tokenizer trained on the test world, saved as a model directory."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from benchmark.data.corpora import read_corpus_lines
    from benchmark.data.synthetic import DOMAINS
    from benchmark.families import CAUSAL_LM

    corpora = [world_root / "general.txt"] + [world_root / f"{d}.txt" for d in DOMAINS]
    tokenizer = CAUSAL_LM.train_tokenizer([line for c in corpora for line in read_corpus_lines(str(c))], 600, 64)
    eos = tokenizer.eos_token_id
    torch.manual_seed(0)
    if architecture == "gpt2":
        config = GPT2Config(
            vocab_size=len(tokenizer),
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=eos,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        model = GPT2LMHeadModel(config)
    else:
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            max_position_embeddings=64,
            bos_token_id=eos,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_gpt2(world_root, tmp_path_factory) -> Path:
    return _tiny_decoder(world_root, tmp_path_factory.mktemp("gpt2") / "model", "gpt2")


@pytest.fixture(scope="session")
def tiny_llama(world_root, tmp_path_factory) -> Path:
    return _tiny_decoder(world_root, tmp_path_factory.mktemp("llama") / "model", "llama")


def world_config(world_root: Path, model: Path, out: Path, dap: dict, finetune: dict, **fields) -> RunConfig:
    """The synthetic profile on the test world over ``alpha,beta`` with ``model``, writing under ``out``, with the DAP
    and fine-tune settings ``dap`` and ``finetune`` and any other ``fields`` replaced: the tiny runs of the tests."""
    base = profile_config("synthetic")
    settings = dict(
        model=str(model),
        data_root=str(world_root),
        general_heldout=str(world_root / "general_heldout.txt"),
        general_corpus=str(world_root / "general.txt"),
        sequence="alpha,beta",
        output_dir=str(out),
        work_dir=str(out / "work"),
        dap=dataclasses.replace(base.dap, **dap),
        finetune=dataclasses.replace(base.finetune, **finetune),
    )
    return dataclasses.replace(base, **{**settings, **fields})


TINY_DAP = dict(
    batch_size=8, per_device_batch_size=4, heldout_chunks=8, probe_chunks=8, probe_batch_size=4, log_every=2
)
"""The DAP settings of the tiny runs (with ``steps``)."""
TINY_FINETUNE = dict(default_epochs=1, max_train_examples=24, max_test_examples=24, batch_size=8)
"""The end-task settings of the tiny runs."""


@pytest.fixture
def tiny_config(world_root, tiny_model, tmp_path) -> RunConfig:
    """Two domains, a few steps, small fine-tunes: the whole runner in seconds."""
    return world_config(world_root, tiny_model, tmp_path, {**TINY_DAP, "steps": 4}, TINY_FINETUNE, seeds=(3,))


def requires_shared_data():
    return pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"shared data not found at {SHARED_DATA}")


@pytest.fixture
def started(monkeypatch):
    """Fail-fast hook: a DAP stage that starts raises ``cli_helpers.TrainingStarted`` instead of training."""
    from cli_helpers import TrainingStarted

    from benchmark.engine.training import DapTrainer

    def refuse(self, *args, **kwargs):
        raise TrainingStarted

    monkeypatch.setattr(DapTrainer, "train", refuse)


@pytest.fixture(scope="session")
def report_records(world_root, tiny_model, tmp_path_factory) -> list[dict]:
    """none, ncl and das over two domains, seeds 1-3, on the synthetic test world (one shared evaluation)."""
    from benchmark.api import continual_run
    from benchmark.data.inputs import prepare_data

    work = tmp_path_factory.mktemp("report-runs")
    dap = {**TINY_DAP, "steps": 3, "heldout_chunks": 12, "log_every": 3}
    finetune = {**TINY_FINETUNE, "max_train_examples": 16}
    # no general training text: these records keep the numbers the report tests were written against
    general = profile_config("synthetic").general_corpus
    config = world_config(world_root, tiny_model, work, dap, finetune, general_corpus=general)
    data = prepare_data(config)
    return [
        continual_run(config, data, method, seed, show_progress=False).execute()
        for method in ("none", "ncl", "das")
        for seed in (1, 2, 3)
    ]
