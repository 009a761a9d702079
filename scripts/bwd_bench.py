"""Backward TFLOP/s of flashgen.torch against torch SDPA's FLASH (FA2) and CUDNN backends.

    python3 scripts/bwd_bench.py OUT.json [--t 4096,16384] [--d 64,128]

A bf16 shortcut to `flashgen bench`'s backward rows (`bench.bench_backward_case`: the
protocol's problems, B*T = 16384, H*d = 2048; each implementation's forward once, then
`torch.autograd.grad` of O against a fixed dO timed; FLOPs = 2.5 x the forward's, causal
half), written as one row per case with each implementation's TFLOP/s.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from flashgen.perf.bench import Case, bench_backward_case

NAMES = {"flashgen": "flashgen", "sdpa-flash": "fa2", "sdpa-cudnn": "cudnn"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--t", default="4096,16384")
    ap.add_argument("--d", default="64,128")
    args = ap.parse_args()
    rows = []
    for d in (int(x) for x in args.d.split(",")):
        for t in (int(x) for x in args.t.split(",")):
            for causal in (False, True):
                case = Case("bf16", d, causal, t)
                row: dict[str, Any] = {"d": d, "t": t, "b": case.b, "h": case.h, "causal": causal}
                for r in bench_backward_case(case, peers=("sdpa-flash", "sdpa-cudnn")):
                    name = NAMES[r.impl]
                    row[name] = r.tflops
                    if r.error:
                        row[f"{name}_error"] = r.error
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(args.out, "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    print("d     T  causal  flashgen   fa2   cudnn  x fa2")
    for r in rows:
        fg, fa = r.get("flashgen"), r.get("fa2")
        ratio = f"{fg / fa:.2f}" if fg and fa else "-"
        cells = " ".join(f"{r.get(n) or 0:7.1f}" for n in ("flashgen", "fa2", "cudnn"))
        print(f"{r['d']:3} {r['t']:6} {r['causal']!s:6} {cells} {ratio:>6}")


if __name__ == "__main__":
    main()
