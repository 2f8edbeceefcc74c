"""Base models made by a recipe on first use (``--model recipe:<name>``): a corpus and a :class:`BaseModelSpec`,
trained by ``dapbench pretrain-base`` with one CPU thread (so every machine of one CPU type builds the same weights)
and cached in the work folder under a name that hashes the recipe. A record names such a model ``local:<name>`` and
its checksum; ``dapbench reproduce`` rebuilds it from the profile's recipe, and the checksum says whether it is the
same model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmark.data.pretrain import BaseModelSpec
from benchmark.errors import DapbenchError
from benchmark.io import built_once

RECIPE = "recipe:"


@dataclass(frozen=True)
class Recipe:
    """A base model to build: the corpus it is trained on (under the shared assets folder) and its spec."""

    corpus: str
    """Relative to the shared assets folder (``DAPBENCH_SHARED``)."""
    spec: BaseModelSpec
    description: str


RECIPES = {
    "general-causal": Recipe(
        corpus="data/general/train.txt",
        spec=BaseModelSpec(
            vocab_size=8000,
            hidden_size=256,
            num_layers=4,
            num_heads=8,
            kv_heads=2,
            intermediate_size=640,
            seq_len=128,
            steps=1500,
            batch_size=16,
            lr=1e-3,
            causal=True,
        ),  # fmt: skip
        description="a Llama-style decoder (4 layers, hidden 256, 8 query / 2 key-value heads) trained on the general"
        " corpus: the base model of the mini-causal profile",
    ),
}


def build_recipe(
    model: str, work_dir: str | Path, show_progress: bool = False, echo: Callable[[str], None] = print
) -> Path:
    """The directory of the base model ``recipe:<name>`` names, built now if it is not cached yet."""
    from benchmark.config import shared_root
    from benchmark.data.pretrain import pretrain_base
    from benchmark.records.reproduce import cpu_threads

    name = model.removeprefix(RECIPE)
    if name not in RECIPES:
        raise DapbenchError(f"unknown base-model recipe {name!r}", f"known recipes: {', '.join(RECIPES)}")
    recipe = RECIPES[name]
    digest = hashlib.sha256(json.dumps({"corpus": recipe.corpus, **asdict(recipe.spec)}).encode()).hexdigest()[:8]
    out = Path(work_dir) / "bases" / f"{name}-{digest}"
    corpus = shared_root() / recipe.corpus
    if not out.exists() and not corpus.is_file():
        raise DapbenchError(f"the corpus of recipe {name!r} is missing: {corpus}", "set DAPBENCH_SHARED")

    def pretrain() -> None:
        echo(f"{name}: pre-training {recipe.description} (once; {recipe.spec.steps} updates on one thread)")
        with cpu_threads(1):
            pretrain_base(str(corpus), out, recipe.spec, show_progress=show_progress)

    return built_once(out, pretrain)
