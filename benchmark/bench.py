"""Measurements that are not unit tests: DAP step time per method, and importance similarity."""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from pathlib import Path

import torch

from benchmark.config import RunConfig
from benchmark.io import read_json
from benchmark.runner import ContinualRun, RunData, _DeviceBatches, prepare_data


def step_times(config: RunConfig, methods: list[str], steps: int, seed: int = 0) -> dict[str, dict]:
    """Seconds per DAP update of each method on the first domain of ``config.sequence`` (same data,
    same budget, one process), with the ratio to the first method listed."""
    with tempfile.TemporaryDirectory() as work:
        cfg = dataclasses.replace(
            config, work_dir=work, matrix="final", dap=dataclasses.replace(config.dap, steps=steps, log_every=steps)
        )
        data = prepare_data(cfg)
        data = dataclasses.replace(data, domains=data.domains[:1])  # time the first domain only
        out = {}
        for name in methods:
            run = ContinualRun(cfg, data, name, seed, show_progress=False)
            run._run_domain(0)
            stats = read_json(run._done(0), "domain stats")
            out[name] = {
                "step_seconds": stats["step_seconds"],
                "tokens_per_second": stats["tokens_per_second"],
                "peak_memory_mb": stats["peak_memory_mb"],
            }
    baseline = out[methods[0]]["step_seconds"]
    for stats in out.values():
        stats["ratio"] = round(stats["step_seconds"] / baseline, 3)
    return out


def importance_similarity(config: RunConfig, seed: int = 0) -> dict:
    """Cosine similarity between DAS's general-knowledge (KL-proxy) importance vectors computed on
    the probe data of each domain of the sequence, from the base model (the paper reports ~0.9)."""
    from transformers import set_seed

    from benchmark.data import fixed_mlm_batches
    from benchmark.modeling import load_masked_lm
    from methods._shared.importance import gate_importance, kl_proxy_loss
    from methods._shared.softmask import normalize_importance
    from methods._shared.units import UNIT_TYPES

    data: RunData = prepare_data(config)
    model, _ = load_masked_lm(config.model)
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
        )
        raw = gate_importance(model, _DeviceBatches(batches, "cpu"), kl_proxy_loss, UNIT_TYPES)
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

    from benchmark.data import fixed_mlm_batches
    from benchmark.modeling import load_masked_lm
    from methods._shared.importance import gate_importance, mlm_importance_loss
    from methods._shared.softmask import NORMALISATIONS, normalize_importance
    from methods._shared.units import UNIT_TYPES

    data: RunData = prepare_data(config)
    model, _ = load_masked_lm(config.model)
    corpus, dap = data.corpora[data.domains[0]].train, config.dap

    def within_layers(a: torch.Tensor, b: torch.Tensor) -> float:
        return round(float(sum(spearmanr(x, y).statistic for x, y in zip(a, b, strict=True)) / len(a)), 3)

    def importance(start: int, n: int, per_example: bool) -> dict[str, torch.Tensor]:
        if start + n > len(corpus):
            raise ValueError(f"the corpus has {len(corpus)} chunks, fewer than two samples of {n}")
        batches = fixed_mlm_batches(
            Subset(corpus, range(start, start + n)),
            data.tokenizer,
            n,
            dap.probe_batch_size,
            dap.mlm_probability,
            seed=start,
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
