"""CUDA-graph timing for the scripts that import `graph_timing` from this folder
(hooks_bench.py, dev/decode_sweep.py): the function lives in flashgen.perf.graph_timing."""

from __future__ import annotations

from flashgen.perf.graph_timing import timed

__all__ = ["timed"]
