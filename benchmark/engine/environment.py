"""Facts about the machine a run ran on: versions, device, threads, peak memory, code commit."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
from functools import cache
from pathlib import Path

import torch

from benchmark.errors import DapbenchError


@cache
def package_versions() -> dict[str, str]:
    """Versions of the libraries that change results."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "datasets", "accelerate", "peft", "scikit-learn", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def make_accelerator(config):
    """The run's ``accelerate.Accelerator``: CPU when asked or when no GPU is present, the configured mixed
    precision on a GPU. Under ``accelerate launch``/``torchrun`` with several processes, DDP over every
    process; ``find_unused_parameters`` because several methods leave parameters out of some steps (the
    experts of other domains, masked units, a replay pass that only runs once the buffer holds data). Sets the
    process's denormal mode (``dap.flush_denormals``) and, on a GPU, its choice of kernels (``dap.deterministic``)
    first: every run and bench builds its accelerator before any work."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    cpu = _on_cpu(config)
    state = process_state(config)
    apply_float_mode(config.dap.flush_denormals)
    apply_determinism(config.dap.deterministic and not cpu)
    precision = cpu_mixed_precision(config.dap.mixed_precision) if cpu else config.dap.mixed_precision
    _allow_precision(precision, state.num_processes)
    trackers = {} if config.report_to == "none" else {"log_with": config.report_to}
    return Accelerator(
        cpu=cpu,
        mixed_precision=precision,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        project_dir=str(Path(config.output_dir) / "tracking"),
        **trackers,
    )


def apply_float_mode(flush: bool) -> None:
    """Set this process's denormal mode to the run's ``dap.flush_denormals`` (also back to the default, so that a run
    after a flushing one in the same process computes as it would alone); refuse, before any work, a flush that
    would reach only some of the threads."""
    from benchmark.engine.denormals import flush_denormals

    if not flush_denormals(flush) and flush:
        flush_denormals(False)
        raise DapbenchError(
            "dap.flush_denormals=true cannot be set on every CPU thread here (no flush mode on this CPU, or no OpenMP"
            f" runtime found in torch's lib folder for its {torch.get_num_threads()} threads)",
            "leave dap.flush_denormals=false, or run with OMP_NUM_THREADS=1",
        )


CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"
"""cuBLAS's workspace setting under which its kernels repeat bit for bit (NVIDIA's cuBLAS reproducibility notes)."""


_ATOMIC_ATTENTION = ("flash", "mem_efficient", "cudnn")
"""torch's attention kernels whose backward pass accumulates with atomic adds (kept so under ``warn_only``)."""
_attention_before: dict[str, bool] = {}
"""Which of them were enabled before a deterministic run turned them off (restored after it)."""


def apply_determinism(on: bool) -> None:
    """Set this process's choice of kernels to the run's ``dap.deterministic`` on a GPU (and back afterwards, so that
    a run after a deterministic one in the same process computes as it would alone).

    Attention runs on the math kernel: the flash, memory-efficient and cuDNN kernels accumulate their backward pass
    with atomic adds, and torch keeps them so under ``warn_only``. Other ops without a deterministic kernel warn (the
    warning names them) rather than stop a run that is already under way. cuBLAS reads its workspace setting when it
    first starts, which a run's accelerator precedes; a value the user set is kept. Deterministic mode would also
    fill every new tensor with NaN (a guard against reading memory before writing it, which no run does: its
    non-finite checks would stop it): that is one more kernel launch per allocation in a host-bound run, so it stays
    off; no number depends on it."""
    import torch.utils.deterministic

    cuda = torch.backends.cuda
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC_WORKSPACE)
        for kind in _ATOMIC_ATTENTION:
            _attention_before.setdefault(kind, getattr(cuda, f"{kind}_sdp_enabled")())
            getattr(cuda, f"enable_{kind}_sdp")(False)
    else:
        for kind, enabled in _attention_before.items():
            getattr(cuda, f"enable_{kind}_sdp")(enabled)
        _attention_before.clear()
    torch.use_deterministic_algorithms(on, warn_only=on)
    torch.utils.deterministic.fill_uninitialized_memory = not on  # torch's default when off


def cpu_mixed_precision(asked: str) -> str:
    """The mixed precision a run on CPU trains in: bf16 autocast when ``dap.mixed_precision=bf16`` asks for it (about
    twice the update rate on CPUs with AVX-512 BF16, measured; issue #46), else float32. ``fp16``, the GPU default,
    stays float32 on CPU, as it always has: CPUs gain nothing from it, and CPU records made under it are float32.

    As on a GPU, autocast covers the DAP updates and the end-task fine-tunes; held-out evaluation always runs in
    float32, so a bf16 run's losses are measured like a float32 run's. The setting enters the run's identity and its
    leaderboard group: a bf16 run is never mixed with float32 ones."""
    return "bf16" if asked == "bf16" else "no"


def _allow_precision(precision: str, num_processes: int) -> None:
    """Let this process's next ``Accelerator`` take ``precision``. accelerate keeps one mixed precision per process
    and refuses another; a single process that runs configurations of both kinds one after the other (the Python
    API, a test) is a normal use here, so its accelerator state (not its process state) is started afresh. Under
    several processes every process runs one configuration, so nothing is reset and accelerate's refusal stands."""
    from accelerate.state import AcceleratorState

    if num_processes == 1 and AcceleratorState._shared_state.get("_mixed_precision", precision) != precision:
        AcceleratorState._reset_state()


