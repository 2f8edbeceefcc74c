"""Base models made by a recipe on first use (``--model recipe:<name>``), cached in the work folder under a name that
hashes the recipe: a corpus and a :class:`BaseModelSpec`, trained by ``dapbench pretrain-base`` in a child process
with pinned CPU arithmetic (one thread, AVX2 kernels: :func:`pinned_numerics_env`, so every x86-64 machine with AVX2
builds the same weights), or a shared model with its weights rounded to half precision (:class:`Rounded`:
byte-identical on every machine, from the float32 original or a half-precision copy).
A record names such a model ``local:<name>`` and its checksum; ``dapbench reproduce`` rebuilds it from the
profile's recipe, and the checksum says whether it is the same model.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmark.data.pretrain import BaseModelSpec
from benchmark.errors import DapbenchError
from benchmark.io import atomic_directory, built_once

RECIPE = "recipe:"


PINNED_NUMERICS = "x86-64: ATen kernels at AVX2, MKL CBWR AVX2 strict; one thread"
"""What a recipe build pins (part of its fingerprint, so changing the pins changes the cache folder's name)."""


def pinned_numerics_env(machine: str | None = None) -> dict[str, str]:
    """The environment that gives a CPU build the same arithmetic on every machine of one architecture.

    Why: float sums in another order round differently, and 1500 updates amplify that into other weights. On
    x86-64 ATen's vectorised kernels follow the widest instruction set the CPU has (AVX-512 here, AVX2 there) and
    MKL picks its GEMM code path per processor; pinning both to AVX2 (the widest level nearly every x86-64 server
    and laptop has) and using one thread makes the order the same everywhere. Other architectures get one thread
    only: their builds agree with each other per CPU type, and the record's model checksum tells them apart.
    """
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if (machine or platform.machine()).lower() in {"x86_64", "amd64"}:
        env |= {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT"}
    return env


@dataclass(frozen=True)
class Recipe:
    """A base model to build: the corpus it is trained on (under the shared assets folder) and its spec."""

    corpus: str
    """Relative to the shared assets folder (``DAPBENCH_SHARED``)."""
    spec: BaseModelSpec
    description: str

    source_kind = "corpus"

    @property
    def source(self) -> str:
        """What the build reads, relative to the shared assets folder."""
        return self.corpus

    def fingerprint(self) -> dict:
        """Every field that decides the built weights (the cache folder's name hashes it)."""
        return {"corpus": self.corpus, **asdict(self.spec), "numerics": PINNED_NUMERICS}

    def build(self, name: str, source: Path, out: Path, show_progress: bool, echo: Callable[[str], None]) -> None:
        """Pre-train the model at ``out`` in a child process with pinned arithmetic (:func:`pretrain_pinned`)."""
        echo(f"{name}: pre-training {self.description} (once; {self.spec.steps} updates on one thread)")
        pretrain_pinned(source, out, self.spec, name=name, show_progress=show_progress)


def pretrain_pinned(
    corpus: Path,
    out: Path,
    spec: BaseModelSpec,
    vocab_corpora: list[Path] | None = None,
    name: str = "base model",
    show_progress: bool = False,
) -> None:
    """``dapbench pretrain-base`` of ``corpus`` into ``out``, run in a child process with pinned arithmetic
    (:func:`pinned_numerics_env`), so that every machine of one architecture builds the same weights.

    Why a child: ATen picks its kernels' instruction set and MKL its code path once per process, from the
    environment, before the first operation; a run that has already computed cannot change them any more.
    """
    job = {"corpus": str(corpus), "out": str(out), "spec": asdict(spec), "progress": show_progress}
    job["vocab_corpora"] = [str(c) for c in vocab_corpora] if vocab_corpora else None
    done = subprocess.run(
        [sys.executable, "-m", "benchmark.data.bases", json.dumps(job)],
        env={**os.environ, **pinned_numerics_env()},
        stderr=None if show_progress else subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stderr or "").strip().splitlines()[-15:]) or "(its output is above)"
        raise DapbenchError(
            f"building the base model {name!r} failed (exit {done.returncode}):\n{tail}",
            f"fix the cause and run again; nothing was cached, so the next run rebuilds {Path(out).name}",
        )


@dataclass(frozen=True)
class Rounded:
    """A shared model directory with every floating-point weight rounded to ``dtype`` and stored back as float32.

    Why: a half-precision copy is half the bytes to carry to a machine that cannot reach the shared folder (a lent GPU
    takes at most 64 MiB per call), and rounding is idempotent, so the float32 original and such a copy build the
    same files, and the same checksum, everywhere."""

    model: str
    """Relative to the shared assets folder (``DAPBENCH_SHARED``)."""
    dtype: str
    description: str

    source_kind = "model"

    @property
    def source(self) -> str:
        """What the build reads, relative to the shared assets folder."""
        return self.model

    def fingerprint(self) -> dict:
        """Every field that decides the built weights (the cache folder's name hashes it)."""
        return {"model": self.model, "dtype": self.dtype}

    def build(self, name: str, source: Path, out: Path, show_progress: bool, echo: Callable[[str], None]) -> None:
        """Write the rounded copy at ``out``."""
        echo(f"{name}: building {self.description} (once)")
        write_rounded(source, out, getattr(torch, self.dtype))


RECIPES: dict[str, Recipe | Rounded] = {
    "general-causal": Recipe(
        corpus="data/general/train.txt",
        spec=BaseModelSpec(
            vocab_size=8000,
            hidden_size=256,
            num_layers=4,
            num_heads=8,
            kv_heads=2,
            intermediate_size=640,
            seq_len=128,
            steps=1500,
            batch_size=16,
            lr=1e-3,
            causal=True,
        ),
        description="a Llama-style decoder (4 layers, hidden 256, 8 query / 2 key-value heads) trained on the general"
        " corpus: the base model of the mini-causal profile",
    ),
    "small-half": Rounded(
        model="models/small",
        dtype="float16",
        description="the shared small model with its weights rounded to float16: the base model of the gpu-small"
        " profile",
    ),
}


def build_recipe(
    model: str, work_dir: str | Path, show_progress: bool = False, echo: Callable[[str], None] = print
) -> Path:
    """The directory of the base model ``recipe:<name>`` names, built now if it is not cached yet."""
    from benchmark.config import shared_root

    name = model.removeprefix(RECIPE)
    if name not in RECIPES:
        raise DapbenchError(f"unknown base-model recipe {name!r}", f"known recipes: {', '.join(RECIPES)}")
    recipe = RECIPES[name]
    source = shared_root() / recipe.source
    digest = hashlib.sha256(json.dumps(recipe.fingerprint()).encode()).hexdigest()[:8]
    out = Path(work_dir) / "bases" / f"{name}-{digest}"
    if not out.exists() and not source.exists():
        raise DapbenchError(f"the {recipe.source_kind} of recipe {name!r} is missing: {source}", "set DAPBENCH_SHARED")
    return built_once(out, lambda: recipe.build(name, source, out, show_progress, echo))


def write_rounded(source: Path, out: Path, dtype: torch.dtype) -> None:
    """``source``'s model directory at ``out`` (written atomically), its floating-point weights rounded to ``dtype``
    and stored as float32; the other files (config, tokenizer) copied as they are."""
    from safetensors.torch import load_file, save_file

    if not any(source.glob("*.safetensors")):
        raise DapbenchError(f"{source} holds no .safetensors weights", "point the recipe at a model directory")

    def fill(tmp: Path) -> None:
        for file in sorted(source.iterdir()):
            if file.suffix == ".safetensors":
                tensors = load_file(file)
                rounded = {k: _rounded(tensors[k], dtype) for k in sorted(tensors)}
                save_file(rounded, tmp / file.name, metadata={"format": "pt"})
            elif file.is_file():
                shutil.copyfile(file, tmp / file.name)

    atomic_directory(out, fill)


def _rounded(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype).float().contiguous() if tensor.is_floating_point() else tensor.contiguous()


def _build_in_this_process(job: dict) -> None:
    """The child side of :meth:`Recipe.build`: pre-train with the environment the parent pinned."""
    from benchmark.data.pretrain import pretrain_base

    numerics = {key: os.environ[key] for key in sorted(pinned_numerics_env()) if key in os.environ}
    torch.set_num_threads(1)
    pretrain_base(
        job["corpus"],
        job["out"],
        BaseModelSpec(**job["spec"]),
        vocab_corpora=job.get("vocab_corpora"),
        show_progress=job["progress"],
        provenance=numerics,
    )


if __name__ == "__main__":
    _build_in_this_process(json.loads(sys.argv[1]))
