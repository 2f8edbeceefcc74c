"""Everything a run will read and write, checked before any work: a bad input is a named error (exit 2) while
nothing has been trained, written or deleted yet."""

from __future__ import annotations

import os
from pathlib import Path

from benchmark.config import RunConfig
from benchmark.errors import DapbenchError
from benchmark.io import path_inside, unlinked_path
from benchmark.protocols import protocols_of
from benchmark.records.store import load_records


def check_inputs(configs: list[RunConfig]) -> list:
    """Every config of a grid (one per sequence), before the first trains: its files and folders
    (:func:`check_config_inputs`), then everything its run will read (:func:`check_run_data`). Returns each
    config's prepared inputs (``RunData``)."""
    from benchmark.data.inputs import prepare_data

    for config in configs:
        check_config_inputs(config)
        check_labels(config)
    prepared = [prepare_data(config) for config in configs]
    for config, data in zip(configs, prepared, strict=True):
        check_run_data(config, data)
    return prepared


def check_labels(config: RunConfig) -> None:
    """Every method's row label (its name, non-default options and recipe) fits :data:`LABEL_LIMIT`: a record with a
    longer one is refused when read, so the run would be lost after its work."""
    from benchmark.records.checks import LABEL_LIMIT
    from benchmark.records.identity import canonical_recipe, row_label
    from benchmark.registry import default_registry

    recipe = canonical_recipe(config.to_dict())
    for name in config.methods:
        label = row_label(name, default_registry().get(name).options_in(config).canonical_options(), recipe)
        if len(label) > LABEL_LIMIT:
            raise DapbenchError(
                f"{name}'s row label would be {len(label):,} characters long, over the {LABEL_LIMIT} a label may hold"
                f" ({label[:60]}...)",
                "shorten the text options given with --set (a name, not a document)",
            )


def check_run_data(config: RunConfig, data) -> None:
    """What the prepared inputs of a run must satisfy before it trains: end-task settings name its end tasks, and
    the end-task protocol can score every end task with this model (its own checks: two classes to fit a linear
    probe on, a decoder for lm-eval)."""
    from benchmark.settings import check_known_keys

    check_known_keys("finetune.epochs", config.finetune.epochs, _suite_tasks(config), "end task")
    for protocol in protocols_of(config.finetune):
        protocol.check(config, data)
    check_measurable(config, data)


MIN_HELDOUT_CHUNKS = 2
"""Held-out chunks every held-out set needs: representation drift compares inputs, and a loss over one chunk has no
spread to put an error bar on."""
MIN_HELDOUT_TOKENS = 10
"""Scored tokens (masked ones for a masked LM, every next token for a decoder) every held-out set needs over all its
chunks and mask draws: a loss over fewer is noise, not a measurement."""


MIN_TEST_EXAMPLES = 10
"""Test examples every scored end task needs: a macro-F1 over fewer measures which examples were drawn."""


