"""Benchmark helpers importable from anywhere: interleaved timing and peak memory (``common``) and the adapter
variants the benchmarks compare (``variants``). The runnable benchmarks live in ``benchmarks/`` and are started
from the repository root as ``python -m benchmarks.<name>``."""
