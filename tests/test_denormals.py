"""``dap.flush_denormals``: denormal floats flushed to zero on every CPU thread of the process, and back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

PROBE = """
import torch
from benchmark.engine.denormals import flush_denormals

def denormal_results():
    # 2**20 products, split by torch over every thread of its pool; each would be 1e-40, a denormal float32
    return int((torch.full((1 << 20,), 1e-30) * 1e-10 != 0).sum())

assert torch.get_num_threads() == 2, torch.get_num_threads()
before = denormal_results()
assert flush_denormals(True)
flushed = denormal_results()
assert flush_denormals(False)
after = denormal_results()
torch.set_num_threads(1)
assert flush_denormals(True)  # the calling thread alone
torch.set_num_threads(2)
assert flush_denormals(True)  # asked again for a grown pool: its other thread is set too, not skipped as done
grown = denormal_results()
print(before, flushed, after, grown)
"""


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability().startswith("AVX"), reason="an x86 flush mode")
def test_flushing_reaches_every_thread_of_the_pool_and_is_undone():
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before, flushed, after, grown = map(int, done.stdout.split())
    # every product a denormal before, none while flushing (a thread left computing them would keep its share), all
    # again after: the mode is set, and unset, on the pool's threads as well as the calling one; and none once the
    # pool grew after a one-thread flush and the flush was asked again
    assert (before, flushed, after, grown) == (1 << 20, 0, 1 << 20, 0)


def test_a_flush_that_cannot_reach_every_thread_is_refused_by_name(monkeypatch):
    from benchmark.engine import denormals
    from benchmark.engine.environment import apply_float_mode
    from benchmark.errors import DapbenchError

    monkeypatch.setattr(denormals, "_set_pool_threads", lambda on, threads: False)
    with pytest.raises(DapbenchError, match="dap.flush_denormals=true cannot be set on every CPU thread"):
        apply_float_mode(True)
    assert denormals._state["flushing"] is False  # left as the default, for whatever runs next in the process
    assert torch.full((4,), 1e-30).mul(1e-10).ne(0).all()
