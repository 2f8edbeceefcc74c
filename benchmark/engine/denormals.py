"""Flushing denormal floats to zero on CPU (``dap.flush_denormals``, issue #46).

A float32 below 1.2e-38 is *denormal*; x86 CPUs compute with them through slow microcode, and Intel's far more slowly
than AMD's: on an Intel Xeon with AMX (one thread) a 1024 x 256 x 1024 matrix product takes 7 ms with normal inputs
and 1,095 ms with denormal ones. HAT's gates, sigmoid(s * e) at s up to smax = 400, produce them for every unit whose
s * e falls between about -104 and -87, and the activations and gradients those gates scale follow; a ``mini-pass``
HAT run there trained at 0.30x NCL's tokens per second, against 0.99x on an AMD EPYC.

Flushing (FTZ: results below the normal range become zero; DAZ: such inputs are read as zero) changes a number only
where every term of a sum is below 1.2e-38: one denormal beside any normal float32 of magnitude above about 1e-31 is
already below its rounding unit. So the records are the plain run's (``tests/test_speed_switches.py`` compares
them), and the setting is not in the run id.

The floating-point mode (MXCSR on x86) belongs to each thread. ``torch.set_flush_denormal`` sets the calling thread
only, and torch's CPU kernels run on an OpenMP pool whose threads keep their own (measured: set first thing in a
process, a two-thread product with denormal inputs still took 1,058 ms), so the switch is made on every pool thread
too, by one OpenMP parallel region of the library torch itself loaded (GNU ``libgomp`` on Linux, LLVM
``libomp``, which exports the same entry point, elsewhere).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

_state = {"flushing": False, "threads": 1}
"""What this process last set, and over how many torch threads: every process starts with denormals computed (the
CPU's default). The thread count is part of it because a pool grown since was not set."""

_OPENMP_LIBRARIES = ("libgomp.so.1", "libgomp.so", "libomp.so", "libomp.dylib", "libiomp5.so")
"""The OpenMP runtimes a torch build ships in its ``lib`` folder (the first one present is the one it loaded)."""

_REGION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
"""``void fn(void *)``: the body of a ``GOMP_parallel`` region."""


def flush_denormals(on: bool) -> bool:
    """Flush denormal floats to zero (``on``) or compute them (the default) on this process's CPU threads: the calling
    thread and every thread of torch's OpenMP pool. Returns whether every thread was set (False where the CPU has no
    flush mode or no OpenMP runtime is found: then at most the calling thread is). A no-op when already set for the
    same number of threads."""
    threads = torch.get_num_threads()
    if _state["flushing"] == on and (not on or _state["threads"] == threads):
        return True
    supported = torch.set_flush_denormal(on)
    pool = _set_pool_threads(on, threads) if supported else False
    _state.update(flushing=on, threads=threads)
    return supported and pool


def _set_pool_threads(on: bool, threads: int) -> bool:
    """Run ``torch.set_flush_denormal(on)`` once on each of torch's ``threads`` OpenMP threads (one parallel region of
    that many threads: OpenMP reuses the idle threads of the pool for it)."""
    if threads == 1:
        return True
    runtime = _openmp_runtime()
    if runtime is None:
        return False

    @_REGION
    def each_thread(_data):
        torch.set_flush_denormal(on)

    runtime.GOMP_parallel.argtypes = [_REGION, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    runtime.GOMP_parallel.restype = None
    runtime.GOMP_parallel(each_thread, None, threads, 0)
    return True


def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded, if it ships one with a ``GOMP_parallel`` entry point."""
    lib = Path(torch.__file__).parent / "lib"
    for name in _OPENMP_LIBRARIES:
        if (lib / name).is_file():
            runtime = ctypes.CDLL(str(lib / name))  # already loaded by torch: the same instance, not a second one
            if hasattr(runtime, "GOMP_parallel"):
                return runtime
    return None
