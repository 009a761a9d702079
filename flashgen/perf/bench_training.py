"""`flashgen bench`'s training-step rows (issue 25): attention as a model's training step calls it,
forward then backward through autograd, host time included.

Rows (`training_cases`): B 2, T 8192, d 64 (H 32) and d 128 (H 16) -- H x d = 2048 --, causal and
not, bf16 (the issue's; `flashgen bench --dtype` picks others). The inputs are what a
transformer block hands its attention: q, k and v as (B, T, H, d) views of one packed
(B, T, 3, H, d) projection output that requires grad, and the gradient of the (B, T, H, d)
output. One step of each implementation is the call a model makes on those views and
`torch.autograd.grad` back to the projection:
- flashgen: `flashgen.torch.attention(q.transpose(1, 2), ...)` (its op's layout, (B, H, T, d)),
  the output transposed back;
- SDPA: `F.scaled_dot_product_attention` on the same transposed views, its default backend choice
  (cuDNN on the H200): the call a user switches from;
- FA4: `flash_attn.cute.flash_attn_func` on the (B, T, H, d) views themselves (its native
  layout), where `flash_attn.cute` imports.
Each step is timed with CUDA events around back-to-back steps (`bench.time_ms`: the host's
enqueue work, autograd's included, counts as a training loop sees it); the row's time is the
median over interleaved rounds. TFLOP/s at 3.5x the forward's FLOPs (forward 1, backward 2.5);
"x peer" is the best peer's time over flashgen's (above 1: flashgen is faster). Every
implementation's gradients are compared with SDPA's before timing (`max_err_vs_sdpa`).

Rows are plain dicts (`kind` "training"), as `BenchResult.training` writes them to the JSON. A
failing implementation is recorded in its row's `error`, never a crash.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flashgen.perf import bench

TRAIN_DTYPE = "bf16"
TRAIN_B = 2
TRAIN_T = 8192
TRAIN_MODEL_DIM = 2048  # H x d
TRAIN_HEAD_DIMS = (64, 128)
TRAIN_FLOPS_FACTOR = 1.0 + bench.BWD_FLOPS_FACTOR  # forward + backward, in forwards
TRAIN_ROUNDS = 3  # interleaved rounds: each implementation once a round
IMPLS = ("flashgen", "sdpa", "fa4")


@dataclass(frozen=True)
class TrainCase:
    """One training-step problem: (B, T, H, d) with H x d = TRAIN_MODEL_DIM."""

    d: int
    causal: bool
    b: int = TRAIN_B
    t: int = TRAIN_T
    dtype: str = TRAIN_DTYPE

    @property
    def h(self) -> int:
        """Heads so that H x d = TRAIN_MODEL_DIM."""
        return TRAIN_MODEL_DIM // self.d

    @property
    def flops(self) -> float:
        """FLOPs of one step: 3.5 x the forward's 4*B*H*T*T*d (halved under a causal mask)."""
        f = 4.0 * self.b * self.h * self.t * self.t * self.d * TRAIN_FLOPS_FACTOR
        return f / 2 if self.causal else f

    @property
    def label(self) -> str:
        """E.g. "d128 causal B2 T8192"."""
        mask = "causal" if self.causal else "non-causal"
        return f"d{self.d} {mask} B{self.b} T{self.t}"


def training_cases(dtypes: Sequence[str] = (TRAIN_DTYPE,)) -> list[TrainCase]:
    """The issue's rows, d 64 and 128, causal and not, in each of `dtypes` (the issue's is
    bf16)."""
    return [
        TrainCase(d, c, dtype=t) for t in dtypes for d in TRAIN_HEAD_DIMS for c in (False, True)
    ]


def _inputs(case: TrainCase) -> tuple[Any, Any]:
    """(packed projection (B, T, 3, H, d) requiring grad, dO (B, T, H, d))."""
    torch = bench._torch()
    dt = bench.torch_dtype(case.dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn((case.b, case.t, 3, case.h, case.d), device="cuda", dtype=dt, generator=g)
    do = torch.randn((case.b, case.t, case.h, case.d), device="cuda", dtype=dt, generator=g)
    return qkv.requires_grad_(), do


def step_fn(impl: str, qkv: Any, do: Any, causal: bool) -> Callable[[], Any]:
    """One training step of `impl` on the packed projection: forward on its q, k, v views, then
    the gradient back to `qkv` (returned)."""
    torch = bench._torch()

    def views() -> tuple[Any, Any, Any]:
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B, T, H, d) each

    if impl == "flashgen":
        from flashgen import torch as fg_torch

        def forward() -> Any:
            q, k, v = (x.transpose(1, 2) for x in views())
            return fg_torch.attention(q, k, v, causal=causal).transpose(1, 2)

    elif impl == "sdpa":
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def forward() -> Any:
            q, k, v = (x.transpose(1, 2) for x in views())
            return sdpa(q, k, v, is_causal=causal).transpose(1, 2)

    elif impl == "fa4":
        from flash_attn.cute.interface import flash_attn_func

        def forward() -> Any:
            out = flash_attn_func(*views(), causal=causal)
            return out[0] if isinstance(out, tuple) else out

    else:
        raise ValueError(f"impl={impl!r}: not one of {', '.join(IMPLS)}")

    def step() -> Any:
        (grad,) = torch.autograd.grad(forward(), (qkv,), do)
        return grad

    return step


