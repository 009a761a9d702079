"""A focused GPU step for kernel work: check a few variants on ragged problems, then time them.

    python3 scripts/dev/wgmma_dev.py OUT.json NAME [NAME ...] [--no-bench] [--bench-t 4096,16384]

Each NAME is a kernel name (any family). Inputs and outputs are torch CUDA tensors, the kernel
runs on torch's current stream (wgmma kernels through tma.launch, others through PyCUDA), the
outputs are judged by the float64 oracle with docs/design.md's rule, and the timing follows the
benchmark protocol (B*T = 16k tokens, H*d = 2048, median of CUDA-event timings) beside torch
SDPA's FLASH and CUDNN backends on the same tensors. Prints one line per check and a table last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from flashgen.generator.compile import compile_kernel
from flashgen.generator.numerics import LOG2E
from flashgen.generator.spec import KernelSpec
from flashgen.perf.bench import time_ms
from flashgen.runtime import gpu as runtime
from flashgen.runtime import launch
from flashgen.runtime.validate import Problem
from flashgen.verify.oracle import check_outputs

GRID = "auto"  # --grid
SMS = 0  # --sms (0: the device's)
TORCH = {"fp16": torch.float16, "bf16": torch.bfloat16}
NUMPY = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}
PROBLEMS = [  # (b, h, tq, tk)
    (1, 1, 1, 1), (1, 2, 64, 64), (2, 3, 300, 257), (1, 2, 129, 700), (1, 2, 700, 129),
    (1, 1, 197, 1000), (2, 1, 1024, 1024), (1, 1, 17, 4099),
]  # fmt: skip


def load(spec: KernelSpec) -> Any:
    """The launch plan for `spec` on GPU 0 (compiled for it)."""
    arch = runtime.kernel_arch(spec)
    ck = compile_kernel(spec, arch)
    print(f"{spec.name}: {ck.report.registers} regs, spills {ck.report.spill_stores}", flush=True)
    return None, launch.plan(spec, ck.cubin, arch, 0)


_bound: dict[Any, Any] = {}


def strides(t: torch.Tensor) -> tuple[int, int, int]:
    return (t.stride(0), t.stride(1), t.stride(2))


def run(
    spec: KernelSpec, func: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, scale: float
) -> None:
    b, h, tq, d = q.shape
    p = Problem(b, h, tq, k.shape[2], d, spec.dtype, strides(q), strides(k), strides(v),
                strides(o), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                lse.data_ptr())  # fmt: skip
    stream = torch.cuda.current_stream().cuda_stream
    key = (spec, p)
    bound = _bound.get(key)
    if bound is None:
        bound = _bound[key] = func.bind(p, scale * LOG2E)
        tiles = -(-tq // spec.br) * b * h
        if GRID == "tiles" and spec.family == "wgmma":  # A/B: a block per query tile
            bound.grid = (tiles, 1, 1)
        elif GRID == "persistent" and spec.family == "wgmma":  # A/B: at most a block per SM
            sms = SMS or torch.cuda.get_device_properties(0).multi_processor_count
            bound.grid = (min(sms, tiles), 1, 1)
    bound(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), stream)


def to_numpy(t: torch.Tensor, dtype: str) -> np.ndarray:
    host = t.detach().cpu().contiguous()
    if dtype == "bf16":
        return host.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return host.numpy()


def check(spec: KernelSpec, func: Any, seed: int = 0) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(seed)
    for b, h, tq, tk in PROBLEMS:
        shape_q, shape_k = (b, h, tq, spec.d), (b, h, tk, spec.d)
        qn, kn, vn = (
            rng.standard_normal(s).astype(NUMPY[spec.dtype]) for s in (shape_q, shape_k, shape_k)
        )
        # a strided o and a BTHD view for k: the kernel must honour each tensor's strides
        q = torch.from_numpy(qn.view(np.int16) if spec.dtype == "bf16" else qn).cuda()
        q = q.view(TORCH[spec.dtype]) if spec.dtype == "bf16" else q
        kt = torch.from_numpy(kn.view(np.int16) if spec.dtype == "bf16" else kn).cuda()
        kt = kt.view(TORCH[spec.dtype]) if spec.dtype == "bf16" else kt
        k = kt.transpose(1, 2).contiguous().transpose(1, 2)  # (B, T, H, d) storage
        v = torch.from_numpy(vn.view(np.int16) if spec.dtype == "bf16" else vn).cuda()
        v = v.view(TORCH[spec.dtype]) if spec.dtype == "bf16" else v
        o_big = torch.full(
            (b, h, tq, spec.d + 64), float("nan"), dtype=TORCH[spec.dtype], device="cuda"
        )
        o = o_big[..., : spec.d]
        lse = torch.full((b, h, tq), float("nan"), dtype=torch.float32, device="cuda")
        scale = 1.0 / math.sqrt(spec.d)
        run(spec, func, q, k, v, o, lse, scale)
        torch.cuda.synchronize()
        out = check_outputs(to_numpy(o, spec.dtype), lse.cpu().numpy(), qn, kn, vn,
                            causal=spec.causal, scale=scale, dtype=spec.dtype)  # fmt: skip
        row = {"spec": spec.name, "b": b, "h": h, "tq": tq, "tk": tk, "passed": out.passed,
               "o_err": out.o_err, "o_bound": out.o_bound, "lse_err": out.lse_err}  # fmt: skip
        print(("PASS" if out.passed else "FAIL"), json.dumps(row), flush=True)
        rows.append(row)
    return rows


def timed(fn: Any, reps: int = 30) -> float:
    """Median ms, a synchronize after every rep (`flashgen bench` launches its reps back to
    back)."""
    return time_ms(fn, warmup=3, reps=reps, sync_each=True)


def bench(specs: list[tuple[KernelSpec, Any]], ts: list[int]) -> list[dict[str, Any]]:
    rows = []
    from torch.nn.attention import SDPBackend, sdpa_kernel

    by_key: dict[tuple[int, str, bool], list[tuple[KernelSpec, Any]]] = {}
    for spec, func in specs:
        by_key.setdefault((spec.d, spec.dtype, spec.causal), []).append((spec, func))
    for (d, dtype, causal), group in sorted(by_key.items()):
        for t in ts:
            b, h = max(1, 16384 // t), 2048 // d
            q, k, v = (torch.randn(b, h, t, d, dtype=TORCH[dtype], device="cuda") for _ in range(3))
            o = torch.empty_like(q)
            lse = torch.empty(b, h, t, dtype=torch.float32, device="cuda")
            flops = 4 * b * h * t * t * d / (2 if causal else 1)
            row: dict[str, Any] = {"d": d, "dtype": dtype, "causal": causal, "t": t, "b": b, "h": h}
            for name, backend in (
                ("flash", SDPBackend.FLASH_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ):
                try:
                    with sdpa_kernel(backend):
                        ms = timed(
                            lambda q=q, k=k, v=v, c=causal: F.scaled_dot_product_attention(
                                q, k, v, is_causal=c
                            )
                        )
                    row[name] = flops / ms / 1e9
                except Exception as exc:  # a backend that refuses the shape
                    row[name] = None
                    print(f"{name}: {exc}", file=sys.stderr)
            for spec, func in group:
                args = (q, k, v, o, lse, 1.0 / math.sqrt(d))
                ms = timed(lambda s=spec, f=func, a=args: run(s, f, *a))
                row[spec.name] = flops / ms / 1e9
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("names", nargs="+")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--grid", choices=("auto", "tiles", "persistent"), default="auto",
                    help="wgmma: the launch's grid (auto), a block per query tile (tiles) or "
                    "one block per SM (persistent)")
    ap.add_argument("--sms", type=int, default=0,
                    help="with --grid persistent: this many blocks (0: one per SM)")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-t", default="4096,16384")
    args = ap.parse_args()
    global GRID, SMS
    GRID, SMS = args.grid, args.sms
    runtime.gpu()
    torch.cuda.init()
    specs = [KernelSpec.from_name(n) for n in args.names]
    loaded = [(s, load(s)) for s in specs]
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "time": time.time()}
    failed = 0
    if not args.no_check:
        result["checks"] = []
        for spec, (_, func) in loaded:
            rows = check(spec, func)
            failed += sum(not r["passed"] for r in rows)
            result["checks"] += rows
    if not args.no_bench:
        ts = [int(x) for x in args.bench_t.split(",")]
        result["bench"] = bench([(s, f) for s, (_, f) in loaded], ts)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"checks failed: {failed}")
    for row in result.get("bench", []):
        ours = {k: v for k, v in row.items() if k.startswith("flash_")}
        best = max(ours.values()) if ours else 0
        peer = max(x for x in (row.get("flash"), row.get("cudnn"), 0) if x is not None)
        mask = "causal" if row["causal"] else "full  "
        fa2, cudnn = row.get("flash") or 0, row.get("cudnn") or 0
        print(
            f"d{row['d']} {row['dtype']} {mask} T={row['t']:5d}: ours {best:6.1f}  "
            f"fa2 {fa2:6.1f}  cudnn {cudnn:6.1f}  x{best / peer if peer else 0:.2f}"
        )


if __name__ == "__main__":
    main()
