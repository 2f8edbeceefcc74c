"""Threads that fit the machine (issue #88): OpenMP waits passively and the default thread count is the cores this
process may use, each only where the user set nothing."""

import os
import subprocess
import sys

from benchmark.threads import configure_threads, usable_cores


def test_usable_cores_follow_affinity_and_the_cgroup_quota(tmp_path):
    quota = tmp_path / "cpu.max"
    quota.write_text("max 100000\n")
    assert usable_cores(quota) == len(os.sched_getaffinity(0))
    quota.write_text("100000 100000\n")  # one core's worth of time
    assert usable_cores(quota) == 1
    quota.write_text("50000 100000\n")  # half a core: still one thread
    assert usable_cores(quota) == 1
    assert usable_cores(tmp_path / "absent") == len(os.sched_getaffinity(0))


def test_what_the_user_set_is_kept():
    environ = {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}
    configure_threads(environ)
    assert environ == {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}
    empty: dict[str, str] = {}
    configure_threads(empty)
    assert empty == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(usable_cores())}


def test_importing_dapbench_sets_them_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    code = "import benchmark, os, torch; print(os.environ['OMP_WAIT_POLICY'], torch.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["PASSIVE", str(usable_cores())]


def test_runs_side_by_side_share_the_usable_cores():
    from benchmark.threads import threads_per_run

    chosen: dict[str, str] = {}
    configure_threads(chosen)  # dapbench's own choice for one process
    assert threads_per_run(2, chosen) == str(max(1, usable_cores() // 2))
    assert threads_per_run(10 * usable_cores(), {}) == "1"
    assert threads_per_run(2, {"OMP_NUM_THREADS": "3"}) == "3"  # the user's count, whatever the runs
