"""Peak memory and step time of one attention layer against sequence length: manual vs flashgen.

    python examples/nanogpt/sweep.py --out runs/sweep.json            # T = 256 ... 16384
    python examples/nanogpt/plot.py sweep runs/sweep.json --out runs/sweep.png

What is measured: one `CausalSelfAttention` layer of model.py (qkv projection, the attention
core, output projection; no LayerNorm or MLP), with H=16 heads of d=64 (C = 1024) in bf16 by
default, built directly in that dtype (no autocast), the same seeded weights for both
attentions. Two modes per length:

- `fwd`: the forward pass under torch.no_grad() (what flashgen supports today);
- `fwd_bwd`: forward, then torch.autograd.grad of the output against the input and every
  parameter (so nothing accumulates in .grad between repetitions).

Batch: B = 1 at every T by default, so memory grows as the attention itself does, O(T^2) for
the manual path (one (1, 16, T, T) bf16 score matrix is 8 GiB at T = 16384, and the manual
path keeps several) against O(T) for flashgen; this is the protocol of flashgen's own memory
comparison (B=1, H=16, d=64, causal). `--tokens N` instead keeps B*T = N (B = N // T), which
holds the linear layers' work fixed and shows the attention's per-token cost growing with T.

Memory: `extra_peak_bytes` is torch.cuda.max_memory_allocated during one call minus what was
allocated before it (weights, the input, the manual path's registered mask buffer: bool,
block_size^2 bytes, 256 MiB at T = 16384). Time: median over --reps calls after --warmup calls,
each call bracketed by CUDA events. A call that runs out of memory is recorded with
`status: "oom"`, and larger T for that attention and mode are then `skipped`; a flashgen
backward that does not exist yet is `unsupported`; any other failure is `error`. Nothing
crashes the sweep. `--memory-fraction 0.1` caps this process at 10% of the GPU, to see where
the manual path falls over on a smaller card.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

if __package__:
    from .model import ATTENTIONS, CausalSelfAttention, GPTConfig
else:  # run as a script: this folder is sys.path[0]
    from model import ATTENTIONS, CausalSelfAttention, GPTConfig

MODES = ("fwd", "fwd_bwd")
DEFAULT_TS = tuple(256 * 2**i for i in range(7))  # 256, 512, ..., 16384
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Attention-layer memory and time against T.")
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--T", type=int, nargs="+", default=list(DEFAULT_TS), dest="ts")
    p.add_argument("--attention", nargs="+", choices=ATTENTIONS, default=list(ATTENTIONS))
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", choices=tuple(TORCH_DTYPES), default="bf16")
    p.add_argument("--batch", type=int, default=1, help="B at every T (default 1)")
    p.add_argument("--tokens", type=int, help="keep B*T fixed at this instead of --batch")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--memory-fraction", type=float, help="cap this process's share of the GPU")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False; use --device cpu")
    if args.tokens is not None and any(args.tokens < t for t in args.ts):
        p.error(f"--tokens {args.tokens} is smaller than the largest T {max(args.ts)}")
    return args


def batch_for(t: int, args: argparse.Namespace) -> int:
    """B at this T: --batch, or --tokens // T when B*T is held fixed."""
    return args.tokens // t if args.tokens is not None else args.batch


