"""Where a hooked call's time goes (H200): per document-mask row (hooks_bench's 16 random
documents and 256-token documents; d 64 and 128, T 4096 and 16384), the events wall time of
back-to-back calls, the flashgen kernel's GPU time and all GPU time (torch.profiler), a CUDA
graph replay of the call (no host work) and the host's enqueue time per call. Wall well above
the GPU times with the enqueue time near the wall: the front door's host work is the limit.

    python3 scripts/dev/hook_host_cost.py [--bwd]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def gpu_us(torch: Any, fn: Callable[[], Any], n: int = 10) -> tuple[float, float]:
    """(flashgen kernels', all kernels') GPU microseconds per call (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    ours = every = 0.0
    for e in prof.events():
        if e.device_type.name == "CUDA":
            every += e.device_time_total
            ours += e.device_time_total if "flash_" in e.name else 0.0
    return ours / n, every / n


def graph_us(torch: Any, fn: Callable[[], Any], time_us: Callable[..., float]) -> float:
    """A CUDA graph of one call, replayed back to back (microseconds per replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_us(torch, graph.replay)


def host_us(torch: Any, fn: Callable[[], Any], n: int = 30) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    spent = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return spent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bwd", action="store_true", help="forward + backward calls")
    args = ap.parse_args()
    import torch
    from mask_rows import documents, inputs, shapes, time_us

    import flashgen.torch as fgt
    from flashgen.generator.hooks import library

    doc = library.document_hook()
    for d, t, b, h in shapes():
        q, k, v, do = inputs(torch, d, t, b, h, args.bwd)
        for name, ids in documents(torch, t):

            def call(ids: Any = ids, qkv: Any = (q, k, v), do: Any = do) -> Any:
                o = fgt.attention(*qkv, mask_mod=doc, aux={"doc_ids": ids})
                return torch.autograd.grad(o, qkv, do) if args.bwd else o

            wall = time_us(torch, call)
            ours, every = gpu_us(torch, call)
            replay = graph_us(torch, call, time_us) if not args.bwd else float("nan")
            host = host_us(torch, call)
            print(
                f"{name:7s} d{d} T{t}: events wall {wall:7.1f} us; flashgen kernels "
                f"{ours:7.1f}; all GPU {every:7.1f}; graph replay {replay:7.1f}; host "
                f"enqueue {host:6.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
