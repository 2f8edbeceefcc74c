"""Typed run configuration: frozen dataclasses, named profiles and ``key=value`` overrides."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmark.errors import DapbenchError, did_you_mean
from benchmark.schedules import SCHEDULES, check_schedule
from benchmark.settings import check_settings, setting


def _paper_finetune_epochs() -> dict[str, float]:
    """The paper's fine-tuning epochs per end task (reference ``utils/model.py:345-352``) as the built-in task files
    declare them (``paper_epochs``: each task's facts in its own file), in the built-in suite's domain order. Read
    here rather than through ``benchmark.data.suite``, which imports this module; ``tests/test_data.py`` holds the two
    readings equal."""
    import yaml

    tasks = Path(__file__).resolve().parents[1] / "tasks"
    suite = yaml.safe_load((tasks / "suite.yaml").read_text(encoding="utf-8"))
    folder = tasks / str(suite.get("end_tasks", "endtasks"))
    out = {}
    for domain in suite["domains"].values():
        name = domain["end_task"]
        out[name] = yaml.safe_load((folder / f"{name}.yaml").read_text(encoding="utf-8"))["paper_epochs"]
    return out


PAPER_FINETUNE_EPOCHS = _paper_finetune_epochs()
"""The paper's fine-tuning epochs per built-in end task: ``finetune.epochs``'s default."""


DEFAULT_OUTPUT = "dapbench-out"
"""Where a run writes its records, work folder and leaderboard unless told otherwise: a folder of the working
directory (ignored by the repository's ``.gitignore``), so a user's run never modifies tracked files. Maintainers
regenerate the committed records and leaderboard with ``--output-dir .``."""

SEED_LIMIT = 2**31 - 1
"""The largest run seed: stage and fine-tune seeds are derived by adding small offsets to it, and numpy's and
transformers' seeding accept at most 2**32 - 1."""


@dataclass(frozen=True)
class DapConfig:
    """Domain-adaptive pre-training of one domain (MLM on its corpus)."""

    steps: int = setting(2580, low=1)
    """Optimizer updates per domain (the paper: 640000 samples // 248 = 2580)."""
    batch_size: int = setting(248, low=1)
    """Sequences per update across all processes (gradient accumulation fills the rest)."""
    per_device_batch_size: int = setting(62, low=1)
    """Sequences per forward pass on one device."""
    seq_len: int = setting(164, low=2)
    """Tokens per packed chunk."""
    lr: float = setting(1e-4, low=0, low_open=True, high=1)
    warmup_ratio: float = setting(0.1, low=0, high=1, high_open=True)
    weight_decay: float = setting(0.0, low=0, high=1)
    adam_eps: float = setting(1e-6, low=0, low_open=True, high=1)
    """transformers' AdamW default, which the reference uses; it sets how strong soft-masking is."""
    max_grad_norm: float | None = setting(None, low=0, low_open=True)
    """Clip the gradient norm to this (None: no clipping, as the reference; 0 or less would update nothing or
    reverse the step)."""
    mlm_probability: float = setting(0.15, low=0, low_open=True, high=1, high_open=True)
    mixed_precision: str = setting("fp16", choices=("no", "fp16", "bf16"))
    """Passed to accelerate; on CPU bf16 is autocast, fp16 float32 (``environment.cpu_mixed_precision``)."""
    max_corpus_lines: int | None = setting(None, low=1)
    """Read at most this many training lines of each corpus (None: all)."""
    heldout_fraction: float = setting(0.05, low=0, low_open=True, high=1, high_open=True)
    """Share of each corpus's lines (its first lines, as the reference's validation split) kept out of training."""
    heldout_chunks: int = setting(256, low=1)
    """Held-out chunks per corpus on which the MLM-loss matrix is measured."""
    evaluate_on: str = setting("heldout", choices=("heldout", "validation"))
    """What the loss matrix is measured on: the held-out sets (every leaderboard run), or validation slices disjoint
    from them and from the training lines (``dapbench tune``: choosing a rate never looks at the held-out sets)."""
    heldout_mask_draws: int = setting(1, low=1, high=64)
    """Independent mask draws of every held-out chunk (each a fixed, seeded draw): more masked tokens per chunk,
    so a smaller evaluation-sample error at the cost of one forward pass per chunk and draw."""
    feature_chunks: int | None = setting(None, low=1)
    """Held-out chunks per set (the first ones) whose mean-pooled features measure representation drift (None: all
    ``heldout_chunks``): CKA needs fewer inputs than the loss's evaluation-sample error does."""
    probe_chunks: int = setting(10000, low=1)
    """Size of the fixed probe subset (first chunks of the training set) handed to methods."""
    probe_batch_size: int = setting(100, low=1)
    log_every: int = setting(50, low=1)
    eval_every: int = setting(0, low=0)
    """Continual evaluation (issue #90): every this many updates of a domain, and before its first, score the first
    ``eval_chunks`` chunks of every held-out set (one mask draw, no gradient) and keep the curve in the domain's entry
    (``domains[t].curve``): the stability gap shows between them. 0: off. Not in the run id: it changes no number,
    only adds the curve."""
    eval_chunks: int = setting(16, low=1)
    """Held-out chunks per set that a continual evaluation scores (the first ones)."""
    loader_workers: int = setting(0, low=0, high=64)
    """DataLoader workers masking training micro-batches ahead of use; not in the run id (changes no number)."""
    sharding: str = setting("none", choices=("none", "fsdp"))
    """``fsdp``: parameters, gradients and optimizer state sharded over the processes (torch FSDP2) for models that
    do not fit one device; the same numbers as unsharded up to float summation order, so not in the run id."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass instead of storing them (less memory, about a third
    more compute), in the updates and, with eager blocks, in a method's backward passes before and after a domain
    (DAS's and DGA's importance, EWC's Fisher); the same numbers, so not in the run id."""
    compile: bool = False
    """Compile each transformer block with ``torch.compile`` (one graph the blocks share; the rest of the model,
    the loss and the method's hooks stay eager): faster updates after a one-off compile of each mode. Random draws
    (dropout) come from torch's generator as in eager (inductor's ``fallback_random``), so the same numbers up to
    float rounding, and not in the run id."""
    flush_denormals: bool = False
    """Flush denormal floats (below 1.2e-38) to zero on CPU, on every thread (:mod:`benchmark.engine.denormals`): CPUs
    compute with them far more slowly, Intel's most (HAT's near-closed gates make them); the same numbers, so not in
    the run id."""
    deterministic: bool = False
    """On a GPU, deterministic kernels (:func:`benchmark.engine.environment.apply_determinism`); not in the run id."""

    def __post_init__(self):
        check_settings("dap", self)


@dataclass(frozen=True)
class ReplayConfig:
    """Data replay: a fixed share of every DAP update's chunks drawn from earlier data instead of the current
    domain's (the same token budget per update). A recipe option of every method that trains the base model: its
    non-default values label the method's leaderboard row (``ncl[replay.general=0.05]``) and enter the run id."""

    general: float = setting(0.0, low=0, high=1, high_open=True)
    """Share of every update's chunks drawn from the general corpus's training part (``general_corpus``; its
    held-out part, ``general_heldout``, is never drawn)."""
    past: float = setting(0.0, low=0, high=1, high_open=True)
    """Share of every update's chunks drawn from the training chunks of the domains before the current one (none in
    the first domain, which has no past)."""

    def __post_init__(self):
        check_settings("replay", self)
        if self.general + self.past >= 1:
            raise DapbenchError(
                f"replay.general + replay.past = {self.general + self.past:g} leaves no chunk of the current domain",
                "keep the replay shares' sum below 1",
            )

    def active(self) -> bool:
        """Whether any chunk is replayed."""
        return self.general > 0 or self.past > 0


@dataclass(frozen=True)
class ScheduleConfig:
    """The DAP learning-rate schedule, a recipe option of every method: its non-default values label the leaderboard
    row (``ncl[schedule.name=wsd]``) and enter the run id."""

    name: str = setting("per_domain_linear", choices=SCHEDULES)
    """A registered schedule of :mod:`benchmark.schedules` (each one's formula is its docstring): ``per_domain_linear``
    (the paper), ``rewarm_cosine``, ``global``, ``wsd``, ``cyclic_cosine``, ``rsqrt`` (infinite) or ``schedule_free``
    (schedule-free AdamW in place of AdamW); ``dapbench list`` names every registered one."""
    min_lr_ratio: float = setting(0.1, low=0, high=1)
    """The floor of the cosine and cooldown schedules, as a share of ``dap.lr``."""
    decay_fraction: float = setting(0.2, low=0, low_open=True, high=1)
    """``wsd`` and ``rsqrt``: the share of each domain's updates spent cooling down."""
    rewarm_ratio: float = setting(0.5, low=0, low_open=True, high=1)
    """``cyclic_cosine``: the peak every domain after the first re-warms to, as a share of ``dap.lr``."""
    lr_scale: float = setting(1.0, low=0, low_open=True, high=100)
    """A multiplier of every rate a stage's optimizers start from (``dap.lr`` and a method's own group rates): the
    learning-rate axis of a method's stability-plasticity curve (issue #85). A recipe option, so
    ``ncl[schedule.lr_scale=0.5]`` is a row of ``ncl``'s own group, compared with every other row."""

    def __post_init__(self):
        check_settings("schedule", self)
        check_schedule(self)


RECIPE_SECTIONS = ("replay", "schedule")
"""Configuration sections that vary the recipe a method is trained with: leaderboard rows, not groups."""


@dataclass(frozen=True)
class FinetuneConfig:
    """End-task evaluation of one checkpoint on one end task: fine-tuning (the paper) or a linear probe."""

    protocol: str = setting("finetune", checked_by="the end-task protocol registry (benchmark.protocols.get_protocol)")
    """A registered end-task protocol (:mod:`benchmark.protocols`). ``finetune``: train the whole classifier (the
    paper's protocol). ``linear_probe``: freeze the method's fine-tuning model, mean-pool its last hidden states and
    fit a logistic regression (scikit-learn) on the training split: several times cheaper and seed-free, so it
    measures what DAP left in the representations on budgets where full fine-tuning of a small model stays at the
    majority class. ``lm_eval``: a decoder scored zero-shot by lm-evaluation-harness over the label words."""
    beside: str | None = setting(None, checked_by="the end-task protocol registry (benchmark.protocols.get_protocol)")
    """A second protocol for the diagonal and last row, same checkpoints (``end_tasks_beside``; issue #46)."""
    probe_c: float = setting(1.0, low=0, low_open=True, high=1e6)
    """Inverse L2 strength of the probe's logistic regression (on standardised features)."""
    lr: float = setting(3e-5, low=0, low_open=True, high=1)
    batch_size: int = setting(16, low=1)
    max_length: int = setting(164, low=2)
    weight_decay: float = setting(0.01, low=0, high=1)
    adam_eps: float = setting(1e-6, low=0, low_open=True, high=1)
    epochs: dict[str, float] = setting(
        factory=lambda: dict(PAPER_FINETUNE_EPOCHS), low=0, low_open=True, high=1000, keys="end task"
    )
    """Epochs per end task (paper defaults); keys are end-task names (checked against the run's tasks)."""
    default_epochs: float = setting(3.0, low=0, low_open=True, high=1000)
    """Epochs of an end task that ``epochs`` does not name (custom suites)."""
    epoch_scale: float = setting(1.0, low=0, low_open=True, high=1000)
    """Multiplies every entry of ``epochs`` (reduced budgets)."""
    max_train_examples: int | None = setting(None, low=1)
    """Subsample the training split to at most this many examples (fixed, seed-independent subset)."""
    max_test_examples: int | None = setting(None, low=1)
    """Subsample the test split to at most this many examples (fixed, seed-independent subset)."""
    eval_batch_size: int = setting(64, low=1)
    validation_share: float = setting(0.0, low=0, high=0.5)
    """Fine-tuning only: the share of the (subsampled) training split held out as a validation split, stratified by
    label and the same for every run (:func:`benchmark.data.endtasks.validation_split`); the fine-tune scores it after
    every epoch and the test split is scored with the weights of the epoch whose validation macro-F1 was best (issue
    #86: the epoch count is chosen on validation, never on test). 0: no validation split, the last epoch's weights
    (the paper's protocol)."""
    group_by_length: bool = False
    """Draw training batches of similar length (transformers' ``LengthGroupedSampler``: random megabatches, each sorted
    by length) instead of uniformly shuffled ones. The paper shuffles uniformly; grouping cuts padding about 40%."""
    seed_offset: int = setting(0, low=0, high=1000)
    """Fine-tune seed = run seed + offset (the paper fine-tunes with seed 2021)."""
    seeds: int = setting(1, low=1, high=16)
    """Fine-tunes per cell under a protocol that trains (fine-tuning), the i-th from the fine-tune seed + 1000 i: the
    cell's scores are the means of theirs, and the record keeps each one's test predictions (``seed_predictions``).
    Fine-tuning noise is independent between checkpoints, so averaging k fine-tunes divides its variance by k
    (issue #86); 1 (the default) is one fine-tune, as the paper."""
    compile: bool = False
    """Fine-tune with compiled transformer blocks (as ``dap.compile``): fewer kernel launches; not in the run id."""

    def __post_init__(self):
        check_settings("finetune", self)


@dataclass(frozen=True)
class RunConfig:
    """Everything one ``dapbench run`` needs; resolved from a profile plus overrides. It is the one serialisable
    value passed between processes (:meth:`to_dict` / :meth:`from_dict`)."""

    profile: str = setting("paper", checked_by="the profile table (benchmark.config.PROFILES)")
    model: str = setting("roberta-base", checked_by="the input checks (benchmark.api.check_inputs)")
    """A hub id or a local directory with a masked LM and its tokenizer."""
    data_root: str | None = setting(None, checked_by="the input checks")
    """Root of the paper's data release layout (or ``DAPBENCH_DATA``)."""
    general_heldout: str | None = setting(None, checked_by="the input checks")
    """A general-domain text file whose MLM loss is tracked after every domain."""
    general_corpus: str | None = setting(None, checked_by="the input checks")
    """General-domain training text for methods that use general data (DAS's general+MLM/KL variants)."""
    sequence: str = setting("seq0", checked_by="the task suite")
    """A named sequence (``seq0``..``seq4``) or a comma-separated list of domains."""
    methods: tuple[str, ...] = setting(("none", "ncl", "one"), checked_by="the method registry")
    seeds: tuple[int, ...] = setting((2021,), low=0, high=SEED_LIMIT)
    matrix: str = setting("full", choices=("full", "final"))
    """``full``: the lower triangle A[t][k], k <= t; ``final``: the diagonal plus the last row."""
    output_dir: str = setting(DEFAULT_OUTPUT, checked_by="the output checks")
    work_dir: str = setting(f"{DEFAULT_OUTPUT}/.dapbench", checked_by="the output checks")
    """Checkpoints and caches (outside ``results/``)."""
    keep_checkpoints: bool = False
    """Keep every domain's checkpoint (default: only the latest, which resuming needs)."""
    device: str = setting("auto", choices=("auto", "cpu"))
    """``auto`` (accelerate's choice) or ``cpu``."""
    report_to: str = setting("none", choices=("none", "tensorboard", "wandb", "mlflow"))
    """An experiment tracker that watches the run (:mod:`benchmark.engine.tracking`); not part of the run id."""
    dap: DapConfig = field(default_factory=DapConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-method config overrides, e.g. ``{"das": {"contrast_lambda": 0.5}}`` (checked by each method's config)."""

    def __post_init__(self):
        check_settings("", self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """The configuration :meth:`to_dict` wrote (or a record's ``config``); fields it lacks take their defaults
        (a record made before a field existed ran with the default's behaviour), an unknown field is a named error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DapbenchError(
                f"the configuration has fields this version of dapbench does not know: {', '.join(unknown)}",
                "check out the commit that wrote it (a record's environment.git_commit) or update dapbench",
            )
        values = dict(data)
        for name, section in SECTION_TYPES.items():
            if name in values:
                values[name] = _section_from_dict(section, f"{name}", values[name])
        return cls(**values)


SECTION_TYPES: dict[str, type] = {
    "dap": DapConfig,
    "finetune": FinetuneConfig,
    "replay": ReplayConfig,
    "schedule": ScheduleConfig,
}
"""The nested sections of :class:`RunConfig` and their types."""


def spelled_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration dictionary (``to_dict`` form, or a record's ``config``) with every field in the one spelling of
    its type (``1`` -> ``1.0`` for a float, lists for tuples) and missing fields at their defaults, without checking
    ranges: a record of older code stays readable if a range is tightened later. Unknown fields stay as they are."""
    from benchmark.settings import coerce_value, field_types

    out = RunConfig().to_dict()
    sections = SECTION_TYPES
    for key, value in data.items():
        if key in sections and isinstance(value, Mapping):
            hints = field_types(sections[key])
            out[key] = {
                **out[key],
                **{k: coerce_value(f"{key}.{k}", hints[k], v) if k in hints else v for k, v in value.items()},
            }
        elif key in (hints := field_types(RunConfig)) and key not in sections:
            out[key] = coerce_value(key, hints[key], value)
        else:
            out[key] = value
    return json.loads(json.dumps(out))  # tuples as lists: one spelling for hashing


def _section_from_dict(section: type, name: str, data: Any):
    if isinstance(data, section):
        return data
    if not isinstance(data, Mapping):
        raise DapbenchError(f"config section {name} is not a map: {data!r}", "write it as a JSON object")
    known = {f.name for f in dataclasses.fields(section)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise DapbenchError(
            f"config section {name} has fields this version of dapbench does not know: {', '.join(unknown)}",
            "check out the commit that wrote it (a record's environment.git_commit) or update dapbench",
        )
    return section(**data)


def _mini() -> RunConfig:
    """The measured mini leaderboard: real data, the small shared model, budgets that fit a 2-core CPU.

    One method x six domains x one seed with ``--matrix full`` takes 12 (no DAP) to 37 minutes (DER++) with two runs
    sharing 2 CPU cores (measured): most of it is the held-out evaluation, 512 chunks per set after every domain,
    sized so that the evaluation sample's own error is small against method differences (docs/protocol.md).
    Full fine-tuning does not fit such a budget: the small model needs
    about 60 updates of 16 examples at lr 3e-4 per end task to leave the majority class (measured), and a
    full matrix is 21 fine-tunes per method and seed. So end tasks are scored with a linear probe on frozen
    features (500 train / 300 test examples per task), which the base model already lifts above the
    majority class on all six tasks. DAP is short (24 updates of 16 x 64 tokens per domain) at the paper's
    learning rate (at 3e-4 the first domain raised the general held-out loss 0.42 while lowering its own
    corpus's loss only 0.32: measured, so the larger rate was dropped).
    """
    return RunConfig(
        profile="mini",
        model=str(_shared_path("models/small")),
        data_root=os.environ.get("DAPBENCH_DATA") or str(_shared_path("data/continuallm-layout")),
        general_heldout=str(_shared_path("data/general/heldout.txt")),
        general_corpus=str(_shared_path("data/general/train.txt")),
        seeds=(2021, 111, 222),
        dap=DapConfig(
            steps=24,
            batch_size=16,
            per_device_batch_size=16,
            seq_len=64,
            lr=1e-4,
            mixed_precision="no",
            max_corpus_lines=1500,
            heldout_chunks=512,
            feature_chunks=32,
            probe_chunks=64,
            probe_batch_size=16,
            log_every=12,
        ),
        finetune=FinetuneConfig(
            protocol="linear_probe",
            max_length=128,
            max_train_examples=500,
            max_test_examples=300,
        ),
    )


def _gpu_small() -> RunConfig:
    """The small shared model on one GPU (issue #29): the whole real corpus sample of each domain and the paper's
    end-task protocol, at a budget where end tasks can respond to DAP.

    DAP: 150 updates of 32 x 128 tokens per domain (0.61M tokens: at least one pass over the largest domain's
    training part, about 0.54M tokens of the small model's WordPiece; 2.5 passes over camera's 0.24M), lr 1e-4 with
    10% warmup, bf16 autocast; every held-out chunk of each set (5% of each corpus, about 100-220 chunks of 128);
    DAS importance over every training chunk (the paper's whole-corpus pass). End tasks: the paper's protocol
    unchanged (full fine-tuning on the full splits, per-task epochs, lr 3e-5, batch 16, length 164): on the small
    base model it leaves the majority class (measured on the CPU machine, ``docs/protocol.md``). A run is host-bound
    (on an H200: about 17 min for a continual method, 5 for no DAP), so many runs share one GPU. The base model is
    ``small`` rounded to float16 (``recipe:small-half``): half the bytes to carry, built byte-identically."""
    mini = _mini()
    return dataclasses.replace(
        mini,
        profile="gpu-small",
        model="recipe:small-half",  # the small model in half the bytes to carry (benchmark.data.bases.Rounded)
        dap=DapConfig(
            steps=150,
            batch_size=32,
            per_device_batch_size=32,
            seq_len=128,
            lr=1e-4,
            mixed_precision="bf16",
            heldout_chunks=512,
            feature_chunks=64,
            probe_batch_size=64,
            log_every=25,
            loader_workers=2,
            deterministic=True,  # so that a record can be re-run to its last digit on the same GPU
        ),
        finetune=FinetuneConfig(),
    )


def _ci() -> RunConfig:
    """The CI key-number profile: the tiny shared model on real data, three domains, minute-sized budgets,
    full fine-tuning.

    Its numbers say nothing about methods; they pin the code's behaviour. The committed records under
    ``results/ci/`` are re-derived in CI (``tests/test_key_numbers.py``) and kept off the committed leaderboard by
    that folder's ``KEY-NUMBERS.md``; a user's own ``--profile ci`` runs are reported like any other (a quick first
    try of a plugin on real data).
    """
    mini = _mini()
    return dataclasses.replace(
        mini,
        profile="ci",
        model=str(_shared_path("models/tiny")),
        seeds=(2021,),
        sequence="restaurant,acl,phone",
        methods=("ncl", "one", "das"),
        dap=dataclasses.replace(
            mini.dap,
            steps=10,
            batch_size=8,
            per_device_batch_size=8,
            seq_len=64,
            lr=1e-4,
            max_corpus_lines=400,
            heldout_chunks=16,
            feature_chunks=None,
            probe_chunks=16,
            probe_batch_size=8,
            log_every=5,
        ),
        finetune=FinetuneConfig(
            lr=3e-4,
            max_length=64,
            epochs={k: 2 for k in PAPER_FINETUNE_EPOCHS},
            max_train_examples=80,
            max_test_examples=120,
            batch_size=16,
        ),
    )


def _paper() -> RunConfig:
    """The paper's setting: roberta-base, 2580 steps of 248 x 164 tokens per domain, fp16; micro-batches are
    masked by four loader workers ahead of the GPU (which changes no number)."""
    return RunConfig(
        profile="paper",
        data_root=os.environ.get("DAPBENCH_DATA"),
        seeds=(2021, 111, 222),
        dap=DapConfig(loader_workers=4),
    )


def _synthetic() -> RunConfig:
    """Fully offline: generated corpora and end tasks, a tiny base model pre-trained on the spot."""
    return RunConfig(
        profile="synthetic",
        model="synthetic",
        data_root="synthetic",
        general_heldout="synthetic",
        dap=DapConfig(
            steps=300,
            batch_size=32,
            per_device_batch_size=32,
            seq_len=32,
            lr=2e-3,
            warmup_ratio=0.1,
            mixed_precision="no",
            heldout_chunks=64,
            probe_chunks=64,
            probe_batch_size=32,
            log_every=40,
        ),
        finetune=FinetuneConfig(
            lr=5e-4,
            batch_size=32,
            max_length=32,
            epochs={},
            default_epochs=20,
            eval_batch_size=256,
        ),
        # the tiny synthetic base embeds 64 positions: a 16-vector prompt fits beside 32-token inputs, the paper's
        # 100 do not (the preflight would refuse prompt_one)
        method_options={"prompt_one": {"num_tokens": 16}},
    )


def _mini_causal() -> RunConfig:
    """The mini budget on a decoder: a Llama-style base model (grouped-query attention, gated MLP) that the recipe
    ``general-causal`` trains on the general corpus on first use (:mod:`benchmark.data.bases`), the same data,
    DAP budget and linear probe as ``mini``."""
    return dataclasses.replace(_mini(), profile="mini-causal", model="recipe:general-causal")


def _mini_rung(profile: str, factor: int) -> RunConfig:
    mini = _mini()
    return dataclasses.replace(mini, profile=profile, dap=dataclasses.replace(mini.dap, steps=mini.dap.steps * factor))


def _mini_4x() -> RunConfig:
    """The budget ladder's middle rung (issue #46): ``mini`` with 4x its DAP updates (96, 98K tokens per domain), all
    else equal. At one thread (NCL 513 tokens/s, DAS 189) DAP takes about 19 min (NCL) to 52 min (DAS)."""
    return _mini_rung("mini-4x", 4)


def _mini_pass() -> RunConfig:
    """The budget ladder's top rung (issue #46): ``mini`` with 12x its DAP updates (288 of 16 x 64 tokens, 295K tokens
    per domain: about one pass over a domain's text at the 1500-line cap, 1.9K (camera) to 7.5K (pubmed) chunks of 64
    tokens). DAP takes about 1 h (NCL) to 2.6 h (DAS) at one thread. Beside the probe, the diagonal and last row are
    fine-tuned (``finetune.beside``): 3 epochs of the 500 training examples at lr 3e-4 (measured on the
    base model: restaurant 50.5 macro-F1, ACL-ARC 17.7, above the majority class; 2-4 min a cell)."""
    rung = _mini_rung("mini-pass", 12)
    settings = {"beside": "finetune", "lr": 3e-4, "epochs": {}, "default_epochs": 3.0}
    return dataclasses.replace(rung, finetune=dataclasses.replace(rung.finetune, **settings))


PROFILES: dict[str, Callable[[], RunConfig]] = {
    "synthetic": _synthetic,
    "mini": _mini,
    "mini-causal": _mini_causal,
    "mini-4x": _mini_4x,
    "mini-pass": _mini_pass,
    "gpu-small": _gpu_small,
    "ci": _ci,
    "paper": _paper,
}
"""The named starting configurations, each built afresh by its function (a profile is its builder)."""


def shared_root() -> Path:
    """The shared offline assets folder (models, data): ``DAPBENCH_SHARED``, else ``../shared`` beside the checkout."""
    root = os.environ.get("DAPBENCH_SHARED")
    return Path(root) if root else Path(__file__).resolve().parents[2] / "shared"


def _shared_path(relative: str) -> Path:
    return shared_root() / relative


def profile_config(name: str) -> RunConfig:
    """The default configuration of a named profile."""
    if name not in PROFILES:
        hint = did_you_mean(name, PROFILES, n=1, form=" ({})")
        raise DapbenchError(f"unknown profile {name!r}{hint}", f"choose one of: {', '.join(PROFILES)}")
    return PROFILES[name]()


def apply_overrides(config: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``section.key=value`` strings (``dap.steps=10``, ``finetune.epochs.aclarc_sup=3``, ``das.lam=1``).

    Values are parsed as JSON where possible (numbers, booleans, lists) and checked against the
    field's type; an unknown key names the valid ones.
    """
    for item in overrides:
        if "=" not in item:
            raise DapbenchError(f"override {item!r} has no '='", "write overrides as section.key=value")
        key, raw = item.split("=", 1)
        config = _set_path(config, key.strip().split("."), _parse_value(raw.strip()))
    return config


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw
    except ValueError as exc:  # an integer longer than Python converts (thousands of digits): no setting needs one
        raise DapbenchError(
            f"the value {raw[:40]}... is no number dapbench can use: {exc}", "write a smaller number"
        ) from exc


def _set_path(obj: Any, path: list[str], value: Any) -> Any:
    """Return a copy of the dataclass ``obj`` with the field at ``path`` replaced by ``value``."""
    head, rest = path[0], path[1:]
    if not (isinstance(obj, dict) or dataclasses.is_dataclass(obj)):
        raise DapbenchError(
            f"a setting holds a value ({obj!r}), not a section: it has no key {head!r}",
            "write --set section.key=value with the key itself last (e.g. dap.steps=10)",
        )
    if isinstance(obj, dict):
        if not rest:
            return {**obj, head: value}
        return {**obj, head: _set_path(obj.get(head, {}), rest, value)}
    names = {f.name for f in dataclasses.fields(obj)}
    if head not in names:
        if isinstance(obj, RunConfig) and rest:
            # Unknown top-level section: a method's own options (validated by the method's config class).
            options = _set_path(obj.method_options, path, value)
            return dataclasses.replace(obj, method_options=options)
        raise DapbenchError(
            f"unknown config key {head!r} in {type(obj).__name__}", f"valid keys: {', '.join(sorted(names))}"
        )
    current = getattr(obj, head)
    if rest:
        return dataclasses.replace(obj, **{head: _set_path(current, rest, value)})
    return dataclasses.replace(obj, **{head: value})  # the dataclass coerces and checks it (benchmark.settings)
