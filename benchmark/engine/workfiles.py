"""A run's work files (base losses, a finished domain's statistics, an end-task cell): JSON that carries the SHA-256
of its own content, as checkpoints carry a manifest.

A work file is what a resumed run trusts instead of redoing the work, so one that was edited, truncated or holds a
number that is not finite must never reach a record. :func:`finished` is how the runner asks whether a unit of
work is done: an intact file says yes; a corrupt one is named on stderr, moved aside (``<name>.corrupt``, kept for
whoever wants to look: dapbench deletes nothing of it) and reported as not done, so the unit is rebuilt instead of
blocking the folder.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmark.errors import CorruptStateError
from benchmark.io import atomic_write_json, json_default, read_json

CHECKSUM = "dapbench_sha256"
"""The key of a work file that holds the SHA-256 of its ``content``."""


def write_work_file(path: Path, content: Any) -> None:
    """Write ``content`` (finite numbers only) to ``path`` with its checksum, atomically."""
    try:  # as it will read back: numpy values as numbers, every key a string
        plain = json.loads(json.dumps(content, default=json_default, allow_nan=False))
    except ValueError as exc:
        bad = _first_non_finite(content)
        raise CorruptStateError(f"work file {path} would hold a non-finite number ({bad})", _FIX_WRITER) from exc
    atomic_write_json(path, {CHECKSUM: _sha256(plain, path), "content": plain})


def read_work_file(path: Path, what: str) -> Any:
    """The content of the work file at ``path``; :class:`CorruptStateError` if it is not what dapbench wrote."""
    stored = read_json(path, what)
    if not isinstance(stored, dict) or set(stored) != {CHECKSUM, "content"}:
        raise CorruptStateError(f"{what} {path} carries no checksum", _advice(path))
    if _sha256(stored["content"], path) != stored[CHECKSUM]:
        raise CorruptStateError(f"{what} {path} was changed after dapbench wrote it (checksum differs)", _advice(path))
    return stored["content"]


def finished(path: Path, what: str, is_main_process: bool = True) -> bool:
    """Whether the unit of work whose file is ``path`` is done: the file exists and is intact. A corrupt file is named,
    moved aside by the main process and counted as not done (the runner rebuilds it)."""
    if not path.exists():
        return False
    try:
        read_work_file(path, what)
    except Exception as exc:  # noqa: BLE001 - any unreadable, edited or non-finite file is rebuilt, never trusted
        if is_main_process:
            aside = path.with_name(path.name + ".corrupt")
            print(f"dapbench: {exc}; moved to {aside.name} and rebuilt", file=sys.stderr)
            path.replace(aside)
        return False
    return True


def _sha256(content: Any, path: Path) -> str:
    """The SHA-256 of ``content``'s canonical JSON; a number that is not finite (an edited file) is refused."""
    try:
        text = json.dumps(content, sort_keys=True, allow_nan=False)
    except ValueError as exc:
        bad = _first_non_finite(content)
        raise CorruptStateError(f"work file {path} holds a number that is not finite ({bad})", _advice(path)) from exc
    return hashlib.sha256(text.encode()).hexdigest()


def _first_non_finite(value: Any, where: str = "content") -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} = {value}"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if found := _first_non_finite(item, f"{where}.{key}"):
            return found
    return ""


_FIX_WRITER = "this is a bug of the code that measured it (a method plugin's report, or dapbench): report it"


def _advice(path: Path) -> str:
    return f"run the same command again: the work of {path.name} is redone (the file is moved aside first)"
