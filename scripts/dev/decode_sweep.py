"""Decode knob sweep on the long-cache rows (issue 26): warps 2/4/8 x stages 2/3/4 x bc 16/32
(the valid specs) x splits auto/2, graph-timed (scripts/graph_timing.py), SDPA beside, 2 rounds.

    python3 scripts/dev/decode_sweep.py compile     # here, with FLASHGEN_CACHE_DIR set: compile
                                                    # every spec (ptxas report); carry the cache
    python3 scripts/dev/decode_sweep.py OUT.json    # GPU host (repo root): the sweep
    python3 scripts/dev/decode_sweep.py OUT.json small   # the short caches: split counts

`small`: the latency-bound rows (B1 Tk4k / Tk32k 8/1, B1 and B8 Tk4k 32/8, B8 Tk4k 8/1), where
the split count decides how many SMs share the bytes (ours 16 blocks on B1 Tk4k, cuDNN 32 + a
reduction kernel, bench/NOTES.md session 18): num_splits auto / 8 / 16 / 32 / 64 / 128 for the
default variant, the 4-warp one and the few-blocks 8-warp one, SDPA beside, graph-timed, 2
rounds. DSWEEP_WARMUP_S=S: each timing's warm-up (default the protocol's 1 s).

`DSWEEP_MIN_BLOCKS=N` (environment): every br 16 decode variant is built for N resident blocks
(`__launch_bounds__(threads, N)`; 3 caps d 128 at 168 registers, 0 spills with ptxas 13.0), its
rows labelled `mbN/...` -- 3 blocks of 4 warps per SM instead of 2 put half again as many tiles
in flight, and the split count follows the occupancy the driver reports.

Why: at 184-194 registers a 4-warp block fits 2 per SM, so the s2 ring keeps ~64 KB in flight
per SM; w4_s3 (109 KB smem) keeps 2 blocks and half again as many bytes in flight
(bench/NOTES.md, twenty-third session).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any

sys.path.insert(0, "scripts")  # graph_timing.py

import graph_timing  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flashgen.generator.spec import KernelSpec, SpecError  # noqa: E402
from flashgen.kvcache import attention_with_kvcache  # noqa: E402

MIN_BLOCKS = int(os.environ.get("DSWEEP_MIN_BLOCKS", "0"))
TAG = f"mb{MIN_BLOCKS}/" if MIN_BLOCKS else ""
if MIN_BLOCKS:
    from flashgen.generator.families.mma import MmaFamily

    _min_blocks = MmaFamily.min_blocks

    def _forced(self: MmaFamily, spec: KernelSpec) -> int:
        # br 16 only, and only where N blocks leave >= 160 registers a thread (w8 would spill)
        regs = 65536 // (MIN_BLOCKS * spec.threads)
        if spec.direction == "decode" and spec.br == 16 and regs >= 160:
            return MIN_BLOCKS
        return _min_blocks(self, spec)

    MmaFamily.min_blocks = _forced  # type: ignore[method-assign]

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


def row_tensors(b: int, tk: int, h: int, hkv: int) -> tuple[Any, ...]:
    """A decode row's Q (one token), K/V caches, lengths, K+V bytes and SDPA's (B, H, T, d)
    views of Q, K and V."""
    q = torch.randn(b, 1, h, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, tk, hkv, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((b,), tk, device="cuda", dtype=torch.int32)
    views = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return q, k, v, lens, 2 * k.numel() * 2, views


def sweep_row(b: int, tk: int, h: int, hkv: int, res: list[dict[str, Any]]) -> None:
    q, k, v, lens, nb, (qs, ks, vs) = row_tensors(b, tk, h, hkv)

    def record(impl: str, fn: Any) -> None:
        try:
            gbs = nb / graph_timing.timed(fn) / 1e3
        except Exception as e:  # noqa: BLE001
            print("fail", impl, str(e)[:100])
            return
        if impl != "sdpa":
            impl = TAG + impl
        print(f"{b},{tk},{h}/{hkv} {impl} {gbs:7.0f} GB/s", flush=True)
        res.append({"row": (b, tk, h, hkv), "impl": impl, "gbs": gbs})

    for _ in range(2):
        record("sdpa", lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True))
        record("default", lambda: attention_with_kvcache(q, k, v, lens))
        for sp in specs():
            for ns in (0, 2):
                record(f"{sp.name}/ns{ns}", lambda sp=sp, ns=ns: attention_with_kvcache(
                    q, k, v, lens, spec=sp, num_splits=ns))  # fmt: skip


SMALL_ROWS = [
    (1, 4096, 8, 1), (1, 32768, 8, 1), (1, 4096, 32, 8), (8, 4096, 32, 8), (8, 4096, 8, 1),
]


def sweep_small(b: int, tk: int, h: int, hkv: int, res: list[dict[str, Any]]) -> None:
    q, k, v, lens, nb, (qs, ks, vs) = row_tensors(b, tk, h, hkv)
    base = KernelSpec(family="mma", direction="decode", d=128, dv=128, dtype="bf16", causal=False,
                      br=16, bc=16)  # fmt: skip
    variants: list[tuple[str, KernelSpec | None]] = [("default", None), ("w4_s2", base)]
    try:
        variants.append(("w8_s2", base.replace(warps=8, stages=2)))
    except SpecError as e:
        print("skip w8_s2", str(e)[:80])

    def record(impl: str, fn: Any) -> None:
        try:
            us = graph_timing.timed(fn)
        except Exception as e:  # noqa: BLE001
            print("fail", impl, str(e)[:100])
            return
        print(f"{b},{tk},{h}/{hkv} {impl} {us:7.1f} us {nb / us / 1e3:7.0f} GB/s", flush=True)
        res.append({"row": (b, tk, h, hkv), "impl": impl, "us": us, "gbs": nb / us / 1e3})

    for _ in range(2):
        record("sdpa", lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True))
        for label, sp in variants:
            for ns in (0, 8, 16, 32, 64, 128):
                record(f"{label}/ns{ns}", lambda sp=sp, ns=ns: attention_with_kvcache(
                    q, k, v, lens, spec=sp, num_splits=ns))  # fmt: skip


def main() -> None:
    if os.environ.get("DSWEEP_WARMUP_S"):  # shorter warm-ups: the sweep keeps the GPU busy
        from flashgen.perf import bench

        bench.WARMUP_S = float(os.environ["DSWEEP_WARMUP_S"])
    if len(sys.argv) > 2 and sys.argv[2] == "small":
        res_small: list[dict[str, Any]] = []
        for b, tk, h, hkv in SMALL_ROWS:
            sweep_small(b, tk, h, hkv, res_small)
        with open(sys.argv[1], "w") as f:
            json.dump(res_small, f, indent=0)
        return
    if sys.argv[1] == "compile":
        from flashgen.generator.compile import compile_kernel

        for sp in specs():
            print(sp.name, compile_kernel(sp, "sm_90").report)
        return
    res: list[dict[str, Any]] = []
    for b, tk, h, hkv in ROWS:
        sweep_row(b, tk, h, hkv, res)
        torch.cuda.empty_cache()
        with open(sys.argv[1], "w") as f:  # after every row: a timed-out sweep keeps its rows
            json.dump(res, f, indent=0)


if __name__ == "__main__":
    main()
