"""CUDA-graph timing, shared by `flashgen bench`'s serving rows (`bench_serving`) and the bench
scripts: a call captured `reps` times in one graph, replayed `times` times, the median per call.
Launch overhead is out of the picture, as it is in serving loops and captured training steps."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from flashgen.perf import bench


def timed(fn: Callable[[], Any], reps: int = 20, times: int = 7,
          warmup_s: float | None = None) -> float:
    """Median microseconds of one call of `fn`, from CUDA-event timings of a graph of `reps`
    calls replayed `times` times, after one eager call and then replays of the graph for at
    least `warmup_s` seconds (None: `bench.WARMUP_S`, which `flashgen bench --warmup-s` sets;
    at least one replay). Without that warm-up the first kernel a process times runs at the
    clock of an idle GPU, before the power cap pulls it down: measured ~10% above the same
    kernel timed later in the process (bench/NOTES.md, session 32)."""
    torch = bench._torch()
    if warmup_s is None:
        warmup_s = bench.WARMUP_S
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(g, stream=stream):
        for _ in range(reps):
            fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    # batches of replays between host checks (~20 ms each), so the GPU never idles meanwhile
    batch = max(1, int(0.02 / max(time.perf_counter() - t0, 1e-6)))
    while time.perf_counter() - t0 < warmup_s:
        for _ in range(batch):
            g.replay()
        torch.cuda.synchronize()
    samples = []
    for _ in range(times):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1000 / reps)
    return float(statistics.median(samples))
