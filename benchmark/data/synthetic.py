"""The offline synthetic world: a general corpus, six domain corpora and six end tasks from a seed.

It is built so that the benchmark's question has an answer on it:

* **DAP helps.** Each domain corpus states facts about its entities ("the <entity> was very <adj>
  and <adj>", every entity taking adjectives from one label group). The end task is a cloze: it
  names an entity, masks the adjective, and asks for the entity's label; its training set covers
  only half of the entities, so only a model that read the domain corpus labels the other half.
* **Sequential training interferes.** The 36 adjectives are shared by all domains but grouped
  differently in each (a word's polarity differs between domains), and a third of the entities are
  named in every domain with a different label each time. Training on a later domain rewrites
  these associations, so a naive continual learner forgets. General text has its own facts, so
  forgetting general knowledge shows in the general held-out MLM loss.

The data are written in the benchmark's custom-suite layout (``dapbench_suite.yaml``), so the
real loading code reads them.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from benchmark.config import RunConfig
from benchmark.data.suite import SUITE_FILE
from benchmark.families import CAUSAL_LM, MASKED_LM, ModelFamily
from benchmark.io import atomic_directory, built_once

VERSION = 3
"""Bump when the generator or the base model's build changes: cached worlds and base models live under a versioned
folder (2: the base model built with pinned arithmetic and a tokenizer numbered in a fixed order; 3: the base models
shipped with the package, :data:`SHIPPED_MODELS`, since a build's bytes still followed the installed library versions:
``transformers`` writes its version into ``config.json``, and kernels and serialisers change between releases)."""
SHIPPED_MODELS = Path(__file__).parent / "synthetic_models"
"""The synthetic world's base models as files (``masked``, ``causal``: 0.8 MB each), built once by
:func:`rebuild_shipped_model` and shipped, so every installation runs the very model the committed synthetic records
were made with, whatever its library versions or CPU."""
DOMAINS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")
NUM_LABELS = (3, 3, 4, 2, 4, 2)
INTENSIFIERS = ("very", "really", "quite")
MASK = "[MASK]"
"""The mask token of the synthetic base model's tokenizer (``dapbench pretrain-base`` uses BERT's)."""
FUNCTION_WORDS = "the a this that it we they and with of in on for to very really quite so".split()
_ONSETS = "b c d f g h j k l m n p r s t v w z br cr dr fl gr kl pr st tr".split()
_VOWELS = "a e i o u ai ou ea".split()


def _word_factory(rng: random.Random):
    seen: set[str] = set(FUNCTION_WORDS)

    def make(syllables: int) -> str:
        while True:
            word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
            if word not in seen:
                seen.add(word)
                return word

    return make


def build_world(seed: int = 0) -> dict:
    """The synthetic world as plain data: vocabularies, corpora and end tasks."""
    rng = random.Random(seed)
    word = _word_factory(rng)
    general = [word(rng.choice((2, 3))) for _ in range(300)]
    adjectives = [word(2) for _ in range(36)]  # shared by every domain, grouped differently in each
    shared_entities = [word(3) for _ in range(16)]  # named in every domain, with a different label in each
    world = {"general": _general_corpus(rng, general), "domains": {}}
    for name, num_labels in zip(DOMAINS, NUM_LABELS, strict=True):
        context = [word(2) for _ in range(30)]
        entities = [word(3) for _ in range(32)] + shared_entities
        groups = _partition(rng, adjectives, num_labels)  # the domain-specific polarity of each adjective
        labels = {e: rng.randrange(num_labels) for e in entities}
        world["domains"][name] = {
            "num_labels": num_labels,
            "corpus": _domain_corpus(rng, entities, labels, groups, context, general),
            "task": _end_task(rng, entities, labels, context, general),
        }
    return world


def _partition(rng: random.Random, items: list[str], parts: int) -> list[list[str]]:
    shuffled = rng.sample(items, len(items))
    return [shuffled[i::parts] for i in range(parts)]


def _general_corpus(rng: random.Random, general: list[str], lines: int = 2700) -> list[str]:
    """General text with learnable structure: general facts ("the <noun> was very <adjective>") and
    simple clauses, so the base model learns to use context before it meets any domain."""
    nouns, verbs, adjectives = general[:60], general[150:250], general[250:]
    facts = {noun: rng.sample(adjectives, 2) for noun in nouns}

    def sentence() -> str:
        noun = rng.choice(nouns)
        if rng.random() < 0.5:
            return f"the {noun} was {rng.choice(INTENSIFIERS)} {rng.choice(facts[noun])} ."
        return f"{rng.choice(FUNCTION_WORDS[:4])} {noun} {rng.choice(verbs)} the {rng.choice(nouns)} ."

    return [" ".join(sentence() for _ in range(rng.randint(3, 5))) for _ in range(lines)]


def _domain_corpus(rng, entities, labels, groups, context, general, lines: int = 1500) -> list[str]:
    def sentence() -> str:
        if rng.random() < 0.8:
            entity = rng.choice(entities)
            first, second = rng.sample(groups[labels[entity]], 2)  # same-group adjectives co-occur
            return f"{rng.choice(context)} the {entity} was {rng.choice(INTENSIFIERS)} {first} and {second} ."
        return " ".join(rng.sample(context, 2) + [rng.choice(FUNCTION_WORDS)] + rng.sample(general, 2)) + " ."

    return [" ".join(sentence() for _ in range(rng.randint(3, 5))) for _ in range(lines)]


def _end_task(rng, entities, labels, context, general) -> dict[str, list[dict]]:
    """Cloze inputs that name an entity and mask its adjective; training covers half of the entities.

    After DAP the hidden state at the mask points to the adjectives the corpus gave the entity, the
    knowledge a classifier needs for the entities it was not trained on.
    """
    order = rng.sample(entities, len(entities))
    seen = set(order[: len(order) // 2])

    def example(entity: str) -> dict:
        words = [rng.choice(general[150:250]), rng.choice(context), "the", entity, "was", rng.choice(INTENSIFIERS)]
        return {"text": " ".join([*words, MASK, "."]), "label": f"L{labels[entity]}"}

    train = [example(e) for e in entities if e in seen for _ in range(8)]
    test = [example(e) for e in entities for _ in range(4)]
    rng.shuffle(train)
    return {"train": train, "test": test}


def write_world(world: dict, root: str | Path) -> Path:
    """Write the world as a custom task suite (corpora, end tasks, ``dapbench_suite.yaml``) atomically."""

    def fill(tmp: Path) -> None:
        # The last 200 general lines are never trained on: they are the general held-out set.
        (tmp / "general.txt").write_text("\n".join(world["general"][:-200]) + "\n")
        (tmp / "general_heldout.txt").write_text("\n".join(world["general"][-200:]) + "\n")
        suite = {"domains": {}, "sequences": _sequences(), "end_tasks": "endtasks"}
        (tmp / "endtasks").mkdir()
        for name, domain in world["domains"].items():
            (tmp / f"{name}.txt").write_text("\n".join(domain["corpus"]) + "\n")
            for split, rows in domain["task"].items():
                (tmp / f"{name}_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            task = {
                "name": f"{name}_sup",
                "format": "jsonl",
                "train": [f"{name}_train.jsonl"],
                "test": [f"{name}_test.jsonl"],
                "labels": [f"L{i}" for i in range(domain["num_labels"])],
                "description": f"synthetic entity-fact classification of domain {name}",
            }
            (tmp / "endtasks" / f"{name}_sup.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
            suite["domains"][name] = {"corpus": f"{name}.txt", "end_task": f"{name}_sup"}
        (tmp / SUITE_FILE).write_text(yaml.safe_dump(suite, sort_keys=False))

    return atomic_directory(root, fill)


def rebuild_shipped_model(family: ModelFamily, work_dir: Path, show_progress: bool = False) -> Path:
    """Pre-train the synthetic world's base model (:func:`synthetic_base_spec`) with pinned arithmetic under
    ``work_dir`` and return its folder: how the shipped files (:data:`SHIPPED_MODELS`) were made. Replacing them
    changes every synthetic run's numbers (bump :data:`VERSION` and re-run the committed synthetic records)."""
    from benchmark.data.bases import pretrain_pinned

    data_root, model_dir = work_dir / "data", work_dir / _model_folder(family)
    built_once(data_root, lambda: write_world(build_world(seed=0), data_root))
    general, vocabulary = synthetic_base_corpora(data_root)
    built_once(
        model_dir,
        lambda: pretrain_pinned(
            general, model_dir, synthetic_base_spec(family), vocabulary, "synthetic", show_progress
        ),
    )
    return model_dir


