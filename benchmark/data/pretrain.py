"""``dapbench pretrain-base``: build a small general base model from any corpus: a masked LM (WordPiece tokenizer +
BERT) or, with ``causal``, a Llama-style decoder (byte-level BPE tokenizer + Llama with grouped-query attention and a
gated MLP): each kind's recipe is its model family's (:mod:`benchmark.families`).

Users without hub access make their own base model with it; the synthetic profile uses the same
code. Training uses the benchmark's own packing, collator and selected-position loss.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from benchmark.data.corpora import load_corpus, read_corpus_lines
from benchmark.data.masking import MlmCollator, fixed_mlm_batches
from benchmark.errors import DapbenchError
from benchmark.families import CAUSAL_LM, MASKED_LM, ModelFamily
from benchmark.families.masked import SPECIAL_TOKENS
from benchmark.io import (
    atomic_directory,
    atomic_write_json,
    bar_disabled,
    mark_owned,
    owned_folder,
    require_replaceable,
)
from benchmark.modeling import mlm_loss
from benchmark.settings import check_settings, setting

MAX_BASE_PARAMETERS = 2_000_000_000
"""The largest base model ``pretrain-base`` builds: 8 GB of float32 weights before gradients and optimizer state, past
any stand-in a CPU trains (a larger one would fail allocating after every range check passed)."""


@dataclass(frozen=True)
class BaseModelSpec:
    """Architecture and training budget of a base model (``dapbench pretrain-base``'s options: each declared with its
    range and checked before any work)."""

    vocab_size: int = setting(8000, low=len(SPECIAL_TOKENS) + 1, high=10_000_000)
    hidden_size: int = setting(128, low=1, high=65_536)
    num_layers: int = setting(2, low=1, high=1_000)
    num_heads: int = setting(4, low=1, high=1_024)
    intermediate_size: int = setting(512, low=1, high=1_000_000)
    seq_len: int = setting(128, low=4, high=1_000_000)
    """Tokens per training chunk: at least a special token each side and two of text."""
    steps: int = setting(1000, low=1, high=100_000_000)
    batch_size: int = setting(32, low=1, high=1_000_000)
    lr: float = setting(5e-4, low=0, low_open=True, high=1)
    seed: int = 0
    causal: bool = False
    """A Llama-style decoder (next-token loss) instead of a BERT masked LM (``--causal``; see :attr:`family`)."""
    kv_heads: int = setting(0, low=0, high=1_024)
    """Key/value heads of the decoder (grouped-query attention); 0: as many as query heads."""

    @property
    def family(self) -> ModelFamily:
        """The kind of model the spec builds: its tokenizer recipe, its architecture and its objective."""
        return CAUSAL_LM if self.causal else MASKED_LM

    def __post_init__(self):
        check_settings("pretrain-base", self)
        if self.hidden_size % self.num_heads:
            raise DapbenchError(
                f"--hidden-size {self.hidden_size} is not divisible by --num-heads {self.num_heads}",
                "choose a hidden size that is a multiple of the number of heads",
            )
        if self.kv_heads and self.num_heads % self.kv_heads:
            raise DapbenchError(
                f"--kv-heads {self.kv_heads} does not divide --num-heads {self.num_heads}",
                "choose a number of key/value heads that divides the number of query heads (or 0: as many)",
            )
        if self.parameters() > MAX_BASE_PARAMETERS:
            raise DapbenchError(
                f"this base model would hold about {self.parameters():.2g} parameters, over the"
                f" {MAX_BASE_PARAMETERS:.0g} pretrain-base builds (it trains small stand-ins on one machine)",
                "lower --hidden-size, --num-layers, --intermediate-size or --vocab-size (or use a pre-trained model)",
            )

    def parameters(self) -> int:
        """The model's parameter count to leading order: embeddings (tokens, positions) and per layer the attention
        projections and the feed-forward block (biases and norms, a fraction of a percent, left out)."""
        positions = max(self.seq_len, 64) * self.hidden_size
        per_layer = 4 * self.hidden_size**2 + (3 if self.causal else 2) * self.hidden_size * self.intermediate_size
        return self.vocab_size * self.hidden_size + positions + self.num_layers * per_layer


def _sizes(spec: BaseModelSpec, tokenizer) -> dict[str, int]:
    """The spec's sizes in transformers' configuration names, the vocabulary the tokenizer's."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": max(spec.seq_len, 64),
    }