def available_impls() -> tuple[str, ...]:
    """flashgen and SDPA, and FA4 where `flash_attn.cute` imports."""
    return (*IMPLS[:2], *(("fa4",) if bench.fa4_available() else ()))


def training_row(
    case: TrainCase, peers: bool = True, reps: int = bench.REPS, rounds: int = TRAIN_ROUNDS
) -> list[dict[str, Any]]:
    """One row per implementation of `case` (flashgen alone without `peers`): median ms over
    `rounds` interleaved rounds, TFLOP/s, the gradients' max |difference| from SDPA's."""
    impls = available_impls() if peers else ("flashgen",)
    qkv, do = _inputs(case)
    base: dict[str, Any] = {
        "kind": "training", "dtype": case.dtype, "d": case.d, "causal": case.causal,
        "b": case.b, "t": case.t, "h": case.h,
    }  # fmt: skip
    rows = {impl: {**base, "impl": impl, "ms": None, "tflops": None} for impl in impls}
    steps: dict[str, Callable[[], Any]] = {}
    ref: Any = None
    for impl in ("sdpa", *[i for i in impls if i != "sdpa"]):  # SDPA first: the reference
        try:
            fn = step_fn(impl, qkv, do, case.causal)
            grad = fn()
            if impl == "sdpa":
                ref = grad.float()
            elif ref is not None:
                rows[impl]["max_err_vs_sdpa"] = float((grad.float() - ref).abs().max())
            del grad
            if impl in rows:
                steps[impl] = fn
        except Exception as exc:  # a backend this build lacks, or a shape it refuses
            if impl in rows:
                rows[impl]["error"] = bench.error_text(exc)
    times: dict[str, list[float]] = {impl: [] for impl in steps}
    for _ in range(rounds):
        for impl, fn in steps.items():
            try:
                times[impl].append(bench.time_ms(fn, reps=reps))
            except Exception as exc:
                rows[impl]["error"] = bench.error_text(exc)
    for impl, ts in times.items():
        if ts and "error" not in rows[impl]:
            ms = statistics.median(ts)
            rows[impl].update(ms=ms, tflops=case.flops / (ms * 1e-3) / 1e12)
    del qkv, do, ref, steps
    return list(rows.values())


def error_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per failed implementation: which row, and why."""
    return [
        f"training {r['impl']} {r['dtype']} d={r['d']} causal={r['causal']}: {r['error']}"
        for r in rows
        if r.get("kind") == "training" and r.get("error")
    ]


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each flashgen row's `x_<peer>` (the peer's ms over flashgen's) and `x_peer` (the best
    peer's), from the peer rows of the same case."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["dtype"], r["d"], r["causal"], r["b"], r["t"])

    peers: dict[tuple[Any, ...], dict[str, float]] = {}
    for r in rows:
        if r.get("kind") == "training" and r["impl"] != "flashgen" and r.get("ms"):
            peers.setdefault(key(r), {})[r["impl"]] = r["ms"]
    for r in rows:
        if r.get("kind") != "training" or r["impl"] != "flashgen" or not r.get("ms"):
            continue
        mine = peers.get(key(r), {})
        for impl, ms in mine.items():
            r[f"x_{impl}"] = ms / r["ms"]
        r["x_peer"] = min(mine.values()) / r["ms"] if mine else None


def training_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and lines: one line per case, ms and TFLOP/s of each implementation, x peer."""
    rows = [r for r in rows if r.get("kind") == "training"]
    add_ratios(rows)
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    headers = ["dtype", "d", "causal", "B", "T", *[f"{i} ms (TFLOP/s)" for i in impls], "x peer"]
    cases: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in rows:
        cases.setdefault((r["dtype"], r["d"], r["causal"], r["b"], r["t"]), {})[r["impl"]] = r
    lines = []
    for (dtype, d, causal, b, t), by_impl in cases.items():
        cells = []
        for i in impls:
            cell = by_impl.get(i)
            if cell is None:
                cells.append("-")
            elif cell.get("ms"):
                cells.append(f"{cell['ms']:.2f} ({cell['tflops']:.0f})")
            else:
                cells.append("error" if cell.get("error") else "-")
        ratio = by_impl.get("flashgen", {}).get("x_peer")
        lines.append([dtype, str(d), "yes" if causal else "no", str(b), str(t), *cells,
                      f"{ratio:.2f}" if ratio else "-"])  # fmt: skip
    return headers, lines
