"""Decode bandwidth on the GPU: flashgen's kv-cache kernel beside torch SDPA and a device copy.

    python3 scripts/decode_bench.py OUT.json [--quick]

For each row (bf16, d 128; GQA 32/8 and 8/1; Tq 1 and 4; B 1, 8, 32; Tk 4096, 32768, 131072
where the cache fits): the bytes of K and V each call reads (B x Tk x H_kv x d x 2 x 2), and
the time of flashgen contiguous, flashgen paged (page sizes 16 and 256, shuffled pages), torch
SDPA (enable_gqa, its default backend) and a device-to-device copy of the same number of bytes,
each the median of CUDA-event timings of a CUDA graph of `REPS` calls (launch overhead out of
the picture as it is in serving), after a warm-up. GB/s = bytes / time. The copy is the faster
of `copy_` (in a graph, a memcpy node: on the H200 the copy engines, ~2.8 TB/s on large
buffers) and an SM copy kernel (`torch.mul(src, 1, out=dst)`, ~4.3 TB/s), counted as bytes
read + written. FlashInfer (when `import flashinfer` works: staged on the GPU host by
scripts/flashinfer_stage.sh) is timed on Tq = 1 rows with its paged decode wrapper, pages of 16
and 256 keys; the best peer of a row is the fastest of SDPA and those. Prints one line per
row; writes every number to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import graph_timing  # scripts/graph_timing.py (beside this file)
import torch
import torch.nn.functional as F

from flashgen.kvcache import attention_with_kvcache

REPS = 20
ROUNDS = 7


def timed(fn: Any) -> float:
    """Median microseconds of one call, from CUDA graphs of REPS calls (graph_timing.py)."""
    return graph_timing.timed(fn, REPS, ROUNDS)


_FI: list[Any] = []


def _flashinfer() -> Any:
    """flashinfer, or None when it cannot be imported (said once)."""
    if not _FI:
        try:
            import flashinfer

            _FI.append(flashinfer)
        except Exception as exc:  # noqa: BLE001
            print(f"flashinfer not timed: {str(exc)[:200]}", flush=True)
            _FI.append(None)
    return _FI[0]


def _flashinfer_decode(q: Any, k: Any, v: Any, page: int) -> float:
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper on the same K/V in shuffled pages of
    `page` keys (NHD): its JIT compiles at the first call, outside the timing."""
    fi = _flashinfer()
    b, _, h, d = q.shape
    tk, h_kv = k.shape[1], k.shape[2]
    per = tk // page
    n_pages = b * per
    perm = torch.randperm(n_pages, device="cuda").to(torch.int32)
    kp = torch.empty(n_pages, page, h_kv, d, device="cuda", dtype=k.dtype)
    vp = torch.empty_like(kp)
    kp[perm.long()] = k.reshape(n_pages, page, h_kv, d)
    vp[perm.long()] = v.reshape(n_pages, page, h_kv, d)
    indptr = torch.arange(0, b + 1, device="cuda", dtype=torch.int32) * per
    last = torch.full((b,), page, device="cuda", dtype=torch.int32)
    ws = torch.zeros(256 << 20, device="cuda", dtype=torch.uint8)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=h // h_kv >= 4)
    w.plan(indptr, perm, last, h, h_kv, d, page, q_data_type=q.dtype, kv_data_type=k.dtype)
    q1 = q[:, 0].contiguous()
    return timed(lambda: w.run(q1, (kp, vp)))


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
        out["memcpy_us"] = timed(lambda: dst.copy_(src))
        out["sm_copy_us"] = timed(lambda: torch.mul(src, 1, out=dst))
        out["copy_us"] = min(out["memcpy_us"], out["sm_copy_us"])
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
    if peers and tq == 1 and _flashinfer() is not None:
        for page in (16, 256):  # its paged decode (tensor cores for GQA groups of 4 and up)
            try:
                out[f"flashinfer{page}_us"] = _flashinfer_decode(q, k, v, page)
            except Exception as exc:  # noqa: BLE001  (a peer's failure is reported, not fatal)
                out[f"flashinfer{page}_error"] = str(exc)[:300]
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
    for key in ("copy_gbs", "memcpy_gbs", "sm_copy_gbs"):
        if key in out:
            out[key] *= 2  # a copy of nbytes reads them and writes them: its bandwidth
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
        best = max(
            r.get("sdpa_gbs", 0.0), r.get("flashinfer16_gbs", 0.0), r.get("flashinfer256_gbs", 0.0)
        )
        copy = r.get("copy_gbs", 0.0)
        print(
            f"B{b:>3} Tk{tk:>7} {h}/{h_kv} Tq{tq}: flashgen {r['flashgen_gbs']:6.0f} GB/s "
            f"({r['flashgen_us']:7.1f} us)  paged16 {r['paged16_gbs']:6.0f}  paged256 "
            f"{r['paged256_gbs']:6.0f}  peers {best:6.0f}  copy {copy:6.0f}  "
            f"= {r['flashgen_gbs'] / max(copy, 1e-9):.2f}x copy, "
            f"{r['flashgen_gbs'] / max(best, 1e-9):.2f}x best peer (SDPA, FlashInfer)",
            flush=True,
        )
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
