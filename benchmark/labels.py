"""Leaderboard row labels: a method's name and the options that differ from its defaults, ``das[mask_target=update]``
or ``ncl[replay.general=0.05,schedule.name=wsd]``. One place writes and reads them, so the run that labels a record,
the report that groups its rows and the CLI that refuses a label given as a method agree on the form. Nothing here
imports torch or the report: every layer may ask it."""

from __future__ import annotations

import re
from collections.abc import Iterable

_LABEL = re.compile(r"(?P<method>[^\[\],]+)(?:\[(?P<options>[^\[\]]*)\])?")
"""A label's form: a name without brackets or commas, then optionally ``[options]``."""


def join_label(method: str, options: Iterable[str]) -> str:
    """``method[a=1,b=2]`` from the method and its ``key=value`` options in canonical order; the bare method name when
    there are none. A comma separates options, so a value never holds one (lists join their items with ``+``)."""
    kept = [option for option in options if option]
    return f"{method}[{','.join(kept)}]" if kept else method


def split_label(label: str) -> tuple[str, list[str]]:
    """The method and the ``key=value`` options of a label (``[]`` at the defaults): the inverse of
    :func:`join_label`. A text not of a label's form (:func:`well_formed`) is a name without options."""
    match = _LABEL.fullmatch(label)
    if match is None:
        return label, []
    options = match["options"]
    return match["method"], options.split(",") if options else []


def label_method(label: str) -> str:
    """The method of a label: ``das`` for ``das[mask_target=update]``."""
    return split_label(label)[0]


def is_row_label(text: str) -> bool:
    """Whether ``text`` has a label's options (``name[key=value,...]``), as opposed to a bare method name."""
    method, options = split_label(text)
    return bool(options) and bool(method)


def well_formed(label: str) -> bool:
    """Whether ``label`` has a label's form (:data:`_LABEL`)."""
    return _LABEL.fullmatch(label) is not None


def option_pairs(label: str) -> list[tuple[str, str]]:
    """The ``(key, value)`` pairs of a label's options, in its order."""
    return [(key, value) for key, _, value in (option.partition("=") for option in split_label(label)[1])]