def check_measurable(config: RunConfig, data) -> None:
    """Refuse settings under which a run's numbers would measure nothing: too little held-out text to score, past
    too few end-task test examples to score or training classes to learn, past replay without a past (a fine-tune of
    less than one pass is the ``finetune`` protocol's own check)."""
    for name, counts in data.heldout_chunk_counts().items():
        scored = sum(counts)
        if len(counts) < MIN_HELDOUT_CHUNKS or scored < MIN_HELDOUT_TOKENS:
            raise DapbenchError(
                f"held-out set {name}: {len(counts)} chunk(s) of dap.seq_len={config.dap.seq_len} tokens with {scored}"
                f" scored token(s) (dap.mlm_probability={config.dap.mlm_probability:g}); a measurement needs at least"
                f" {MIN_HELDOUT_CHUNKS} chunks and {MIN_HELDOUT_TOKENS} scored tokens",
                "raise dap.heldout_fraction, dap.heldout_chunks, dap.mlm_probability or dap.seq_len (or use more text)",
            )
    for domain in data.domains:
        chunks = len(data.corpora[domain].train)
        if config.dap.batch_size > chunks:
            raise DapbenchError(
                f"dap.batch_size={config.dap.batch_size} chunks is more than domain {domain}'s {chunks} training"
                " chunks: every update would see the whole domain, and the record would count tokens never trained on",
                f"set dap.batch_size to at most {chunks} (or use more text)",
            )
    for task in data.tasks.values():
        if len(task.test) < MIN_TEST_EXAMPLES:
            raise DapbenchError(
                f"end task {task.name}: {len(task.test)} test example(s) would be scored; a score over fewer than"
                f" {MIN_TEST_EXAMPLES} is one example's luck, not a measurement",
                f"raise finetune.max_test_examples to at least {MIN_TEST_EXAMPLES} (or leave it unset: the whole test"
                " set)",
            )
        if len({example["labels"] for example in task.train}) < 2:
            raise DapbenchError(
                f"end task {task.name}: its training split has one class only ({len(task.train)} examples), on which"
                " no classifier learns anything",
                "raise finetune.max_train_examples or fix the task's training file",
            )
    if config.replay.past > 0 and len(data.domains) < 2:
        raise DapbenchError(
            f"replay.past={config.replay.past:g} on a sequence of one domain ({data.domains[0]}): there is no past to"
            " replay, so the row would be plain training under a replay label",
            "drop replay.past, or use a sequence of two or more domains",
        )


def _suite_tasks(config: RunConfig) -> list[str]:
    from benchmark.data.suite import load_suite

    return list(load_suite(config.data_root).end_tasks)


def _check_model_fits(config: RunConfig) -> None:
    """The model's embedding table covers its tokenizer, its positions cover the run's sequences, and every method's
    options fit it (:meth:`~benchmark.method.MethodConfig.check_model`)."""
    from transformers import AutoConfig, AutoTokenizer

    from benchmark.registry import default_registry

    try:
        model = AutoConfig.from_pretrained(config.model)
        tokenizer = AutoTokenizer.from_pretrained(config.model)
    except (OSError, ValueError) as exc:
        raise DapbenchError(f"cannot read the configuration of model {config.model!r}: {exc}", "pass --model") from exc
    vocabulary = getattr(model, "vocab_size", None)
    if vocabulary is not None and vocabulary < len(tokenizer):
        raise DapbenchError(
            f"model {config.model!r} embeds {vocabulary} tokens but its tokenizer has {len(tokenizer)}: token ids"
            " past the table would fail in the middle of a run",
            "use the tokenizer the model was trained with (the model directory's own)",
        )
    positions = getattr(model, "max_position_embeddings", None)
    if positions is not None:
        usable = positions - (model.pad_token_id + 1 if model.model_type in ("roberta", "xlm-roberta") else 0)
        for key, length in (("dap.seq_len", config.dap.seq_len), ("finetune.max_length", config.finetune.max_length)):
            if length > usable:
                raise DapbenchError(
                    f"{key}={length} exceeds the {usable} positions model {config.model!r} can embed",
                    f"set {key} to at most {usable}",
                )
        _check_method_positions(config, usable)
    for name in config.methods:  # each method's own options against this model
        default_registry().get(name).options_in(config).check_model(model)


def _check_method_positions(config: RunConfig, usable: int) -> None:
    """A method that puts positions in front of the input (a soft prompt) fits beside the longest sequence."""
    from benchmark.registry import default_registry

    longest = max(config.dap.seq_len, config.finetune.max_length)
    for name in config.methods:
        cls = default_registry().get(name)
        extra = cls.options_in(config).extra_positions()
        if extra and longest + extra > usable:
            raise DapbenchError(
                f"{name}: {extra} prompt positions + sequences of up to {longest} tokens (dap.seq_len,"
                f" finetune.max_length) exceed the {usable} positions model {config.model!r} can embed",
                (f"set {cls.name}.num_tokens to at most {usable - longest}, " if usable > longest else "")
                + "lower finetune.max_length / dap.seq_len, or use a model with more positions",
            )


