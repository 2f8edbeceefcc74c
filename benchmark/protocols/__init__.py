"""End-task protocols: how a stage's model is scored on an end task (issue #48: one place defines each variation
point). One registered object per protocol, one module each: ``finetune`` (the paper's: train the whole classifier),
``linear_probe`` (a logistic regression on frozen features) and ``lm_eval`` (lm-evaluation-harness log-likelihood
scoring of a decoder, zero-shot, over the end task's label words).

A protocol is an :class:`EndTaskProtocol`: what it scores (a classifier the method builds, or the stage's language
model as the method serves the task's domain), the checks a run must pass before it trains, and ``evaluate``, which
returns the cell's scores and test predictions. Adding one is a module with a subclass and :func:`register_protocol`
(a plugin's own module may do it), its test and a line of docs: ``finetune.protocol`` accepts every registered name.
"""

from benchmark.method import CLASSIFIER, LANGUAGE_MODEL
from benchmark.protocols import finetune, linear_probe, lm_eval  # the built-ins register themselves on import
from benchmark.protocols.base import EndTaskProtocol
from benchmark.protocols.registry import (
    PROTOCOLS,
    get_protocol,
    protocol_caveat,
    protocol_phrase,
    protocol_short,
    protocol_words,
    protocols_of,
    register_protocol,
)

__all__ = [
    "CLASSIFIER",
    "LANGUAGE_MODEL",
    "PROTOCOLS",
    "EndTaskProtocol",
    "finetune",
    "get_protocol",
    "linear_probe",
    "lm_eval",
    "protocol_caveat",
    "protocol_phrase",
    "protocol_short",
    "protocol_words",
    "protocols_of",
    "register_protocol",
]
