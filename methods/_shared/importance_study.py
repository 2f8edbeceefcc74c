"""DAS's importance studies (``dapbench study das <name>``): measurements of the importance itself, not runs.

- ``importance-similarity``: cosine between the general-knowledge (KL-proxy) importance vectors computed on
  each domain's probe data from the base model (the paper reports ~0.9).
- ``importance-stability``: split-half rank stability of the MLM importance per probe size (option
  ``chunks=64,256``), per-example and per-batch |gradient|, and how each normalisation keeps the ranking.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path

import torch

from benchmark.config import RunConfig
from benchmark.data.inputs import RunData, prepare_data
from benchmark.engine.evaluation import DeviceBatches
from benchmark.errors import DapbenchError


def importance_similarity(config: RunConfig, seed: int = 0) -> dict:
    """Cosine similarity between DAS's general-knowledge (KL-proxy) importance vectors computed on
    the probe data of each domain of the sequence, from the base model (the paper reports ~0.9)."""
    from transformers import set_seed

    from benchmark.data.masking import fixed_mlm_batches
    from benchmark.modeling import load_lm
    from methods._shared.importance import gate_importance, kl_proxy_loss
    from methods._shared.softmask import normalize_importance
    from methods._shared.units import UNIT_TYPES

    data: RunData = prepare_data(config)
    model, _ = load_lm(config.model)
    dap = config.dap
    vectors = {}
    for name in data.domains:
        set_seed(seed)
        batches = fixed_mlm_batches(
            data.corpora[name].train,
            data.tokenizer,
            dap.probe_chunks,
            dap.probe_batch_size,
            dap.mlm_probability,
            seed=1000,
            family=data.family,
        )
        raw = gate_importance(model, DeviceBatches(batches, "cpu"), kl_proxy_loss, UNIT_TYPES)
        vectors[name] = {
            "raw": torch.cat([raw[u].flatten() for u in UNIT_TYPES]),
            "normalised": torch.cat([normalize_importance(raw[u]).flatten() for u in UNIT_TYPES]),
        }
    result = {}
    for kind in ("raw", "normalised"):
        pairs = {
            f"{a}/{b}": float(torch.nn.functional.cosine_similarity(vectors[a][kind], vectors[b][kind], dim=0))
            for a, b in itertools.combinations(data.domains, 2)
        }
        result[kind] = {
            "pairs": {k: round(v, 4) for k, v in pairs.items()},
            "mean": round(sum(pairs.values()) / len(pairs), 4),
        }
    result["model"] = str(Path(config.model))
    return result


def importance_stability(config: RunConfig, sizes: tuple[int, ...] = (64, 256), seed: int = 0) -> dict:
    """How stable DAS's MLM importance ranking is for a probe of ``n`` chunks: the Spearman correlation,
    within each layer (mean over layers), between the raw importance of two disjoint samples of n chunks of
    the first domain's corpus, per unit type, for per-example and per-batch |gradient|; and the rank
    correlation between the raw scores and each normalisation. Base model, one process."""
    from scipy.stats import spearmanr
    from torch.utils.data import Subset
    from transformers import set_seed

    from benchmark.data.masking import fixed_mlm_batches
    from benchmark.modeling import load_lm
    from methods._shared.importance import gate_importance, mlm_importance_loss
    from methods._shared.softmask import NORMALISATIONS, normalize_importance
    from methods._shared.units import UNIT_TYPES

    data: RunData = prepare_data(config)
    model, _ = load_lm(config.model)
    corpus, dap = data.corpora[data.domains[0]].train, config.dap
    if 2 * max(sizes) > len(corpus):
        raise DapbenchError(
            f"chunks={max(sizes)}: domain {data.domains[0]} has {len(corpus)} training chunks, fewer than two disjoint"
            f" samples of {max(sizes)}",
            f"write chunks of at most {len(corpus) // 2}",
        )

    def within_layers(a: torch.Tensor, b: torch.Tensor) -> float:
        return round(float(sum(spearmanr(x, y).statistic for x, y in zip(a, b, strict=True)) / len(a)), 3)

    def importance(start: int, n: int, per_example: bool) -> dict[str, torch.Tensor]:
        batches = fixed_mlm_batches(
            Subset(corpus, range(start, start + n)),
            data.tokenizer,
            n,
            dap.probe_batch_size,
            dap.mlm_probability,
            seed=start,
            family=data.family,
        )
        set_seed(seed)
        return gate_importance(model, batches, mlm_importance_loss(), UNIT_TYPES, per_example=per_example)

    result: dict = {"domain": data.domains[0], "model": Path(config.model).name, "split_half": {}, "normalised": {}}
    for n in sizes:
        for grain, per_example in (("per_example", True), ("per_batch", False)):
            first, second = importance(0, n, per_example), importance(n, n, per_example)
            result["split_half"][f"{grain}/{n}"] = {u: within_layers(first[u], second[u]) for u in UNIT_TYPES}
            if per_example:
                result["normalised"][str(n)] = {
                    kind: {u: within_layers(first[u], normalize_importance(first[u], kind)) for u in UNIT_TYPES}
                    for kind in NORMALISATIONS
                }
    return result


def similarity_study(config: RunConfig, options: Mapping[str, str]) -> dict:
    """``dapbench study das importance-similarity`` (no options)."""
    _no_options(options, "importance-similarity", set())
    return importance_similarity(config)


def stability_study(config: RunConfig, options: Mapping[str, str]) -> dict:
    """``dapbench study das importance-stability [--option chunks=64,256]``."""
    _no_options(options, "importance-stability", {"chunks"})
    text = options.get("chunks", "64,256")
    try:
        sizes = tuple(int(n) for n in text.split(","))
    except ValueError as exc:
        raise DapbenchError(f"chunks={text!r} is not a list of integers", "write e.g. --option chunks=64,256") from exc
    if not sizes or min(sizes) < 2:
        raise DapbenchError(
            f"chunks={text!r}: each sample needs at least 2 chunks", "write e.g. --option chunks=64,256"
        )
    return importance_stability(config, sizes)


def _no_options(options: Mapping[str, str], study: str, allowed: set[str]) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise DapbenchError(
            f"study {study} has no option(s) {unknown}", f"valid options: {', '.join(sorted(allowed)) or '(none)'}"
        )