NAME_BYTES = 255
"""The longest file or folder name common file systems hold (ext4, XFS, APFS, NTFS in UTF-16 units)."""


def check_config_inputs(config: RunConfig) -> None:
    """What would otherwise fail after training: an unwritable output folder, a corrupt record already under
    ``results/`` (the leaderboard is rebuilt from all of them), a missing data root, a model directory that is
    missing or truncated."""
    import tempfile

    from benchmark.data.suite import require_data_root
    from benchmark.modeling import check_model_files

    for folder, flag in ((config.output_dir, "--output-dir"), (config.work_dir, "--work-dir")):
        too_long = [part for part in Path(folder).parts if len(os.fsencode(part)) > NAME_BYTES]
        if too_long:
            raise DapbenchError(
                f"{flag}: the folder name {too_long[0][:40]}... is {len(os.fsencode(too_long[0]))} bytes, over the"
                f" {NAME_BYTES} a file name may hold",
                f"pass a {flag} with shorter folder names",
            )
    results = path_inside(config.output_dir, "results", config.profile)
    work = Path(config.work_dir).resolve()
    if work == results.parent or results.parent in work.parents:
        raise DapbenchError(
            f"the work folder {work} is inside the results folder {results.parent}: its files would be read as records",
            "pass a --work-dir outside <output-dir>/results (the default is <output-dir>/.dapbench)",
        )
    check_output_folders(config)
    for folder, flag in ((results, "--output-dir"), (work, "--work-dir")):
        existing = next(p for p in (folder, *folder.parents) if p.exists())  # nothing is created here
        try:
            tempfile.TemporaryFile(dir=existing).close()
        except OSError as exc:
            raise DapbenchError(f"cannot write under {folder}: {exc.strerror}", f"pass a writable {flag}") from exc
    if results.parent.is_dir():
        load_records(results.parent)  # a corrupt record is named now, not after hours of training
    if config.data_root:
        require_data_root(config.data_root)
    for field in ("general_heldout", "general_corpus"):
        source = getattr(config, field)
        if source and not source.startswith("hub:") and not Path(source).is_file():
            raise DapbenchError(
                f"{field} {source!r} is not a file",
                f"pass an existing text file, one passage per line (--{field.replace('_', '-')} PATH"
                f" or --set {field}=PATH), or a hub:NAME dataset",
            )
    check_model_files(config.model)
    _check_model_fits(config)
    check_recipe(config)


WORK_SUBFOLDERS = (("cache",), ("cache", "base-evaluation"), ("runs",))
"""The folders dapbench makes in a run's work folder (each run's own, ``runs/<run id>``, is checked as it starts)."""


def check_output_folders(config: RunConfig) -> None:
    """The folders a run writes into below its output folder are its own: no symbolic link to somewhere else (the
    report's pages and plots, the trackers' files, the work folder's caches and runs), a tracker that can track."""
    from benchmark.engine.tracking import check_tracking
    from benchmark.report.writer import report_folder

    out = Path(config.output_dir)
    report_folder(out)
    check_tracking(config.report_to, config.output_dir)
    work = Path(config.work_dir).absolute()
    if out.absolute() in work.parents:  # the default <output-dir>/.dapbench, or another folder inside the output
        unlinked_path(out.absolute(), *work.relative_to(out.absolute()).parts)
    for folder in WORK_SUBFOLDERS:  # the work folder is the user's to place; what dapbench makes inside it is its own
        unlinked_path(work, *folder)