def process_state(config):
    """The processes of this run (accelerate's ``PartialState``: one, or those of ``accelerate launch`` /
    ``torchrun``). The first call fixes it for the process, so it is made here, knowing whether the run is on
    CPU: without that, processes launched on a machine without GPUs would each think they were alone."""
    from accelerate import PartialState

    return PartialState(cpu=_on_cpu(config))


def _on_cpu(config) -> bool:
    """Whether the run is on CPU: asked for, or no GPU present."""
    return config.device == "cpu" or not torch.cuda.is_available()


UNSUPPORTED_ENGINES = {"ACCELERATE_USE_FSDP": "accelerate's FSDP", "ACCELERATE_USE_DEEPSPEED": "DeepSpeed"}
"""accelerate's switches for engines that shard parameters: dapbench shards with FSDP2 itself (``dap.sharding``)."""


def require_supported_engine(environ=os.environ) -> None:
    """Refuse, before any work, accelerate's own sharding engines: accelerate enables FSDP only on GPU-class
    setups (on a CPU it would silently run DDP) and knows nothing of the methods' hooks; dapbench's sharding is
    ``dap.sharding=fsdp`` (:mod:`benchmark.acceleration.sharding`), checked method by method."""
    asked = [name for key, name in UNSUPPORTED_ENGINES.items() if environ.get(key, "").lower() in ("1", "true", "yes")]
    if asked:
        raise DapbenchError(
            f"{asked[0]} is not how dapbench shards a run: it would bypass the methods' checks (and on a CPU run DDP)",
            "launch without --use_fsdp/--use_deepspeed and pass --set dap.sharding=fsdp (methods that support it:"
            " dapbench list)",
        )


def require_sharding_support(method_cls, sharding: str) -> None:
    """Refuse, before any work, a sharded run of a method whose hooks act on whole parameters, with its reason."""
    if sharding == "fsdp" and method_cls.fsdp_refusal:
        raise DapbenchError(
            f"method {method_cls.name!r} cannot train with dap.sharding=fsdp: {method_cls.fsdp_refusal}",
            "train it unsharded (dap.sharding=none), or choose a method that supports sharding (dapbench list)",
        )


def require_multi_process_support(method_cls, num_processes: int) -> None:
    """Refuse, before any work, a method not verified to train correctly with several processes."""
    if num_processes > 1 and not method_cls.multi_process:
        raise DapbenchError(
            f"method {method_cls.name!r} is not verified for multi-process training ({num_processes} processes):"
            " what it computes over batches or data (buffers, statistics) is not synchronised across processes yet",
            "run it with one process per run (spread a grid with --launcher local:N or slurm)",
        )


def environment_facts(accelerator) -> dict:
    """What a record needs to say where its numbers came from (``RunRecord.environment``)."""
    return {
        "versions": package_versions(),
        "git_commit": git_commit(),
        "device": str(accelerator.device),
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
        "torch_threads": torch.get_num_threads(),
        "cpu_kernels": cpu_kernels(),
        "cpu_model": cpu_model(),
        "cpu_load_per_core": cpu_load_per_core(),
    }


def cpu_load_per_core() -> float | None:
    """The machine's 5-minute load average per core this process may use, as the run ends: above about 1, runs
    shared the cores with more work than they had cores for, and tokens/s measured so compare only with runs made
    under such load (``report/speed.py``); None where the system does not say."""
    from benchmark.threads import usable_cores

    try:
        return round(os.getloadavg()[1] / usable_cores(), 2)
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), so that speeds are compared only between runs on the same machine.

    ``device_name`` says "cpu" for every CPU run and ``cpu_kernels`` only its instruction set: two CPUs with the same
    kernels can differ twofold in tokens per second."""
    with contextlib.suppress(OSError, StopIteration):
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    import platform

    return platform.processor() or "cpu"


def cpu_kernels() -> str:
    """The instruction set of the CPU float kernels torch dispatches to here ("AVX2", "AVX512", ...).

    Two CPUs with other kernels round some sums differently, so a record says which made it: numbers that amplify
    rounding (DAS's reference-code importance, a unit on a histogram's bin edge) can differ between them.
    """
    return torch.backends.cpu.get_cpu_capability()


def memory_kind() -> str:
    """What :func:`peak_memory_mb` measures on this machine."""
    return "cuda_max_allocated" if torch.cuda.is_available() else "cpu_peak_rss_per_domain"


def reset_peak_memory() -> None:
    """Start a new peak: CUDA's allocator statistics, or Linux's per-process RSS high-water mark."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)


def peak_memory_mb() -> float:
    """Peak since the last reset: CUDA max allocated, else VmHWM (else the process-lifetime max RSS)."""
    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return round(int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def git_commit(checkout: Path | None = None) -> str | None:
    """The checkout's commit (``-dirty`` when it has uncommitted changes); outside a git checkout, the commit a copy
    of the code says it was made from (``DAPBENCH_GIT_COMMIT``), else None.

    Generated outputs (``results/``, ``leaderboard.md``) do not count: records written into the checkout by
    an earlier run of the same command would otherwise mark every later record dirty."""
    here = checkout or Path(__file__).resolve().parent
    code = [":(top)", ":(top,exclude)results", ":(top,exclude)leaderboard.md"]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *code], cwd=here, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        # A copy of the code without its .git (a container image, a synced tree) names its commit itself.
        return os.environ.get("DAPBENCH_GIT_COMMIT") or None
    return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
