"""The end-task protocol contract (:class:`EndTaskProtocol`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from benchmark.method import CLASSIFIER
from benchmark.settings import settings_view


def test_sizes(ft: dict) -> str:
    """The end-task sample sizes of a record's ``config.finetune`` in words."""
    return f"<= {ft['max_train_examples'] or 'all'} train / {ft['max_test_examples'] or 'all'} test examples"


@dataclass(frozen=True)
class ScoringSettings:
    """The settings of a protocol that trains nothing and reads nothing of its own: the batch size of its forward
    passes over a split. Every protocol's settings extend it."""

    eval_batch_size: int


class EndTaskProtocol:
    """How one cell A[t][k] is scored: :meth:`evaluate` returns ``acc``, ``macro_f1``, ``micro_f1`` (fractions), the
    test ``predictions`` in the order of ``task.test_labels``, and any timings of its own."""

    name: ClassVar[str]
    """``finetune.protocol`` value; also what records store."""
    words: ClassVar[str]
    """The protocol in words for progress lines (``linear probe``)."""
    short: ClassVar[str]
    """A few words for group headings (``probe``)."""
    scores: ClassVar[str] = CLASSIFIER
    """What it scores: :data:`benchmark.method.CLASSIFIER` or :data:`benchmark.method.LANGUAGE_MODEL`."""
    trains: ClassVar[bool] = False
    """Whether it trains the scored model (its scores then depend on the fine-tune seed)."""
    reads: ClassVar[tuple[str, ...] | None] = None
    """The ``finetune`` settings its numbers depend on (None: all of them). Groups whose configurations differ only
    in settings their protocol does not read are scored alike (the budget ladder reads them as rungs)."""
    settings: ClassVar[type] = ScoringSettings
    """Its own typed settings: a frozen dataclass whose fields are the :class:`~benchmark.config.FinetuneConfig` fields
    :meth:`evaluate` reads, handed to it by name (:meth:`settings_of`). The run's config keeps one ``finetune``
    section, the union of every protocol's fields, because a run's id is the digest of that section as records have
    always written it."""
    caveat: ClassVar[str] = ""
    """What a reader of its end-task table should keep in mind (the leaderboard prints it under the table); empty:
    nothing beyond the table's own words."""

    def settings_of(self, cfg) -> object:
        """This protocol's :attr:`settings`, read from a run's ``finetune`` section (a
        :class:`~benchmark.config.FinetuneConfig`) by field name."""
        return settings_view(self.settings, cfg)

    def describe(self, ft: dict) -> str:
        """One phrase for the report on how a group's end tasks were scored, from a record's ``config.finetune``."""
        return f"{self.words}, {test_sizes(ft)}"

    def check(self, config, data) -> None:
        """Refuse, with a named error before anything trains, a run this protocol cannot score (``config``: the
        :class:`~benchmark.config.RunConfig`, ``data``: its prepared ``RunData``)."""

    def evaluate(self, model: nn.Module, task, tokenizer, cfg, seed: int, accelerator) -> dict:
        """Score ``model`` on ``task`` (an :class:`~benchmark.data.endtasks.EncodedTask`) under ``cfg``, this protocol's
        :attr:`settings` (:meth:`settings_of`)."""
        raise NotImplementedError