def _model_folder(family: ModelFamily) -> str:
    """The work folder's name for the synthetic base model of ``family`` (``base-model`` for the masked one)."""
    return "base-model" if family is MASKED_LM else f"base-model-{family.name}"


def synthetic_base_spec(family: ModelFamily):
    """The synthetic world's base model of ``family``: a tiny BERT, or for the causal family a tiny Llama-style
    decoder (grouped-query attention) of the same budget."""
    from benchmark.data.pretrain import BaseModelSpec

    return BaseModelSpec(
        vocab_size=2000,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=128,
        seq_len=32,
        steps=600,
        batch_size=64,
        lr=2e-3,
        causal=family is CAUSAL_LM,
        kv_heads=2 if family is CAUSAL_LM else 0,
    )


def synthetic_base_corpora(data_root: str | Path) -> tuple[Path, list[Path]]:
    """What the base model reads: the general corpus it trains on, and the corpora its tokenizer's vocabulary
    covers (the general and every domain corpus: segmentation carries no knowledge, so domain words are whole
    tokens whose embeddings the base model never trained)."""
    root = Path(data_root)
    return root / "general.txt", [root / "general.txt"] + [root / f"{d}.txt" for d in DOMAINS]


def pretrain_synthetic_base(data_root: str | Path, out_dir: str | Path, spec, show_progress: bool = True) -> Path:
    """Pre-train a base model of ``spec`` (a :class:`~benchmark.data.pretrain.BaseModelSpec`, e.g.
    :func:`synthetic_base_spec`) on the synthetic world's general corpus only, in this process; runs of the synthetic
    profile build theirs with pinned arithmetic instead (:func:`materialise`)."""
    from benchmark.data.pretrain import pretrain_base

    general, vocabulary = synthetic_base_corpora(data_root)
    return pretrain_base(
        str(general), out_dir, spec, vocab_corpora=[str(c) for c in vocabulary], show_progress=show_progress
    )