def pretrain_base(
    corpus: str,
    out_dir: str | Path,
    spec: BaseModelSpec,
    vocab_corpora: list[str] | None = None,
    show_progress: bool = True,
    provenance: dict | None = None,
) -> Path:
    """Train a tokenizer and a base model (BERT masked LM, or with ``spec.causal`` a Llama decoder) on ``corpus``;
    write a model directory atomically.

    ``vocab_corpora`` (default: the corpus itself) only shape the tokenizer's vocabulary; the model
    sees nothing but ``corpus``.
    ``provenance`` (e.g. the pinned numerics environment of a recipe build) is written to ``pretraining.json``
    as ``numerics``.
    """
    from transformers import set_seed

    if not Path(corpus).is_file():
        raise DapbenchError(f"corpus not found: {corpus}", "pass a text file with one passage per line")
    _require_free_outputs(out_dir)
    set_seed(spec.seed)
    family = spec.family
    lines = [line for path in vocab_corpora or [corpus] for line in read_corpus_lines(path)]
    tokenizer = family.train_tokenizer(lines, spec.vocab_size, spec.seq_len)
    model = family.new_model(_sizes(spec, tokenizer), tokenizer, spec.kv_heads)
    with _scratch(out_dir) as scratch:
        data = load_corpus("base", corpus, tokenizer, spec.seq_len, 0.02, None, scratch, family=family)
    loader = DataLoader(
        data.train,
        batch_size=spec.batch_size,
        shuffle=True,
        collate_fn=MlmCollator(tokenizer, family=family),
        drop_last=len(data.train) >= spec.batch_size,
    )
    heldout = fixed_mlm_batches(data.heldout, tokenizer, 128, 64, 0.15, family=family)
    start = time.perf_counter()
    _train_mlm(model, loader, spec, show_progress)
    reinitialised = _reinitialise_unseen_tokens(model, tokenizer, read_corpus_lines(corpus))
    report = {
        "reinitialised_unseen_tokens": reinitialised,
        "spec": asdict(spec),
        "corpus": str(corpus),
        "seconds": round(time.perf_counter() - start, 1),
        "heldout_mlm_loss": _evaluate(model, heldout),
        "train_chunks": len(data.train),
        **({"numerics": provenance} if provenance else {}),
    }

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "pretraining.json", report)

    return atomic_directory(out_dir, fill)


def _train_mlm(model, loader: DataLoader, spec: BaseModelSpec, show_progress: bool) -> None:
    """``spec.steps`` AdamW updates of plain MLM with a cosine schedule, cycling through ``loader``."""
    from tqdm.auto import tqdm
    from transformers import get_cosine_schedule_with_warmup

    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)
    scheduler = get_cosine_schedule_with_warmup(optimizer, spec.steps // 20, spec.steps)
    step = 0
    model.train()
    with tqdm(total=spec.steps, desc="pretrain-base", disable=bar_disabled(show_progress), leave=False) as bar:
        while step < spec.steps:
            for batch in loader:
                mlm_loss(model, batch).backward()
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                bar.update()
                if step >= spec.steps:
                    break


@torch.no_grad()
def _reinitialise_unseen_tokens(model, tokenizer, lines: list[str]) -> int:
    """Give vocabulary entries that never occurred in the training corpus a fresh initialisation.

    Through the tied softmax every absent token is pushed in the same direction at every step (the
    rare-token degeneration), so they end up nearly parallel and indistinguishable: later training
    could not tell them apart. They carry no information, so re-drawing them loses nothing.
    """
    seen = {i for ids in tokenizer(lines)["input_ids"] for i in ids} | set(tokenizer.all_special_ids)
    unseen = torch.tensor(sorted(set(range(len(tokenizer))) - seen), dtype=torch.long)
    if unseen.numel():
        weight = model.get_input_embeddings().weight
        weight[unseen] = torch.randn(len(unseen), weight.shape[1]) * model.config.initializer_range
    return int(unseen.numel())


@torch.no_grad()
def _evaluate(model, batches: list[dict]) -> float:
    model.eval()
    losses = [float(mlm_loss(model, b)) * b["mlm_targets"].numel() for b in batches]
    count = sum(b["mlm_targets"].numel() for b in batches)
    model.train()
    return round(sum(losses) / max(count, 1), 4)


class _scratch:
    """A temporary cache directory beside ``out_dir`` that is removed afterwards (only a folder dapbench made: a
    user's folder of that name is refused before any work, by :func:`_require_free_outputs`)."""

    def __init__(self, out_dir: str | Path):
        self.path = scratch_path(out_dir)

    def __enter__(self) -> Path:
        require_replaceable(self.path, "scratch folder")
        mark_owned(self.path)
        return self.path

    def __exit__(self, *exc) -> None:
        import shutil

        if owned_folder(self.path):
            shutil.rmtree(self.path, ignore_errors=True)


def scratch_path(out_dir: str | Path) -> Path:
    """Where ``pretrain_base`` caches its tokenised corpus while it runs: ``<out_dir>.cache``."""
    return Path(str(out_dir) + ".cache")


def _require_free_outputs(out_dir: str | Path) -> None:
    """Before any work: the model folder and its scratch folder are new, or folders dapbench built."""
    require_replaceable(out_dir, "model folder")
    require_replaceable(scratch_path(out_dir), "scratch folder")
