"""``dap.deterministic``: on a GPU, torch's deterministic kernels and the math attention kernel; off again after the
run; never part of the run id (benchmark.engine.environment.apply_determinism)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from benchmark.api import planned_run_ids
from benchmark.config import apply_overrides, profile_config
from benchmark.engine.environment import apply_determinism, make_accelerator

CUDA = torch.backends.cuda


def _kernels() -> tuple:
    import torch.utils.deterministic

    return (
        torch.utils.deterministic.fill_uninitialized_memory,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        CUDA.flash_sdp_enabled(),
        CUDA.mem_efficient_sdp_enabled(),
        CUDA.cudnn_sdp_enabled(),
    )


@pytest.fixture
def restored_kernels(monkeypatch):
    """Whatever a test sets, the process's kernel choice afterwards is what it was before."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = _kernels()
    yield before
    apply_determinism(False)
    torch.utils.deterministic.fill_uninitialized_memory = before[0]
    torch.use_deterministic_algorithms(before[1], warn_only=before[2])
    switches = (CUDA.enable_flash_sdp, CUDA.enable_mem_efficient_sdp, CUDA.enable_cudnn_sdp)
    for allow, enabled in zip(switches, before[3:], strict=True):
        allow(enabled)


def test_deterministic_kernels_are_set_and_undone_to_what_they_were(restored_kernels, monkeypatch):
    CUDA.enable_cudnn_sdp(False)  # a user's own choice, which the run must hand back
    before = _kernels()
    apply_determinism(True)
    apply_determinism(True)  # asked twice (two runs in one process): undone to the first state all the same
    # the atomic-add attention kernels are off: only the math kernel, deterministic under warn_only, is left; new
    # tensors are not filled with NaN (a launch per allocation)
    assert _kernels() == (False, True, True, False, False, False)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    apply_determinism(False)
    assert _kernels() == before


def test_a_users_cublas_workspace_setting_is_kept(restored_kernels, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    apply_determinism(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_a_cpu_run_is_left_on_torchs_default_kernels(restored_kernels, tiny_config):
    config = apply_overrides(dataclasses.replace(tiny_config, device="cpu"), ["dap.deterministic=true"])
    make_accelerator(config)
    assert _kernels() == restored_kernels  # CPU kernels are deterministic already: nothing to change, no number moves


def test_the_switch_is_not_part_of_the_run_id(tiny_config):
    plain = planned_run_ids(tiny_config)
    assert planned_run_ids(apply_overrides(tiny_config, ["dap.deterministic=true"])) == plain
    assert profile_config("gpu-small").dap.deterministic  # the GPU group's records are made to be re-derived
