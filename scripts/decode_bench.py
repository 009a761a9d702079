"""Decode bandwidth on the GPU: flashgen's kv-cache kernel beside torch SDPA and a device copy.

    python3 scripts/decode_bench.py OUT.json [--quick]

For each row (bf16, d 128; GQA 32/8 and 8/1; Tq 1 and 4; B 1, 8, 32; Tk 4096, 32768, 131072
where the cache fits): the bytes of K and V each call reads (B x Tk x H_kv x d x 2 x 2), and
the time of flashgen contiguous, flashgen paged (page sizes 16 and 256, shuffled pages), torch
SDPA (enable_gqa, its default backend) and a device-to-device copy of the same number of bytes
(`copy_` of one tensor into another), each the median of CUDA-event timings of a CUDA graph of
`REPS` calls (launch overhead out of the picture as it is in serving), after a warm-up. GB/s =
bytes / time. Prints one line per row; writes every number to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import torch
import torch.nn.functional as F

from flashgen.kvcache import attention_with_kvcache

REPS = 20
ROUNDS = 7


def timed(fn: Any) -> float:
    """Median microseconds of one call, from CUDA graphs of REPS calls."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(g, stream=stream):
        for _ in range(REPS):
            fn()
    torch.cuda.synchronize()
    g.replay()
    times = []
    for _ in range(ROUNDS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / REPS)
    return statistics.median(times)


def row(
    b: int, tk: int, h: int, h_kv: int, tq: int, d: int = 128, peers: bool = True
) -> dict[str, Any]:
    dt = torch.bfloat16
    q = torch.randn(b, tq, h, d, device="cuda", dtype=dt)
    k = torch.randn(b, tk, h_kv, d, device="cuda", dtype=dt)
    v = torch.randn(b, tk, h_kv, d, device="cuda", dtype=dt)
    lens = torch.full((b,), tk, device="cuda", dtype=torch.int32)
    nbytes = 2 * k.numel() * k.element_size()
    out: dict[str, Any] = {
        "b": b,
        "tk": tk,
        "h": h,
        "h_kv": h_kv,
        "tq": tq,
        "d": d,
        "bytes": nbytes,
    }
    if peers:
        src = torch.empty(nbytes // 2, device="cuda", dtype=dt)
        dst = torch.empty_like(src)
        out["copy_us"] = timed(lambda: dst.copy_(src))
        src = dst = torch.empty(0, device="cuda", dtype=dt)  # free the copy's buffers
    out["flashgen_us"] = timed(lambda: attention_with_kvcache(q, k, v, lens, causal=tq > 1))
    for page in (16, 256):
        n_pages = b * tk // page
        perm = torch.randperm(n_pages, device="cuda").to(torch.int32).view(b, tk // page)
        kp = k.view(n_pages, page, h_kv, d)[perm.view(-1).long()].contiguous()
        vp = v.view(n_pages, page, h_kv, d)[perm.view(-1).long()].contiguous()
        table = torch.empty_like(perm)
        table.view(-1)[perm.view(-1).long()] = torch.arange(
            n_pages, device="cuda", dtype=torch.int32
        )
        out[f"paged{page}_us"] = timed(
            lambda kp=kp, vp=vp, table=table: attention_with_kvcache(
                q, kp, vp, lens, block_table=table, causal=tq > 1
            )
        )
    qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    try:
        if not peers:
            raise RuntimeError("peers not asked for")
        out["sdpa_us"] = timed(
            lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=False, enable_gqa=True)
        )
    except RuntimeError as exc:  # a backend that refuses the shape
        out["sdpa_error"] = str(exc)[:200]
    for key in [k_ for k_ in out if k_.endswith("_us")]:
        out[key.replace("_us", "_gbs")] = nbytes / out[key] / 1e3
    if "copy_gbs" in out:
        out["copy_gbs"] *= 2  # a copy of nbytes reads them and writes them: its bandwidth
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--quick", action="store_true", help="a few rows only")
    ap.add_argument(
        "--rows", help="rows to run instead, 'B,Tk,H,H_kv,Tq;...' (e.g. '8,8192,32,8,1')"
    )
    ap.add_argument("--no-peers", action="store_true", help="flashgen only (no SDPA, no copy)")
    args = ap.parse_args()
    rows = []
    shapes = [(h, h_kv, tq, b, tk) for h, h_kv in ((32, 8), (8, 1)) for tq in (1, 4)
              for b in (1, 8, 32) for tk in (4096, 32768, 131072)]  # fmt: skip
    if args.quick:
        shapes = [
            (32, 8, 1, 8, 8192),
            (32, 8, 1, 1, 65536),
            (32, 8, 1, 32, 4096),
            (8, 1, 4, 8, 32768),
        ]
    if args.rows:
        shapes = []
        for part in args.rows.split(";"):
            b_, tk_, h_, hkv_, tq_ = (int(x) for x in part.split(","))
            shapes.append((h_, hkv_, tq_, b_, tk_))
    free = torch.cuda.mem_get_info()[0]
    for h, h_kv, tq, b, tk in shapes:
        if 5 * b * tk * h_kv * 128 * 2 * 2 > free:
            continue
        r = row(b, tk, h, h_kv, tq, peers=not args.no_peers)
        rows.append(r)
        best = max(r.get("sdpa_gbs", 0.0), 0.0)
        copy = r.get("copy_gbs", 0.0)
        print(
            f"B{b:>3} Tk{tk:>7} {h}/{h_kv} Tq{tq}: flashgen {r['flashgen_gbs']:6.0f} GB/s "
            f"({r['flashgen_us']:7.1f} us)  paged16 {r['paged16_gbs']:6.0f}  paged256 "
            f"{r['paged256_gbs']:6.0f}  sdpa {best:6.0f}  copy {copy:6.0f}  "
            f"= {r['flashgen_gbs'] / max(copy, 1e-9):.2f}x copy, "
            f"{r['flashgen_gbs'] / max(best, 1e-9):.2f}x sdpa",
            flush=True,
        )
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
