"""The offline synthetic world: a general corpus, six domain corpora and six end tasks from a seed.

It is built so that the benchmark's question has an answer on it:

* **DAP helps.** An end-task label is a *fact* about an entity ("the <entity> was <adjective>"
  in the domain corpus, the adjective's label group is domain-specific). End-task inputs name the
  entity in neutral context, never the adjective, and the end-task training set covers only half
  of the entities. Only a model that read the domain corpus can label the other half.
* **Sequential training interferes.** Half of every domain's entities are shared by all domains
  with a different label in each, and the shared adjectives map to different label groups per
  domain (a word's polarity differs between domains). Training on a later domain rewrites what
  these words mean, so a naive continual learner forgets.

The data are written in the benchmark's custom-suite layout (``dapbench_suite.yaml``), so the
real loading code reads them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

from benchmark.data import SUITE_FILE
from benchmark.io import atomic_directory

DOMAINS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")
NUM_LABELS = (3, 3, 4, 2, 4, 2)
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
    """The synthetic world as plain data: vocabularies, entity labels, corpora and end tasks."""
    rng = random.Random(seed)
    word = _word_factory(rng)
    general = [word(rng.choice((2, 3))) for _ in range(300)]
    adjectives = [word(2) for _ in range(12)]
    shared_entities = [word(3) for _ in range(20)]
    world = {"general": _general_corpus(rng, general), "domains": {}}
    for name, num_labels in zip(DOMAINS, NUM_LABELS, strict=True):
        context = [word(2) for _ in range(30)]
        entities = [word(3) for _ in range(20)] + shared_entities
        groups = _partition(rng, adjectives, num_labels)  # domain-specific meaning of each adjective
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
    def sentence() -> str:
        words = [rng.choice(FUNCTION_WORDS[:4])] + rng.sample(general, 3) + [rng.choice(FUNCTION_WORDS)]
        return " ".join(words + rng.sample(general, 2)) + " ."

    return [" ".join(sentence() for _ in range(rng.randint(3, 5))) for _ in range(lines)]


def _domain_corpus(rng, entities, labels, groups, context, general, lines: int = 1500) -> list[str]:
    def sentence() -> str:
        if rng.random() < 0.6:
            entity = rng.choice(entities)
            adjective = rng.choice(groups[labels[entity]])
            return f"{rng.choice(context)} the {entity} was {rng.choice(('very', 'really', 'quite'))} {adjective} ."
        return " ".join(rng.sample(context, 2) + [rng.choice(FUNCTION_WORDS)] + rng.sample(general, 2)) + " ."

    return [" ".join(sentence() for _ in range(rng.randint(3, 5))) for _ in range(lines)]


def _end_task(rng, entities, labels, context, general) -> dict[str, list[dict]]:
    """Inputs name the entity in neutral context; training covers half of the entities."""
    order = rng.sample(entities, len(entities))
    seen = set(order[: len(order) // 2])

    def example(entity: str) -> dict:
        words = [
            rng.choice(context),
            rng.choice(general),
            "the",
            entity,
            rng.choice(context),
            rng.choice(general),
        ]
        return {"text": " ".join(words), "label": f"L{labels[entity]}"}

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


def _sequences() -> dict[str, list[str]]:
    rotations = {f"seq{i}": list(DOMAINS[i:] + DOMAINS[:i]) for i in range(5)}
    return rotations