class _Timer:
    """Per-call wall time of a device: CUDA events on cuda, perf_counter on cpu."""

    def __init__(self, device: str) -> None:
        self.device = device

    def time_ms(self, fn: Callable[[], Any]) -> float:
        if self.device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(impl: str, t: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One (attention, T, mode) point; raises what the call raised (the caller records it)."""
    dtype = TORCH_DTYPES[args.dtype]
    b = batch_for(t, args)
    c = args.heads * args.head_dim
    config = GPTConfig(n_layer=1, n_head=args.heads, n_embd=c, block_size=t, vocab_size=1)
    torch.manual_seed(args.seed)  # the same weights and inputs for both attentions
    layer = CausalSelfAttention(config, impl).to(device=args.device, dtype=dtype)
    x = torch.randn(b, t, c, device=args.device, dtype=dtype)
    grad_y = torch.randn(b, t, c, device=args.device, dtype=dtype)
    params = list(layer.parameters())
    if mode == "fwd_bwd":
        x.requires_grad_(True)

    def call() -> torch.Tensor:
        if mode == "fwd":
            with torch.no_grad():
                return layer(x)
        y = layer(x)
        # autograd.grad returns the gradients instead of accumulating them in .grad, so
        # repeated calls neither grow memory nor add a zeroing kernel
        return torch.autograd.grad(y, [x, *params], grad_y)[0]  # dx

    out = call()  # first call: flashgen compiles and loads its kernel here
    _sync(args.device)
    del out
    for _ in range(args.warmup):
        call()
    _sync(args.device)
    row: dict[str, Any] = {"B": b}
    if args.device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = call()
        _sync(args.device)
        peak = torch.cuda.max_memory_allocated()
        row.update(base_bytes=base, peak_bytes=peak, extra_peak_bytes=peak - base)
    else:
        out = call()  # CPU peak memory is not tracked by torch: left null
        row.update(base_bytes=None, peak_bytes=None, extra_peak_bytes=None)
    row["output"] = out.detach().float().cpu()  # y (fwd) or dx (fwd_bwd), for the error check
    del out
    timer = _Timer(args.device)
    times = [timer.time_ms(call) for _ in range(args.reps)]
    row.update(ms=statistics.median(times), ms_min=min(times))
    return row


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # the CPU allocator raises a plain RuntimeError
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.splitlines()[0][:300] if text else type(exc).__name__


def run_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Every (T, attention, mode); failures become rows, never exceptions."""
    if args.device == "cuda" and args.memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    elem = torch.finfo(TORCH_DTYPES[args.dtype]).bits // 8
    rows: list[dict[str, Any]] = []
    failed_at: dict[tuple[str, str], int] = {}  # (attention, mode) -> T of its first OOM
    for t in sorted(args.ts):
        for mode in args.modes:
            reference: torch.Tensor | None = None  # the manual output at this (T, mode)
            for impl in args.attention:
                b = batch_for(t, args)
                row: dict[str, Any] = {
                    "attention": impl, "mode": mode, "T": t, "B": b, "H": args.heads,
                    "d": args.head_dim, "dtype": args.dtype,
                    "score_matrix_bytes": b * args.heads * t * t * elem,
                }  # fmt: skip
                if (impl, mode) in failed_at:
                    row.update(status="skipped", error=f"OOM at T={failed_at[impl, mode]}")
                    rows.append(row)
                    continue
                try:
                    row.update(measure(impl, t, mode, args), status="ok", error=None)
                except NotImplementedError as exc:  # flashgen's backward, until it lands
                    row.update(status="unsupported", error=_first_line(exc))
                except Exception as exc:
                    oom = _is_oom(exc)
                    row.update(status="oom" if oom else "error", error=_first_line(exc))
                    if oom:
                        failed_at[impl, mode] = t
                finally:
                    # drop the failed call's tensors (the traceback is gone by now) so the
                    # next point starts from an empty cache
                    gc.collect()
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
                out = row.pop("output", None)
                if out is not None and impl == "manual":
                    reference = out
                elif out is not None and reference is not None:
                    row["max_abs_err_vs_manual"] = float((out - reference).abs().max())
                rows.append(row)
                print(_describe(row), flush=True)
    env: dict[str, Any] = {"torch": torch.__version__, "device": args.device}
    if args.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["total_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    return {"settings": settings, "env": env, "rows": rows}


def _describe(row: dict[str, Any]) -> str:
    head = f"T={row['T']:6d} B={row['B']:3d} {row['attention']:8s} {row['mode']:7s}"
    if row["status"] != "ok":
        return f"{head} {row['status']}: {row['error']}"
    mem = row["extra_peak_bytes"]
    mem_s = f"{mem / 2**20:10.1f} MiB" if mem is not None else "       n/a"
    err = row.get("max_abs_err_vs_manual")
    err_s = f"  err {err:.2e}" if err is not None else ""
    return f"{head} {mem_s} {row['ms']:9.3f} ms{err_s}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_sweep(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
