"""How a stop signal ends a ``dapbench`` command: SIGTERM (a cluster scheduler's) stops it as Ctrl-C does, a stop
that lands inside a finaliser is delivered again, and a stopping process ignores further signals."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading


@contextlib.contextmanager
def signals_stop_the_run(restore: bool):
    """While a command runs in the main thread: SIGTERM raises like Ctrl-C does, and a stop signal swallowed by a
    finaliser is sent again; with ``restore``, an in-process caller (a Slurm job, a test) gets its own signal
    handlers and unraisable hook back afterwards. Elsewhere (only the main thread may set handlers) nothing changes."""
    if not _main_thread():
        yield
        return
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    unraisable_hook = sys.unraisablehook
    signal.signal(signal.SIGTERM, _raise_terminated)
    sys.unraisablehook = SwallowedStopRedelivery(unraisable_hook)
    try:
        yield
    finally:
        if restore:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            sys.unraisablehook = unraisable_hook


class Terminated(BaseException):
    """SIGTERM, turned into an exception so that the run stops like on Ctrl-C (cluster schedulers send it); a
    BaseException, like KeyboardInterrupt, so that no library's ``except Exception`` swallows it."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


class SwallowedStopRedelivery:
    """A ``sys.unraisablehook`` for the run: a stop signal that lands while a finaliser (``__del__``, a weakref
    callback) runs raises there, where Python can only print the exception and carry on, so the run would neither
    stop nor stay quiet. This hook keeps it quiet and sends the same signal again a moment later, from a helper
    thread, when the finaliser has returned; every other unraisable exception goes to the previous hook."""

    def __init__(self, previous) -> None:
        self.previous = previous

    def __call__(self, unraisable) -> None:
        """Send a swallowed stop signal again shortly; hand anything else to the previous hook."""
        stop = unraisable.exc_value
        if not isinstance(stop, (KeyboardInterrupt, Terminated)):
            self.previous(unraisable)
            return
        signum = signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT
        threading.Timer(0.05, self._send_again, (signum,)).start()

    def _send_again(self, signum: int) -> None:
        if sys.unraisablehook is self:  # still this run's: an in-process caller's own handlers are not targeted
            os.kill(os.getpid(), signum)


def ignore_further_signals() -> None:
    """Ignore SIGINT and SIGTERM from now on (the run is already stopping), where this thread may set handlers."""
    if _main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
