"""Benchmark scripts of the repository; ``python -m benchmarks …`` is ``lrnn-scan bench …``
(:mod:`lrnn_scan.bench`). The older single-purpose scripts (``scan_throughput.py``,
``fused_companion_throughput.py``, ``delta_throughput.py``) are GPU-only and run as files."""
