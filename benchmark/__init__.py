"""dapbench: a benchmark harness for continual domain-adaptive pre-training of masked LMs."""

__version__ = "0.1.0"
