"""The method plugin interface: the runner owns the loop, a method implements the hooks it needs.

A method is one class in one file under ``methods/``. It declares a ``name``, a typed ``config_cls``
and its :class:`Capabilities`, and overrides only the hooks it needs. Hooks receive context objects
(never a global ``args``) and return values the runner combines (named loss terms, models).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from benchmark.labels import join_label


@dataclass(frozen=True)
class MethodConfig:
    """Base class of every method's typed configuration (a frozen dataclass whose fields are declared with
    :func:`benchmark.settings.setting`: type and range where they are defined)."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any], section: str | None = None) -> MethodConfig:
        """Build the config from user options (``--set <section>.<option>=value``), rejecting unknown keys with the
        list of valid ones and values outside their declared range."""
        from benchmark.errors import error_context
        from benchmark.settings import check_known_keys

        section = section or cls.section()
        check_known_keys(section, options, [f.name for f in dataclasses.fields(cls)], "option")
        with error_context(f"--set {section}.…"):
            return cls(**options)

    @classmethod
    def section(cls) -> str:
        """How errors name these options: the class name without ``Config``, lower case (``das``, ``adapter``)."""
        return cls.__name__.removesuffix("Config").lower()

    def __post_init__(self):
        from benchmark.settings import check_settings

        check_settings(self.section(), self)  # coerces every declared field and checks it against its range

    def canonical_options(self) -> dict[str, Any]:
        """The options that determine the method's numbers, in one spelling: a value equal to its default is left
        out, lists are JSON lists. Two configs that compute the same thing give the same dict (the run id hashes
        it); a method whose options have several spellings of one behaviour (DAS's presets) overrides this."""
        return {
            f.name: _plain(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != default_of(f)
        }

    def numerics_depend_on_processes(self) -> bool:
        """Whether these options make the numbers depend on the number of processes (then the run id names it)."""
        return False

    def check_model(self, model_config: Any) -> None:
        """Refuse, with a named error before any run starts, options this base model cannot run (``model_config``: its
        ``transformers`` configuration), such as more layers frozen than it has; the default accepts every model."""

    def extra_positions(self) -> int:
        """Positions the method puts in front of every input (a soft prompt's vectors): they must fit the model's
        position table beside the run's sequences, which the preflight checks before any work."""
        return 0


def _plain(value: Any) -> Any:
    """A JSON-ready spelling of an option value (tuples as lists)."""
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Capabilities:
    """What a method needs from, or promises to, the runner; enforced by the runner, shown in reports."""

    pretrains: bool = True
    """False for the no-DAP baseline: the runner skips DAP and fine-tunes the base model."""
    independent_per_domain: bool = False
    """Every domain starts from the base model (the ONE family): the final score is the diagonal."""
    needs_domain_id_at_finetune: bool = False
    """``finetune_model`` uses the end task's domain id (task-incremental information)."""
    stores_past_data: bool = False
    """Keeps raw data of earlier domains (replay)."""
    joint_training: bool = False
    """Trains one model on the union of all domains (non-continual reference)."""
    retrains_on_seen: bool = False
    """Every stage re-trains the base model on the union of the domains seen so far, with the budget a continual run
    has spent by then ((t + 1) x ``dap.steps`` updates): the oracle that regret is measured against (TiC-LM)."""


@dataclass
class RunEnv:
    """Read-only facts about the run, given to the method at construction."""

    num_domains: int
    domains: tuple[str, ...]
    seed: int
    base_model: str = ""
    """The base model's hub id or directory: a method anchored to the base weights (L2-SP, EWC towards the
    base) loads them from here instead of copying them into every checkpoint's method state."""


GROUP_OPTIMIZERS = ("adamw", "sgd", "adafactor")
"""The optimisers a method's own parameter group may ask for: ``adamw`` (a group of the DAP AdamW at its own rate) or
``sgd`` (plain SGD, as HAT's paper trains its task embeddings)."""


@dataclass(frozen=True)
class ParameterGroup:
    """Parameters of a method's own that its paper trains at another rate (or with another optimiser) than the
    model's weights: soft prompts, LoRA or adapter weights, HAT's task embeddings. Declared by
    :meth:`ContinualMethod.parameter_groups`; the runner builds their optimiser, gives them the stage's schedule
    shape at their own peak rate, and records how far each group moved per domain (``update_sizes``)."""

    name: str
    """How the record and the report name the group (``task_embeddings``, ``prompts``, ``lora``)."""
    parameters: list[tuple[str, nn.Parameter]]
    lr: float | None
    """The group's peak learning rate (the schedule's warmup and decay shape applies to it as to ``dap.lr``); None:
    ``dap.lr`` itself (an ``adamw`` group then trains exactly as without the group, and only its update size is
    recorded apart)."""
    optimizer: str = "adamw"
    """One of :data:`GROUP_OPTIMIZERS`."""
    clip: bool = True
    """Whether the update's gradient-norm clipping (``dap.max_grad_norm``) counts these gradients: HAT's compensated
    embedding gradients are scaled by up to smax/s on purpose and would shrink every other gradient."""

    def __post_init__(self):
        if self.optimizer not in GROUP_OPTIMIZERS:
            raise ValueError(f"parameter group {self.name!r}: optimizer {self.optimizer!r} not in {GROUP_OPTIMIZERS}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"parameter group {self.name!r}: learning rate {self.lr} must be > 0")


@dataclass
class DomainContext:
    """What ``before_domain`` / ``after_domain`` see."""

    index: int
    name: str
    model: nn.Module
    probe_loader: Iterable[Mapping[str, torch.Tensor]]
    """A fixed subset of the domain's training chunks (the same every run), already MLM-masked."""
    accelerator: Any
    mlm_loss: Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]
    """Computes the efficient MLM loss of a model on a batch (logits at masked positions only)."""
    general_probe: Callable[[], Iterable[Mapping[str, torch.Tensor]] | None] = lambda: None
    """Loads (once) a fixed masked subset of the general corpus (``general_corpus``); None if not set."""

    def unwrapped_model(self) -> nn.Module:
        """The model without accelerate's wrappers (for hooks, module maps and copies)."""
        return self.accelerator.unwrap_model(self.model) if self.accelerator else self.model


@dataclass
class StepContext:
    """What the per-step hooks see."""

    model: nn.Module
    domain_index: int
    domain_step: int
    total_domain_steps: int
    global_step: int
    accelerator: Any
    optimizer: Any = None
    """The DAP optimizer (read-only for methods: e.g. to measure what a step did from its state)."""
    micro_batch: int = 0
    """Global index of the current micro-batch in the stage's stream, the same whatever the process layout
    (:mod:`benchmark.data.sampling`); during an update's micro-batches, the one being computed."""

    def unwrapped_model(self) -> nn.Module:
        """The model without accelerate's wrappers (for hooks, module maps and copies)."""
        return self.accelerator.unwrap_model(self.model) if self.accelerator else self.model


@dataclass
class StepOutput:
    """The runner's forward pass of one training batch."""

    loss: torch.Tensor
    """Mean MLM cross-entropy at the masked positions."""
    hidden: torch.Tensor
    """Last hidden state, batch x length x hidden."""
    logits: torch.Tensor
    """MLM logits at the masked positions (``batch["mlm_positions"]``), selected x vocabulary."""


@dataclass
class FinetuneContext:
    """What ``finetune_model`` sees: the DAP checkpoint of row t and the end task of column k."""

    checkpoint_dir: Path
    model: nn.Module
    """The DAP model of checkpoint t (method surgery applied, method state loaded)."""
    num_labels: int
    task_domain_index: int | None = None
    """The end task's domain index; None unless the method declares ``needs_domain_id_at_finetune``."""


CLASSIFIER = "classifier"
"""What an end-task protocol scores (``EndTaskProtocol.scores``): the method's end-task classifier
(:meth:`ContinualMethod.end_task_model` returns ``finetune_model``)."""
LANGUAGE_MODEL = "language_model"
"""What an end-task protocol scores: the stage's language model itself, as the method serves the end task's domain
(inside its ``heldout_view``, as the held-out losses are measured)."""


class MethodDeclaration:
    """What a method declares about itself (class attributes) and how its records are labelled."""

    name: ClassVar[str] = ""
    """The registry name; it must equal the entry-point name the method is registered under."""
    config_cls: ClassVar[type[MethodConfig]] = MethodConfig
    capabilities: ClassVar[Capabilities] = Capabilities()
    comparison_role: ClassVar[str | None] = None
    """The leaderboard's references, every method is tested against them (paired by seed): ``no_dap`` and
    ``naive_continual`` for the two baselines, ``proposed`` for the method of the paper the benchmark follows (DAS),
    so that recipes and newer methods are read against it; None for every other method."""
    leaderboard_note: ClassVar[str] = ""
    """One sentence the leaderboard's reading prints about what this method's numbers mean, if needed."""
    studies: ClassVar[Mapping[str, Callable[[Any, Mapping[str, str]], dict]]] = {}
    """Named measurements the method offers beside runs (``dapbench study <method> <name>``): each takes the
    resolved ``RunConfig`` and the ``--option key=value`` strings and returns a JSON-ready dict."""
    multi_process: ClassVar[bool] = False
    """Whether the method trains correctly with several processes (``accelerate launch``/``torchrun``): whatever
    it computes over batches or data is synchronised as on one device. Set only when the method passes the
    2-process one-update equivalence test (``tests/test_distributed.py``); other methods are refused there."""
    fsdp_refusal: ClassVar[str] = (
        "its hooks act on whole parameters or whole models (gradient slices, copies of the model), not on the shards"
        " FSDP leaves each process"
    )
    """Why the method cannot train with ``dap.sharding=fsdp``; empty once its hooks act on shards and it passes the
    sharded equivalence test (``tests/test_sharding.py``)."""
    version: ClassVar[int] = 1
    """Bumped when a change of the method changes its numbers for unchanged options: it is part of the run id
    (``benchmark.records.identity``), so records of the old code are never taken for the new code's."""

    def __init__(self, config: MethodConfig, *, env: RunEnv):
        self.config = config
        self.env = env

    @classmethod
    def options_in(cls, run_config: Any) -> MethodConfig:
        """The typed options a run configuration gives this method (``--set <name>.<option>=…``; defaults else)."""
        return cls.config_cls.from_options(run_config.method_options.get(cls.name, {}), cls.name)

    def variant(self) -> str:
        """The options that differ from the defaults (``fidelity=reference``), to label records: the canonical
        options (:meth:`MethodConfig.canonical_options`), so one behaviour has one label."""
        return options_label(self.config.canonical_options())

    def label(self) -> str:
        """Name plus non-default options, e.g. ``das[fidelity=reference]``: one leaderboard row each."""
        return join_label(self.name, [self.variant()])

    def flop_bound(self, encoder_share: float) -> float | None:
        """Fewest model FLOPs of one update in the current state, in plain MLM updates, given the encoder's share of
        one (None: undeclared). Default 1: nothing but element-wise additions (docs/measurements.md, "FLOP bounds")."""
        return 1.0


class TrainedParameters:
    """The hooks that say what the DAP optimizer trains, and at which rate."""

    def trainable_parameters(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """The parameters the DAP optimizer updates (default: every parameter that requires grad)."""
        return [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def parameter_groups(self, model: nn.Module) -> list[ParameterGroup]:
        """The method's own parameters (among :meth:`trainable_parameters`) that train at their own rate or with
        their own optimiser (default: none; every trainable parameter then trains at ``dap.lr`` with AdamW)."""
        return []


class ContinualMethod(MethodDeclaration, TrainedParameters):
    """Base class of every method: the hooks the runner calls. Every hook has a no-op default, so NCL is the
    empty subclass. Per stage: ``setup`` (on every model load: fresh, checkpoint, fine-tune) ->
    ``load_state_dict`` -> ``before_domain`` -> per update [``training_loss`` -> ``after_backward`` ->
    ``after_optimizer_step``] -> ``after_domain`` -> ``domain_report`` -> ``heldout_view`` -> ``state_dict``; then
    per end task ``finetune_model`` -> ``finetune_report``."""

    def setup(self, model: nn.Module) -> nn.Module:
        """Modify the freshly loaded model once (gates, adapters, prompts) and return the model to train."""
        return model

    def before_domain(self, ctx: DomainContext) -> None:
        """Called before training on a domain (e.g. importance at initialisation, teacher snapshot)."""

    def after_domain(self, ctx: DomainContext) -> None:
        """Called after training on a domain (e.g. importance, Fisher, replay buffer)."""

    def training_loss(
        self, batch: Mapping[str, torch.Tensor], outputs: StepOutput, ctx: StepContext
    ) -> dict[str, torch.Tensor]:
        """Extra named loss terms added to the MLM loss; may run extra forward passes."""
        return {}

    def after_backward(self, ctx: StepContext) -> None:
        """Gradient hook: after backward, before clipping and the optimizer step."""

    def after_optimizer_step(self, ctx: StepContext) -> None:
        """Called after every optimizer step (e.g. clamping, running statistics)."""

    @contextlib.contextmanager
    def heldout_view(self, model: nn.Module, domain_index: int | None) -> Iterator[None]:
        """Inside the block ``model`` is as evaluated on held-out text of domain ``domain_index`` (None: general text)
        after the current domain; a method whose model depends on the domain (task masks) selects that domain's."""
        yield

    def end_task_model(self, ctx: FinetuneContext, scores: str) -> nn.Module:
        """The model an end-task protocol scores (:mod:`benchmark.protocols`): for ``scores="classifier"``
        :meth:`finetune_model`; for ``scores="language_model"`` the stage's DAP model itself (the protocol scores it
        inside :meth:`heldout_view` of the task's domain). A method that serves end tasks otherwise overrides this."""
        return ctx.model if scores == LANGUAGE_MODEL else self.finetune_model(ctx)

    def finetune_model(self, ctx: FinetuneContext) -> nn.Module:
        """The classification model for end-task fine-tuning (default: a fresh head on checkpoint t)."""
        from benchmark.modeling import classifier_from_checkpoint

        return classifier_from_checkpoint(ctx.checkpoint_dir, ctx.num_labels)

    def finetune_report(self, model: nn.Module) -> dict[str, Any]:
        """Facts about ``finetune_model``'s model after scoring (record: ``finetune_reports[t/k]`` if not empty)."""
        return {}

    def domain_report(self) -> dict[str, Any]:
        """JSON-ready facts about the method's state after a domain (kept small: summaries, not tensors);
        stored per domain in the run record and plotted by ``dapbench report``."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The method's own state (tensors on CPU); the model is saved separately."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def options_label(options: Mapping[str, Any]) -> str:
    """Canonical options as a label writes them: ``fidelity=reference,lambda=0.5``."""
    return ",".join(f"{k}={_label_value(v)}" for k, v in options.items())


def _label_value(value: Any) -> str:
    """An option value as a label writes it: list items joined by ``+`` (a comma separates options)."""
    return "+".join(map(str, value)) if isinstance(value, list) else str(value)


def default_of(field: dataclasses.Field) -> Any:
    """A dataclass field's default (its factory's value), ``dataclasses.MISSING`` for a required field."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def build_method(cls: type[ContinualMethod], options: Mapping[str, Any], env: RunEnv) -> ContinualMethod:
    """Instantiate a method class with its typed config built from ``options``."""
    return cls(cls.config_cls.from_options(options, section=cls.name), env=env)
