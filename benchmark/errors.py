"""The one exception type users see: it names the problem and how to fix it."""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Collection, Iterator


class DapbenchError(Exception):
    """A user-facing error: bad input, missing data, invalid configuration.

    The message always says what is wrong and what to do about it; the CLI prints it without a
    traceback and exits with status 2.
    """

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")


class NonFiniteError(DapbenchError):
    """A loss, score, feature or importance became NaN or infinite: nothing is recorded from it."""


class CorruptStateError(DapbenchError):
    """Saved state (a checkpoint, a cache entry) no longer matches what was written: it is never used."""


class WriteError(DapbenchError):
    """A file could not be written (disk full, no permission); the previous version of it is intact."""

    @classmethod
    def of(cls, path: os.PathLike, exc: BaseException) -> WriteError:
        """The error for ``exc`` (an ``OSError``, or a library's write failure) raised while writing ``path``."""
        return cls(
            f"cannot write {path}: {getattr(exc, 'strerror', None) or exc}; the previous version of the file is kept",
            "free disk space or fix the folder's permissions (or pass another --output-dir / --work-dir),"
            " then run the same command again: finished work is kept",
        )


def did_you_mean(name: str, known: Collection[str], n: int = 3, ignore_case: bool = False, form: str = "{}") -> str:
    """``did you mean 'a' or 'b'?`` naming the up to ``n`` known names closest to ``name`` (matched without case
    where ``ignore_case``, named as registered), written into ``form`` (``" ({})"``: a parenthesis after the
    message), or the empty string where none is close: the one hint every "unknown name" error gives, each error
    placing it in its own sentence."""
    by_key = {(k.lower() if ignore_case else k): k for k in known}
    close = [by_key[m] for m in difflib.get_close_matches(name.lower() if ignore_case else name, list(by_key), n=n)]
    return form.format(f"did you mean {' or '.join(map(repr, close))}?") if close else ""


@contextlib.contextmanager
def error_context(where: str) -> Iterator[None]:
    """Prefix every :class:`DapbenchError` raised inside the block with ``where`` (e.g. the method and domain),
    keeping its type and its fix."""
    try:
        yield
    except DapbenchError as exc:
        raise type(exc)(f"{where}: {exc.problem}", exc.fix) from exc
