#!/usr/bin/env python3
"""Host overhead per call: flashgen.torch vs torch SDPA (and the GPUArray / NumPy paths).

    python3 scripts/host_overhead.py OUT.json [--calls 2000] [--dtype bf16]

Times, in one process, the median wall time of one call on the problems of issue #11
(B1 H8 T1 d128, B1 H8 T128 d64, B4 H16 T1024 d128; causal and not): flashgen.torch.attention
(the eager fast path), the same op through torch's dispatcher (`torch.ops.flashgen.attention`,
the path torch.compile and autograd take), torch SDPA on the same tensors, flashgen.attention
on GPUArrays and on NumPy arrays, and the two allocations every call makes (O and LSE).
Writes OUT.json (environment, rows, the bar of 1.2x SDPA and whether it holds) and prints a
short table last. Exit code 0 when flashgen.torch is within the bar on every problem, else 1.
Needs torch with CUDA, PyCUDA (for the GPUArray/NumPy rows) and nvcc.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flashgen.cli.app import format_table  # noqa: E402
from flashgen.perf import bench  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="JSON file to write")
    ap.add_argument("--calls", type=int, default=bench.OVERHEAD_CALLS)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    args = ap.parse_args()

    rows = bench.host_overhead(dtype=args.dtype, calls=args.calls)
    ours = [r for r in rows if r.impl == "flashgen.torch"]
    worst = max((r.x_sdpa for r in ours if r.x_sdpa is not None), default=None)
    passed = bool(ours) and all(
        r.x_sdpa is not None and r.x_sdpa <= bench.OVERHEAD_BAR for r in ours
    )
    data = {
        "env": bench.environment(),
        "bar": {"x_sdpa_max": bench.OVERHEAD_BAR, "worst": worst, "passed": passed},
        "statistic": "median host wall time per call (perf_counter_ns around each call), "
        f"synchronized every {bench.OVERHEAD_BATCH} calls (untimed), interleaved rounds",
        "overhead": [asdict(r) for r in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    for r in rows:
        if r.error:
            print(f"note: {r.impl} B{r.b} H{r.h} T{r.t} d{r.d}: {r.error}", file=sys.stderr)
    print(f"wrote {args.out}")
    print(f"host overhead, median us per call, {args.dtype}, {data['env'].get('gpu')}")
    for line in format_table(*bench.overhead_table(rows)):
        print(line)
    verdict = "PASS" if passed else "FAIL"
    shown = "-" if worst is None else f"{worst:.2f}"
    print(f"{verdict}: flashgen.torch worst {shown}x SDPA (bar {bench.OVERHEAD_BAR}x)")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
