"""Variable-length prefill on the GPU: flashgen's varlen forward against the dense forward at the
same token count and FA4's varlen forward (when `flash_attn.cute` imports).

    python3 scripts/varlen_bench.py OUT.json [--dtype bf16 fp16] [--causal 1 0] [--rounds 3]
    python3 scripts/varlen_bench.py OUT.json --backward [...]

The issue 26 row set: 16 sequences of 64 to 4096 tokens, 16384 in all, H 16, d 128 (H*d 2048).
Useful TFLOP/s: the FLOPs of the keys each query row really sees (causal: its own prefix), 4 d H
per (row, key) pair, over the median time of CUDA graphs of REPS calls. The dense rows run
`flashgen.torch.attention` on (B, T, H, d) views with B*T = 16384 (B 16 x T 1024, and B 4 x T
4096). Rounds interleave the kernels (each round times every kernel once).

`--backward` (issue 26: varlen backward >= 0.95x the dense backward): after one forward on
requires_grad inputs, `torch.autograd.grad(o, (q, k, v), do, retain_graph=True)` of the varlen
op against the same of the dense `flashgen.torch.attention` at B16 T1024 and B4 T4096 (and FA4's
varlen and dense backward when importable), timed as flashgen bench times backward rows: the
median of CUDA events over REPS eager calls (autograd runs on the host between the kernels).
FLOPs 2.5x the forward's useful FLOPs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

import graph_timing  # scripts/graph_timing.py (beside this file)
import torch

import flashgen.torch as fgt

LENGTHS = [4096, 3072, 2048, 1536, 1024, 1024, 768, 640, 512, 512, 384, 256, 256, 128, 64, 64]
# packed batches come in no particular order: the default interleaves long and short
SHUFFLED = [512, 64, 3072, 256, 1024, 128, 4096, 640, 64, 1536, 384, 1024, 2048, 256, 768, 512]
HEADS, D = 16, 128
REPS = 10
TIMES = 5


def timed(fn: Any) -> float:
    """Median microseconds of one call, from CUDA graphs of REPS calls (graph_timing.py)."""
    return graph_timing.timed(fn, REPS, TIMES)


def timed_eager(fn: Callable[[], Any]) -> float:
    """Median microseconds of one call over TIMES batches of REPS eager calls (CUDA events)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(TIMES):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(REPS):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / REPS)
    return statistics.median(times)


def forward_kernels(
    lengths: list[int], cu: Any, t: Any, causal: bool, fa4: Any
) -> dict[str, tuple[Callable[[], Any], int]]:
    """The forward rows: (a call, useful pairs) per kernel."""
    total, mx = sum(lengths), max(lengths)
    q = torch.randn(total, HEADS, D, device="cuda", dtype=t)
    k, v = torch.randn_like(q), torch.randn_like(q)
    kernels: dict[str, tuple[Callable[[], Any], int]] = {
        "flashgen varlen": (
            lambda: fgt.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=causal),
            pairs(lengths, causal),
        ),
    }
    for b, tlen in ((16, 1024), (4, 4096)):
        x = torch.randn(b, tlen, 3, HEADS, D, device="cuda", dtype=t)
        dq, dk, dv = (y.transpose(1, 2) for y in x.unbind(2))
        kernels[f"flashgen dense B{b} T{tlen}"] = (
            lambda dq=dq, dk=dk, dv=dv: fgt.attention(dq, dk, dv, causal=causal),
            b * pairs([tlen], causal),
        )
        if fa4 is not None:
            bq, bk, bv = (y for y in x.unbind(2))  # (B, T, H, d)
            kernels[f"FA4 dense B{b} T{tlen}"] = (
                lambda bq=bq, bk=bk, bv=bv: fa4.flash_attn_func(bq, bk, bv, causal=causal),
                b * pairs([tlen], causal),
            )
    if fa4 is not None:
        kernels["FA4 varlen"] = (
            lambda: fa4.flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx,
                max_seqlen_k=mx, causal=causal,
            ),
            pairs(lengths, causal),
        )  # fmt: skip
    return kernels