def _sequences() -> dict[str, list[str]]:
    rotations = {f"seq{i}": list(DOMAINS[i:] + DOMAINS[:i]) for i in range(5)}
    return rotations


def _silent(line: str) -> None:
    """Say nothing (the default progress line sink)."""


SYNTHETIC_MODELS = {"synthetic": MASKED_LM, "synthetic-causal": CAUSAL_LM}
"""The synthetic world's base models (built on first use): masked, or causal (``--model synthetic-causal``)."""


def materialise(config: RunConfig, show_progress: bool = False, echo: Callable[[str], None] = _silent) -> RunConfig:
    """``config`` with its inputs in place, each built once and cached in the work folder: the synthetic world and
    its tiny base model (``--model synthetic`` or ``synthetic-causal`` with the synthetic data), or a base model
    made by a recipe (``--model recipe:<name>``, :mod:`benchmark.data.bases`); any other config as it is."""
    from benchmark.data.bases import RECIPE, build_recipe

    if config.model.startswith(RECIPE):
        return dataclasses.replace(config, model=str(build_recipe(config.model, config.work_dir, show_progress, echo)))
    if config.model not in SYNTHETIC_MODELS or config.data_root not in ("synthetic", None):
        return config
    family = SYNTHETIC_MODELS[config.model]
    root = Path(config.work_dir) / f"synthetic-v{VERSION}"
    data_root, model_dir = root / "data", root / _model_folder(family)
    built_once(data_root, lambda: write_world(build_world(seed=0), data_root))
    shipped = SHIPPED_MODELS / family.name
    built_once(
        model_dir, lambda: atomic_directory(model_dir, lambda tmp: shutil.copytree(shipped, tmp, dirs_exist_ok=True))
    )
    return dataclasses.replace(
        config,
        model=str(model_dir),
        data_root=str(data_root),
        general_heldout=str(data_root / "general_heldout.txt"),
        general_corpus=str(data_root / "general.txt"),
    )
