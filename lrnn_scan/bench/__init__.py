"""Benchmarks users can run: ``lrnn-scan bench`` (also ``python -m lrnn_scan.bench`` and, from a
checkout, ``python -m benchmarks``).

Scan-level and layer-level throughput across block sizes ``m`` in the three views of the
H-LRU/BD-LRU paper's Fig. 5 — (A) fixed number of blocks, (B) fixed hidden size, (C)
parameter-matched layers — forward and forward+backward: ms, tokens/s, peak memory and achieved
bandwidth against a copy bandwidth measured in the same run; optional peers; the FLOPs-per-step
table (Table 5). See ``docs/benchmarks.md``. Importing this package imports nothing heavy.
"""
from .cli import add_subparser, main

__all__ = ["main", "add_subparser", "run", "Config", "flops_table"]


def __getattr__(name):  # lazy: keep ``import lrnn_scan.bench`` cheap
    if name == "run":
        from .runner import run
        return run
    if name == "Config":
        from .suite import Config
        return Config
    if name == "flops_table":
        from .flops import flops_table
        return flops_table
    raise AttributeError(name)
