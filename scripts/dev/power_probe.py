"""Throughput beside SM clock and board power, per implementation, on one bench case (GPU host).

    python3 scripts/dev/power_probe.py OUT.json IMPL [IMPL ...] [--t 16384] [--d 128] [--causal]
        [--dtype bf16] [--seconds 3] [--rounds 2]

IMPL is a flashgen variant name or a peer (`fa4`, `sdpa-cudnn`, `sdpa-flash`), optionally with
`@bshd`: then it reads q, k and v from (B, T, H, d) memory (the layout a model's projections
leave, and FA4's own; seen as a (B, H, T, d) view) instead of contiguous (B, H, T, d); a wgmma
variant may add `#tiles` or `#persistent` to force its grid (a block per query tile, or one
block per SM) instead of the host's choice (schedulers.PERSISTENT_MAX_KEY_TILES). Each IMPL runs
back to back for `--seconds` (after a warm-up), round after round (interleaved), while
`nvidia-smi` samples the SM clock and the power draw every 50 ms; the JSON and the table give
each burst's TFLOP/s, median clock and median power. The H200 caps board power at 700 W, so
the clock under load is set by the energy each kernel spends per operation: two kernels at the
same tensor-pipe utilisation can differ in speed by their clocks alone. Why it exists: to
tell a scheduling gap (same clock, lower throughput) from an energy gap (lower clock).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from flashgen.generator import schedulers
from flashgen.generator.features import FeatureArgs
from flashgen.generator.spec import KernelSpec
from flashgen.perf import bench
from flashgen.perf.bench_features import WINDOW


def runner(impl: str, case: bench.Case, q: Any, k: Any, v: Any) -> Any:
    """A closure for a flashgen variant name or a peer name (`NAME@bshd`: (B, T, H, d) memory)."""
    impl, _, grid = impl.partition("#")
    grid, _, layout = grid.partition("@") if grid else ("", "", impl.partition("@")[2])
    impl = impl.partition("@")[0]
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    elif layout:
        raise SystemExit(f"layout {layout!r} in {impl}@{layout}: use @bshd or nothing")
    if impl.startswith("flash_"):
        # the grid is chosen when the launch is bound (schedulers.StaticPersistent.grid reads it)
        keep = schedulers.PERSISTENT_MAX_KEY_TILES
        schedulers.PERSISTENT_MAX_KEY_TILES = {"tiles": -1, "persistent": 1 << 30, "": keep}[grid]
        try:
            spec = KernelSpec.from_name(impl)
            # a window variant runs the bench's sliding window (4096 keys back)
            feats = FeatureArgs(window=WINDOW if "window" in spec.features else None)
            run, _ = bench.flashgen_runner(spec, q, k, v, feats)
        finally:
            schedulers.PERSISTENT_MAX_KEY_TILES = keep
        return run
    return bench.peer_runner(impl, q, k, v, case.causal)


def burst(fn: Any, seconds: float) -> tuple[float, list[tuple[float, float]]]:
    """Run `fn` back to back for about `seconds`; milliseconds per call and the
    (clock MHz, power W) samples taken meanwhile."""
    torch = bench._torch()
    # calls per burst from one timed call, so the sampler sees only the loaded GPU
    per = bench.time_ms(fn, warmup=3, reps=5)
    n = max(10, int(seconds * 1000 / per))
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
         "-lms", "50"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.2)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    samples = []
    for line in out.splitlines()[6:]:  # the first ~300 ms include the ramp-up
        parts = [p.strip() for p in line.split(",")]
        try:
            samples.append((float(parts[0]), float(parts[1])))
        except (ValueError, IndexError):
            continue
    return s.elapsed_time(e) / n, samples


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("out")
    ap.add_argument("impls", nargs="+")
    ap.add_argument("--t", type=int, default=16384)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    case = bench.Case(args.dtype, args.d, args.causal, args.t)
    q, k, v = bench._inputs(case)
    fns = {impl: runner(impl, case, q, k, v) for impl in args.impls}
    rows = []
    for r in range(args.rounds):
        for impl, fn in fns.items():
            ms, samples = burst(fn, args.seconds)
            clk = statistics.median(c for c, _ in samples) if samples else float("nan")
            pwr = statistics.median(p for _, p in samples) if samples else float("nan")
            row = {"impl": impl, "round": r, "ms": ms, "tflops": case.flops / ms / 1e9,
                   "clock_mhz": clk, "power_w": pwr, "samples": len(samples)}  # fmt: skip
            rows.append(row)
            print(f"{impl[:60]:60s} r{r} {row['tflops']:6.1f} TFLOP/s  {clk:6.0f} MHz  {pwr:5.0f} W"
                  f"  ({len(samples)} samples)", flush=True)  # fmt: skip
    Path(args.out).write_text(json.dumps({"case": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
