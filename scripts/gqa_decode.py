"""Grouped-query attention with short queries (decoding): the packed variant against the rest.

    python3 scripts/gqa_decode.py OUT.json [--tk 4096,16384] [--tq 1,4,16,64]

Hq = 32 query heads on Hkv = 8 K/V heads, d = 128, bf16, batch 8 (--batch), non-causal and
causal. For
each (tq, tk): flashgen's choice (`select`: the `gqapack` variant for tq <= GQAPACK_MAX_TQ),
the plain variant select picks without packing, and torch SDPA (`enable_gqa=True`, default
backend choice) on the same tensors; median of CUDA-event timings. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.nn.functional as F

import flashgen.torch as fgt
from flashgen.generator.select import select
from flashgen.perf.bench import time_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tk", default="4096,16384")
    ap.add_argument("--tq", default="1,4,16,64")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--packed", action="store_true", help="time the gqapack variant always")
    args = ap.parse_args()
    batch, hq, hkv, d, dtype = args.batch, 32, 8, 128, "bf16"
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    gpu = torch.cuda.get_device_name()
    rows = []
    for causal in (False, True):
        for tk in (int(x) for x in args.tk.split(",")):
            for tq in (int(x) for x in args.tq.split(",")):
                q = torch.randn(batch, hq, tq, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(batch, hkv, tk, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(batch, hkv, tk, d, device="cuda", dtype=torch.bfloat16)
                chosen = select(
                    d, dtype, causal, arch, gpu_name=gpu, kv_group=hq // hkv, tq=tq,
                    kv_heads=batch * hkv,
                )
                if args.packed and "gqapack" not in chosen.features:
                    chosen = select(d, "bf16", causal, "sm_80").replace(features=("gqapack",))
                plain = select(d, dtype, causal, arch, gpu_name=gpu)
                got = fgt.attention(q, k, v, causal=causal, spec=chosen)
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True) \
                    if not causal or tq == 1 else None
                err = float((got.float() - ref.float()).abs().max()) if ref is not None else None
                def run(spec: Any, q: Any = q, k: Any = k, v: Any = v, c: bool = causal) -> Any:
                    return fgt.attention(q, k, v, causal=c, spec=spec)

                row = {
                    "causal": causal, "tq": tq, "tk": tk, "b": batch, "hq": hq, "hkv": hkv,
                    "d": d, "chosen": chosen.name, "plain": plain.name,
                    "chosen_ms": time_ms(lambda s=chosen: run(s)),
                    "plain_ms": time_ms(lambda s=plain: run(s)),
                    "max_abs_vs_sdpa": err,
                }  # fmt: skip
                # SDPA's causal mask is top-left aligned: only time it where that equals ours
                if not causal or tq == tk:
                    row["sdpa_ms"] = time_ms(
                        lambda: F.scaled_dot_product_attention(
                            q, k, v, is_causal=causal, enable_gqa=True)  # noqa: B023
                    )
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(args.out, "w") as fh:
        json.dump({"gpu": gpu, "rows": rows}, fh, indent=1)
    print("causal tq    tk   chosen_ms  plain_ms  sdpa_ms  x plain  chosen")
    for r in rows:
        sd = f"{r['sdpa_ms']:.4f}" if "sdpa_ms" in r else "   -  "
        times = f"{r['chosen_ms']:9.4f} {r['plain_ms']:9.4f} {sd:>8}"
        ratio = r["plain_ms"] / r["chosen_ms"]
        print(f"{r['causal']!s:6} {r['tq']:3} {r['tk']:6} {times} {ratio:7.2f}  {r['chosen']}")


if __name__ == "__main__":
    main()
