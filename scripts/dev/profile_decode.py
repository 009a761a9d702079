"""A process for `ncu` to attach to: one decode call (flashgen's kv-cache kernel or torch SDPA)
on a decode_bench row, warmed up, then once inside the NVTX range "timed" (profile it with
`ncu --nvtx --nvtx-include "timed/"`: every kernel of the call, split and merge alike).

    python3 scripts/dev/profile_decode.py flashgen|sdpa B TK H H_KV TQ [--page N]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from flashgen.kvcache import attention_with_kvcache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("impl", choices=["flashgen", "sdpa"])
    for name in ("b", "tk", "h", "h_kv", "tq"):
        ap.add_argument(name, type=int)
    ap.add_argument("--page", type=int, default=0, help="flashgen: shuffled pages of N keys")
    a = ap.parse_args()
    d, dt = 128, torch.bfloat16
    q = torch.randn(a.b, a.tq, a.h, d, device="cuda", dtype=dt)
    k = torch.randn(a.b, a.tk, a.h_kv, d, device="cuda", dtype=dt)
    v = torch.randn_like(k)
    lens = torch.full((a.b,), a.tk, device="cuda", dtype=torch.int32)
    table = None
    if a.page:
        n_pages = a.b * a.tk // a.page
        perm = torch.randperm(n_pages, device="cuda")
        k = k.view(n_pages, a.page, a.h_kv, d)[perm].contiguous()
        v = v.view(n_pages, a.page, a.h_kv, d)[perm].contiguous()
        table = torch.empty(n_pages, device="cuda", dtype=torch.int32)
        table[perm] = torch.arange(n_pages, device="cuda", dtype=torch.int32)
        table = table.view(a.b, a.tk // a.page)
    if a.impl == "flashgen":

        def call() -> object:
            return attention_with_kvcache(q, k, v, lens, block_table=table, causal=a.tq > 1)
    else:
        qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def call() -> object:
            return F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("timed")
    call()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
