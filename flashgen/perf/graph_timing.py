"""CUDA-graph timing, shared by `flashgen bench`'s serving rows (`bench_serving`) and the bench
scripts: a call captured `reps` times in one graph, replayed `times` times, the median per call.
Launch overhead is out of the picture, as it is in serving loops and captured training steps."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from flashgen.perf import bench


def timed(fn: Callable[[], Any], reps: int = 20, times: int = 7) -> float:
    """Median microseconds of one call of `fn`, from CUDA-event timings of a graph of `reps`
    calls replayed `times` times (after one eager call and one warm-up replay)."""
    torch = bench._torch()
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(g, stream=stream):
        for _ in range(reps):
            fn()
    torch.cuda.synchronize()
    g.replay()
    samples = []
    for _ in range(times):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1000 / reps)
    return float(statistics.median(samples))
