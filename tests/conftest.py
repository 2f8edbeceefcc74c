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


@pytest.fixture(scope="session")
def tiny_model(world_root, tmp_path_factory) -> Path:
    spec = BaseModelSpec(
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
    return pretrain_synthetic_base(world_root, tmp_path_factory.mktemp("model") / "tiny", spec, show_progress=False)


def _tiny_decoder(world_root: Path, out: Path, architecture: str) -> Path:
    """A randomly initialised GPT-2- or Llama-style decoder (4 query heads; Llama: 2 key/value heads, gated MLP)
    with a byte-level BPE tokenizer trained on the test world, saved as a model directory."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from benchmark.data.pretrain import train_bpe_tokenizer
    from benchmark.data.synthetic import DOMAINS

    corpora = [str(world_root / "general.txt")] + [str(world_root / f"{d}.txt") for d in DOMAINS]
    tokenizer = train_bpe_tokenizer(corpora, 600, 64)
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


@pytest.fixture
def tiny_config(world_root, tiny_model, tmp_path) -> RunConfig:
    """Two domains, a few steps, small fine-tunes: the whole runner in seconds."""
    base = profile_config("synthetic")
    return dataclasses.replace(
        base,
        model=str(tiny_model),
        data_root=str(world_root),
        general_heldout=str(world_root / "general_heldout.txt"),
        general_corpus=str(world_root / "general.txt"),
        sequence="alpha,beta",
        seeds=(3,),
        output_dir=str(tmp_path),
        work_dir=str(tmp_path / "work"),
        dap=dataclasses.replace(
            base.dap,
            steps=4,
            batch_size=8,
            per_device_batch_size=4,
            heldout_chunks=8,
            probe_chunks=8,
            probe_batch_size=4,
            log_every=2,
        ),
        finetune=dataclasses.replace(
            base.finetune, default_epochs=1, max_train_examples=24, max_test_examples=24, batch_size=8
        ),
    )


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

    base = profile_config("synthetic")
    work = tmp_path_factory.mktemp("report-runs")
    config = dataclasses.replace(
        base,
        model=str(tiny_model),
        data_root=str(world_root),
        general_heldout=str(world_root / "general_heldout.txt"),
        sequence="alpha,beta",
        output_dir=str(work),
        work_dir=str(work / "work"),
        dap=dataclasses.replace(
            base.dap,
            steps=3,
            batch_size=8,
            per_device_batch_size=4,
            heldout_chunks=12,
            probe_chunks=8,
            probe_batch_size=4,
            log_every=3,
        ),
        finetune=dataclasses.replace(
            base.finetune, default_epochs=1, max_train_examples=16, max_test_examples=24, batch_size=8
        ),
    )
    data = prepare_data(config)
    return [
        continual_run(config, data, method, seed, show_progress=False).execute()
        for method in ("none", "ncl", "das")
        for seed in (1, 2, 3)
    ]