def backward_kernels(
    lengths: list[int], cu: Any, t: Any, causal: bool, fa4: Any
) -> dict[str, tuple[Callable[[], Any], int]]:
    """The --backward rows: (autograd.grad of one forward's output, useful pairs) per kernel."""
    total, mx = sum(lengths), max(lengths)
    out: dict[str, tuple[Callable[[], Any], int]] = {}

    def grad_of(o: Any, leaves: tuple[Any, ...]) -> Callable[[], Any]:
        do = torch.randn_like(o)
        return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)

    q = torch.randn(total, HEADS, D, device="cuda", dtype=t).requires_grad_()
    k, v = (torch.randn_like(q).requires_grad_() for _ in range(2))
    o = fgt.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=causal)
    out["flashgen varlen bwd"] = (grad_of(o, (q, k, v)), pairs(lengths, causal))
    if fa4 is not None:
        o4 = fa4.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx,
            causal=causal,
        )  # fmt: skip
        o4 = o4[0] if isinstance(o4, tuple) else o4
        out["FA4 varlen bwd"] = (grad_of(o4, (q, k, v)), pairs(lengths, causal))
    for b, tlen in ((16, 1024), (4, 4096)):
        # separate contiguous leaves: no stack of the gradients of views into one tensor
        dense = [torch.randn(b, HEADS, tlen, D, device="cuda", dtype=t).requires_grad_()
                 for _ in range(3)]  # fmt: skip
        od = fgt.attention(*dense, causal=causal)
        out[f"flashgen dense bwd B{b} T{tlen}"] = (
            grad_of(od, tuple(dense)), b * pairs([tlen], causal)
        )
        if fa4 is not None:  # (B, T, H, d)
            bq, bk, bv = (y.detach().transpose(1, 2).contiguous().requires_grad_() for y in dense)
            of = fa4.flash_attn_func(bq, bk, bv, causal=causal)
            of = of[0] if isinstance(of, tuple) else of
            out[f"FA4 dense bwd B{b} T{tlen}"] = (
                grad_of(of, (bq, bk, bv)), b * pairs([tlen], causal)
            )
    return out


def pairs(lens: list[int], causal: bool) -> int:
    """(query row, key) pairs each sequence's rows see."""
    return sum(n * (n + 1) // 2 if causal else n * n for n in lens)


def _fa4() -> Any:
    try:
        from flash_attn.cute import interface
    except Exception as exc:  # noqa: BLE001  (any import failure: no peer)
        print(f"FA4 not importable ({type(exc).__name__}: {exc}); no FA4 rows", file=sys.stderr)
        return None
    return interface


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", nargs="+", default=["bf16", "fp16"])
    ap.add_argument("--causal", nargs="+", type=int, default=[1])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sorted", action="store_true", help="longest sequence first")
    ap.add_argument("--no-peers", action="store_true", help="flashgen's kernels only")
    ap.add_argument("--backward", action="store_true", help="the backward rows (autograd.grad)")
    args = ap.parse_args()
    fa4 = None if args.no_peers else _fa4()
    lengths = LENGTHS if args.sorted else SHUFFLED
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")  # fmt: skip
    rows: list[dict[str, Any]] = []
    for dtype in args.dtype:
        t = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        for causal in map(bool, args.causal):
            if args.backward:
                kernels = backward_kernels(lengths, cu, t, causal, fa4)
                run_rounds(kernels, args.rounds, timed_eager, dtype, causal, rows, 2.5)
                continue
            kernels = forward_kernels(lengths, cu, t, causal, fa4)
            run_rounds(kernels, args.rounds, timed, dtype, causal, rows, 1.0)
    ours_name = "flashgen varlen bwd" if args.backward else "flashgen varlen"
    by = {(r["kernel"], r["dtype"], r["causal"]): r for r in rows}
    print(f"{'kernel':32s} {'dtype':5s} {'causal':6s} {'us':>9s} {'TFLOP/s':>8s} {'x varlen':>8s}")
    for r in rows:
        ours = by[(ours_name, r["dtype"], r["causal"])]["tflops"]
        print(f"{r['kernel']:32s} {r['dtype']:5s} {r['causal']!s:6s} {r['us']:9.1f} "
              f"{r['tflops']:8.1f} {ours / r['tflops']:8.3f}")  # fmt: skip
    with open(args.out, "w") as f:
        factor = 2.5 if args.backward else 1.0
        json.dump({"lengths": lengths, "heads": HEADS, "d": D, "backward": args.backward,
                   "flops_factor": factor, "rows": rows}, f, indent=1)  # fmt: skip
    return 0


def run_rounds(
    kernels: dict[str, tuple[Callable[[], Any], int]], rounds: int,
    timer: Callable[[Callable[[], Any]], float], dtype: str, causal: bool,
    rows: list[dict[str, Any]], flops_factor: float,
) -> None:  # fmt: skip
    """Time every kernel once a round (interleaved), then one row each: median us, TFLOP/s of
    flops_factor x the forward's useful FLOPs."""
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(rounds):
        for name, (fn, _) in list(kernels.items()):
            try:
                times[name].append(timer(fn))
            except Exception as exc:  # noqa: BLE001  (a peer that cannot run: say so)
                print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                kernels.pop(name)
                times.pop(name)
    for name, (_, n_pairs) in kernels.items():
        us = statistics.median(times[name])
        tflops = flops_factor * 4 * D * HEADS * n_pairs / us / 1e6
        rows.append({"kernel": name, "dtype": dtype, "causal": causal, "us": us,
                     "tflops": tflops, "rounds_us": times[name]})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
