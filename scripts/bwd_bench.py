"""Backward TFLOP/s of flashgen.torch against torch SDPA's FLASH (FA2) and CUDNN backends.

    python3 scripts/bwd_bench.py OUT.json [--t 4096,16384] [--d 64,128]

Protocol as the forward's (B*T = 16384, H*d = 2048, bf16), timing the backward alone: each
implementation's forward runs once, then `torch.autograd.grad` of O against a fixed dO is
timed (median of CUDA events). FLOPs = 2.5 x the forward's 4*B*H*T^2*d (causal: half).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgen.torch as fgt
from flashgen.generator.bench import time_ms


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
                b, h = 16384 // t, 2048 // d
                q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))  # fmt: skip
                do = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)
                flops = 2.5 * 4 * b * h * t * t * d * (0.5 if causal else 1.0)
                row: dict[str, Any] = {"d": d, "t": t, "b": b, "h": h, "causal": causal}
                for name in ("flashgen", "fa2", "cudnn"):
                    try:
                        o = _forward(name, q, k, v, causal)
                        ms = time_ms(lambda o=o, ins=(q, k, v), do=do: torch.autograd.grad(
                            o, ins, do, retain_graph=True))  # fmt: skip
                        row[name] = flops / ms / 1e9
                    except Exception as exc:  # a backend this build lacks
                        row[name] = None
                        row[f"{name}_error"] = str(exc)[:200]
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


def _forward(name: str, q: Any, k: Any, v: Any, causal: bool) -> Any:
    if name == "flashgen":
        return fgt.attention(q, k, v, causal=causal)
    backend = SDPBackend.FLASH_ATTENTION if name == "fa2" else SDPBackend.CUDNN_ATTENTION
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


if __name__ == "__main__":
    main()
