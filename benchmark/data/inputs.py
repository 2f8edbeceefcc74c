"""A run's inputs, prepared once and shared by every method and seed: the suite, tokenizer, packed corpora,
fixed held-out batches, encoded end tasks, and a content checksum of every input (the run identity's inputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import ConcatDataset, Dataset

from benchmark.config import DapConfig, RunConfig
from benchmark.data.corpora import Corpus, load_corpus, load_heldout_text, read_corpus_lines, resolve_corpus_path
from benchmark.data.endtasks import EncodedTask, encode_task, load_end_task
from benchmark.data.masking import batches_checksum, chunk_token_counts, heldout_mlm_batches
from benchmark.data.suite import TaskSuite, load_suite
from benchmark.errors import DapbenchError
from benchmark.families import ModelFamily, family_of
from benchmark.records.identity import FileHashCache, file_checksum, model_checksum, shared_cache_path

GENERAL = "general"
"""The held-out column of general text."""


@dataclass
class RunData:
    """Everything data-side a run needs, loaded once and shared by the methods and seeds of a run."""

    suite: TaskSuite
    domains: tuple[str, ...]
    tokenizer: Any
    corpora: dict[str, Corpus]
    heldout_batches: dict[str, list[dict]]
    """Fixed-mask held-out MLM batches per domain corpus (and ``general`` when given): every mask draw of the
    held-out chunks in turn, each batch naming its rows' chunks (``chunk_index``)."""
    tasks: dict[str, EncodedTask]
    checksums: dict[str, str] = field(default_factory=dict)
    heldout_draws: int = 1
    """Mask draws per held-out chunk (``dap.heldout_mask_draws``)."""
    feature_chunks: int | None = None
    """Held-out chunks per set whose features measure representation drift (``dap.feature_chunks``; None: all)."""
    family: ModelFamily = field(kw_only=True)
    """The base model's family (:mod:`benchmark.families`): what its batches predict and how its documents read."""

    def training_set(self, domain_indices: list[int]) -> Dataset:
        """The training chunks of the given domains (one domain, or the union for joint training)."""
        sets = [self.corpora[self.domains[k]].train for k in domain_indices]
        return sets[0] if len(sets) == 1 else ConcatDataset(sets)

    def heldout_checksums(self) -> dict[str, str]:
        """Per held-out set, a hash of its masked batches: equal hashes mean bit-identical evaluations."""
        return {name: batches_checksum(batches) for name, batches in self.heldout_batches.items()}

    def feature_batches(self, limit: int | None = None) -> dict[str, list[dict]]:
        """Per held-out set, the batches whose unmasked inputs measure representation drift: the first draw's (every
        chunk once; the unmasked input is the same in every draw), cut to ``limit`` chunks (default
        ``dap.feature_chunks``). A continual evaluation scores the same batches cut to ``dap.eval_chunks``."""
        limit = self.feature_chunks if limit is None else limit
        out = {}
        for name, batches in self.heldout_batches.items():
            first = batches[: len(batches) // self.heldout_draws]
            out[name] = [b for b in first if limit is None or int(b["chunk_index"][0]) < limit]
        return out

    def heldout_chunk_counts(self) -> dict[str, list[int]]:
        """Per held-out set and chunk, its masked tokens summed over the draws (the same for every model)."""
        return {name: chunk_token_counts(batches) for name, batches in self.heldout_batches.items()}


def prepare_data(config: RunConfig) -> RunData:
    """Load the suite, tokenizer, corpora (packed, cached) and end tasks (re-split, encoded), for the model's family."""
    from transformers import AutoConfig

    from benchmark.modeling import load_tokenizer

    suite = load_suite(config.data_root)
    domains = suite.sequence(config.sequence)
    sources = {name: resolve_corpus_path(suite.domains[name].corpus, config.data_root) for name in domains}
    try:
        tokenizer = load_tokenizer(config.model)
        family = family_of(AutoConfig.from_pretrained(config.model))
    except (OSError, ValueError) as exc:
        raise DapbenchError(
            f"cannot load the tokenizer of {config.model!r}: {exc}",
            "pass --model with a hub id or a model directory",
        ) from exc
    dap = config.dap
    cache_dir = Path(config.work_dir) / "cache"
    corpora, heldout, tasks, checksums = {}, {}, {}, {}
    for name in domains:
        spec = suite.domains[name]
        task = load_end_task(suite.end_tasks[spec.end_task], config.data_root, check_sizes=suite.source == "builtin")
        corpus = load_corpus(
            name,
            sources[name],
            tokenizer,
            dap.seq_len,
            dap.heldout_fraction,
            dap.max_corpus_lines,
            cache_dir,
            family,
            validation=dap.evaluate_on == "validation",
        )
        corpora[name], tasks[name] = corpus, encode_task(task, tokenizer, config.finetune)
        checksums[f"corpus/{name}"], checksums[f"task/{task.name}"] = corpus.checksum, task.checksum
    for name, corpus in corpora.items():
        heldout[name] = _heldout_batches(corpus.heldout, tokenizer, dap, family)
    if config.general_heldout:
        source, last = _general_evaluation_text(config)
        general, checksums[f"corpus/{GENERAL}"] = load_heldout_text(
            GENERAL, source, tokenizer, dap.seq_len, cache_dir, family=family, last=last
        )
        heldout[GENERAL] = _heldout_batches(general, tokenizer, dap, family)
    checksums.update(_file_checksums(config))
    draws = family.heldout_draws(dap.heldout_mask_draws)
    return RunData(
        suite, domains, tokenizer, corpora, heldout, tasks, checksums, draws, dap.feature_chunks, family=family
    )


def _general_evaluation_text(config: RunConfig) -> tuple[str, int | None]:
    """The general text the loss matrix measures: the general held-out text, or under ``dap.evaluate_on=validation``
    as many lines from the end of the general training corpus (which a run without general replay never reads)."""
    if config.dap.evaluate_on != "validation":
        return config.general_heldout, None
    if not config.general_corpus or config.replay.general > 0:
        raise DapbenchError(
            "dap.evaluate_on=validation measures general text on the last lines of general_corpus, so it needs one"
            " and no general replay (which would train on them)",
            "pass --set general_corpus=PATH and leave replay.general at 0 while tuning",
        )
    return config.general_corpus, len(read_corpus_lines(config.general_heldout))


def _file_checksums(config: RunConfig) -> dict[str, str]:
    """Checksums of the inputs read as whole files: the base model (weights, config, tokenizer) and the general
    training corpus; cached by size and mtime, so a paper-size checkpoint is hashed once."""
    cache = FileHashCache(shared_cache_path(config.work_dir))
    out = {"model": model_checksum(config.model, cache)}
    if config.general_corpus:
        if not Path(config.general_corpus).is_file():
            raise DapbenchError(
                f"general_corpus {config.general_corpus!r} is not a file", "pass --set general_corpus=<text file>"
            )
        out["file/general_corpus"] = file_checksum(config.general_corpus, cache)
    cache.save()
    return out


def _heldout_batches(dataset, tokenizer, dap: DapConfig, family: ModelFamily) -> list[dict]:
    if len(dataset) == 0:
        raise DapbenchError("a held-out corpus slice yields no full chunk", "lower dap.seq_len or use more text")
    return heldout_mlm_batches(
        dataset,
        tokenizer,
        dap.heldout_chunks,
        dap.per_device_batch_size,
        dap.mlm_probability,
        dap.heldout_mask_draws,
        family=family,
    )
