"""dapbench: a benchmark harness for continual domain-adaptive pre-training of language models (masked and causal)."""

from benchmark.threads import configure_threads

__version__ = "0.1.0"

configure_threads()  # before anything loads PyTorch's OpenMP runtime, which reads these settings once