def check_recipe(config: RunConfig) -> None:
    """A recipe (replay, schedule) needs a method that pre-trains; replay needs what it replays and a method it can
    mean something for: a general training text that is not the general held-out text, and for past replay a
    continual one."""
    from benchmark.records.identity import canonical_recipe
    from benchmark.registry import default_registry

    if config.replay.active():
        _check_replay(config)
    recipe = canonical_recipe(config.to_dict())
    for name in config.methods if recipe else ():
        if not default_registry().get(name).capabilities.pretrains:
            # its numbers are the base model's whatever the recipe: a second row and run id of the same numbers
            raise DapbenchError(
                f"{name} does not pre-train, so {', '.join(f'{section}.*' for section in recipe)} changes none of its"
                " numbers",
                f"run {name} without the recipe settings (in a separate dapbench run from the methods that use them)",
            )


def _check_replay(config: RunConfig) -> None:
    from benchmark.io import file_sha256
    from benchmark.registry import default_registry

    replay = config.replay
    _check_replay_counts(config)
    if replay.general > 0 and not config.general_corpus:
        raise DapbenchError("replay.general needs a general training text", "pass --set general_corpus=PATH")
    if replay.general > 0 and config.general_heldout and Path(config.general_heldout).is_file():
        if file_sha256(config.general_heldout) == file_sha256(config.general_corpus):
            raise DapbenchError(
                "general_corpus is the general held-out text: replaying it would train on what the general loss"
                " is measured on",
                "pass the general corpus's training part as general_corpus",
            )
    for name in config.methods:
        caps = default_registry().get(name).capabilities
        if replay.past > 0 and (caps.joint_training or caps.independent_per_domain or caps.retrains_on_seen):
            raise DapbenchError(
                f"{name} trains every stage from the base model (alone, or jointly on the domains so far): it has no"
                " past to replay",
                "drop replay.past for this method",
            )


def _check_replay_counts(config: RunConfig) -> None:
    """A replay share must replay at least one chunk in a domain's stage: a run labelled with replay that replays
    nothing would record plain training under the replay row's name."""
    from benchmark.data.sampling import replayed_by

    chunks, steps = config.dap.batch_size, config.dap.steps
    for key, share in (("replay.general", config.replay.general), ("replay.past", config.replay.past)):
        if share > 0 and replayed_by(share, chunks, steps) == 0:
            raise DapbenchError(
                f"{key}={share:g} replays no chunk: {share:g} x {chunks} chunks per update x {steps} updates per domain"
                " is less than half a chunk",
                f"set {key} to at least {0.5 / (chunks * steps):.2g}, or raise dap.batch_size or dap.steps",
            )


def require_multi_process(config: RunConfig, num_processes: int) -> None:
    """Refuse, before any work, a multi-process run of a method not verified for it (``multi_process``)."""
    from benchmark.engine.environment import (
        require_multi_process_support,
        require_sharding_support,
        require_supported_engine,
    )
    from benchmark.registry import default_registry

    require_supported_engine()
    for method in config.methods:
        require_multi_process_support(default_registry().get(method), num_processes)
        require_sharding_support(default_registry().get(method), config.dap.sharding)
    dap = config.dap
    if dap.compile and dap.sharding == "fsdp":
        raise DapbenchError(
            "dap.compile=true with dap.sharding=fsdp is not verified: FSDP2's gather and reshard hooks inside compiled"
            " blocks have no equivalence test yet",
            "drop one of the two: --set dap.compile=false, or --set dap.sharding=none",
        )
    if dap.batch_size % (dap.per_device_batch_size * num_processes):
        fitting = dap.batch_size // num_processes
        raise DapbenchError(
            f"dap.batch_size={dap.batch_size} is not a multiple of dap.per_device_batch_size="
            f"{dap.per_device_batch_size} x {num_processes} processes: the global batch would not be the profile's",
            f"set --set dap.per_device_batch_size=N with N dividing {fitting}"
            if dap.batch_size % num_processes == 0
            else f"use a process count that divides dap.batch_size={dap.batch_size}",
        )
