"""Why do two harnesses disagree? Time one flashgen variant and SDPA's cuDNN backend on one
problem, each through both timing loops, in one process (a dev tool for bench/NOTES.md).

    python3 scripts/timing_probe.py NAME [T] [--rounds 3]

The loops: `bench.time_ms` (warm-up, then every rep launched back to back between CUDA events,
one synchronize at the end) and `wgmma_dev.timed`'s (a synchronize after every rep), and for
flashgen both launch paths: `bench.flashgen_runner` (a Bound from runtime.get_function) and
`flashgen.torch.attention`. Rounds interleave everything; the table gives each median TFLOP/s.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgen.torch as fgt
from flashgen.generator.spec import KernelSpec
from flashgen.perf import bench


def synced_ms(fn: Callable[[], Any]) -> float:
    """A synchronize after every rep (scripts/wgmma_dev.py's loop)."""
    return bench.time_ms(fn, warmup=3, reps=30, sync_each=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("t", nargs="?", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    spec = KernelSpec.from_name(args.name)
    case = bench.Case(spec.dtype, spec.d, spec.causal, args.t)
    q, k, v = bench._inputs(case)
    run, _ = bench.flashgen_runner(spec, q, k, v)

    def op() -> Any:
        return fgt.attention(q, k, v, causal=spec.causal, spec=spec)

    def cudnn() -> Any:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=spec.causal)

    impls = {"flashgen runner": run, "flashgen.torch": op, "cudnn": cudnn}
    loops = {"back-to-back": bench.time_ms, "synced": synced_ms}
    got: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for iname, fn in impls.items():
            for lname, loop in loops.items():
                ms = loop(fn)
                got.setdefault((iname, lname), []).append(case.flops / ms / 1e9)
    print(f"{spec.name} T={args.t} B={case.b} H={case.h}: TFLOP/s, median of {args.rounds}")
    for (iname, lname), vals in got.items():
        mid, lo, hi = statistics.median(vals), min(vals), max(vals)
        print(f"  {iname:16} {lname:13} {mid:7.1f}  ({lo:.1f}-{hi:.1f})")


if __name__ == "__main__":
    main()
