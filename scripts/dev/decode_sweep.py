"""Decode knob sweep on the long-cache rows (issue 26): warps 2/4/8 x stages 2/3/4 x bc 16/32
(the valid specs) x splits auto/2, graph-timed (scripts/graph_timing.py), SDPA beside, 2 rounds.

    python3 scripts/dev/decode_sweep.py compile     # here, with FLASHGEN_CACHE_DIR set: compile
                                                    # every spec (ptxas report); carry the cache
    python3 scripts/dev/decode_sweep.py OUT.json    # GPU host (repo root): the sweep

Why: at 184-194 registers a 4-warp block fits 2 per SM, so the s2 ring keeps ~64 KB in flight
per SM; w4_s3 (109 KB smem) keeps 2 blocks and half again as many bytes in flight
(bench/NOTES.md, twenty-third session).
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

sys.path.insert(0, "scripts")  # graph_timing.py

import graph_timing  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flashgen.generator.spec import KernelSpec, SpecError  # noqa: E402
from flashgen.kvcache import attention_with_kvcache  # noqa: E402

ROWS = [(32, 32768, 32, 8), (8, 131072, 32, 8), (32, 131072, 8, 1), (8, 32768, 32, 8)]


def specs() -> list[KernelSpec]:
    out = []
    for w, s, bc in itertools.product((2, 4, 8), (2, 3, 4), (16, 32)):
        try:
            out.append(KernelSpec(family="mma", direction="decode", d=128, dv=128, dtype="bf16",
                                  causal=False, br=16, bc=bc, warps=w, stages=s))  # fmt: skip
        except SpecError as e:
            print("skip", w, s, bc, str(e)[:80])
    return out


def sweep_row(b: int, tk: int, h: int, hkv: int, res: list[dict[str, Any]]) -> None:
    q = torch.randn(b, 1, h, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, tk, hkv, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((b,), tk, device="cuda", dtype=torch.int32)
    nb = 2 * k.numel() * 2
    qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def record(impl: str, fn: Any) -> None:
        try:
            gbs = nb / graph_timing.timed(fn) / 1e3
        except Exception as e:  # noqa: BLE001
            print("fail", impl, str(e)[:100])
            return
        print(f"{b},{tk},{h}/{hkv} {impl} {gbs:7.0f} GB/s", flush=True)
        res.append({"row": (b, tk, h, hkv), "impl": impl, "gbs": gbs})

    for _ in range(2):
        record("sdpa", lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True))
        record("default", lambda: attention_with_kvcache(q, k, v, lens))
        for sp in specs():
            for ns in (0, 2):
                record(f"{sp.name}/ns{ns}", lambda sp=sp, ns=ns: attention_with_kvcache(
                    q, k, v, lens, spec=sp, num_splits=ns))  # fmt: skip


def main() -> None:
    if sys.argv[1] == "compile":
        from flashgen.generator.compile import compile_kernel

        for sp in specs():
            print(sp.name, compile_kernel(sp, "sm_90").report)
        return
    res: list[dict[str, Any]] = []
    for b, tk, h, hkv in ROWS:
        sweep_row(b, tk, h, hkv, res)
        torch.cuda.empty_cache()
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=0)


if __name__ == "__main__":
    main()
