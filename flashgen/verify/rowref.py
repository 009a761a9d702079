"""The oracle for selected query rows, and the correctness rule for non-finite inputs.

`oracle.reference` needs every row and every key on the host, which a tensor of 2**31
elements or a 100-million-token K/V cannot afford. `row_reference` computes the same float64
answer for chosen query rows only, and accepts keys that repeat with a period (key t is
row t % P of the given K and V): a GPU buffer filled by tiling one random block is then
described exactly by that block. `rounded_row_reference` is `oracle.rounded_reference` for the
same rows (the yardstick of the fp16/bf16 rule). `fill_periodic` fills such a buffer on the GPU
and `read_rows` copies a few rows of a device array back.

`judge` applies docs/design.md's rule where inputs may hold NaN or +-inf: the kernel's NaN, +inf
and -inf elements of O and LSE must sit exactly where the float64 oracle's are, and the
finite elements obey the usual bounds, optionally widened by an a-priori fp32 error term
(`score_slack`, `sum_slack`) for problems whose logits or rows are far beyond what the
usual bounds were calibrated for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from flashgen.generator.dtypes import DTYPES
from flashgen.verify.oracle import (
    F64,
    FP32_RTOL,
    LOW_PRECISION_ATOL,
    LOW_PRECISION_FACTOR,
    LSE_ATOL,
)

# fp32 unit roundoff (half an ulp, relative)
U32 = 2.0**-24
# A score scale * q.k summed in fp32 from d products is off by about sqrt(d) roundings of its
# partial sums, each at most scale * sum|q_x k_x|; `score_slack` allows this many of them (the
# tensor cores' accumulation rounds coarser than round-to-nearest).
SCORE_ULPS = 16
# Running sums of n tile contributions in fp32 drift like a random walk of n roundings;
# `sum_slack` allows this many standard deviations of it.
SUM_SIGMAS = 8


def visible_keys(rows: npt.ArrayLike, *, tq: int, tk: int, causal: bool) -> npt.NDArray[np.int64]:
    """How many keys each query row sees: all `tk`, or (causal, bottom-right) `i + tk - tq + 1`."""
    r = np.asarray(rows, dtype=np.int64)
    if not causal:
        return np.full(r.shape, tk, dtype=np.int64)
    return np.clip(r + (tk - tq) + 1, 0, tk)


def key_counts(
    rows: npt.ArrayLike, period: int, *, tq: int, tk: int, causal: bool
) -> npt.NDArray[np.int64]:
    """(n, period): how often row i sees key row j of a K/V whose key t is row t % period."""
    n_vis = visible_keys(rows, tq=tq, tk=tk, causal=causal)[:, None]
    j = np.arange(period, dtype=np.int64)[None, :]
    # keys t < n_vis with t % period == j: j, j + period, ... below n_vis
    return np.where(j < n_vis, (n_vis - 1 - j) // period + 1, 0)


def _check_rows(
    q_rows: np.ndarray, rows: npt.ArrayLike, k: np.ndarray, v: np.ndarray, tq: int, tk: int
) -> npt.NDArray[np.int64]:
    r = np.asarray(rows, dtype=np.int64)
    if q_rows.ndim != 2 or k.ndim != 2 or v.shape != k.shape or q_rows.shape[1] != k.shape[1]:
        raise ValueError(
            f"q_rows{q_rows.shape} k{k.shape} v{v.shape}: need q_rows (n, d) and k, v (P, d); "
            "pass the selected rows of one head"
        )
    if r.shape != (q_rows.shape[0],):
        raise ValueError(
            f"rows{r.shape}: need one index per q row ({q_rows.shape[0]}); pass their indices"
        )
    if r.size and (r.min() < 0 or r.max() >= tq):
        raise ValueError(f"rows {r.min()}..{r.max()}: must lie in [0, tq={tq}); fix the indices")
    if not 1 <= k.shape[0] <= tk:
        raise ValueError(
            f"k has {k.shape[0]} rows for tk={tk}: give all tk keys or one period (1..tk rows)"
        )
    return r


def row_reference(
    q_rows: np.ndarray,
    rows: npt.ArrayLike,
    k: np.ndarray,
    v: np.ndarray,
    *,
    tq: int,
    tk: int,
    causal: bool,
    scale: float,
) -> tuple[F64, F64]:
    """Float64 (O (n, d), LSE (n,)) of query rows `rows` (indices into Tq) of one head.

    `k` and `v` hold all `tk` keys, or P < tk rows that repeat (key t is row t % P). The
    conventions are `oracle.reference`'s, IEEE non-finite propagation included.
    """
    r = _check_rows(q_rows, rows, k, v, tq, tk)
    q64, k64, v64 = (np.asarray(x, dtype=np.float64) for x in (q_rows, k, v))
    counts = key_counts(r, k.shape[0], tq=tq, tk=tk, causal=causal)
    with np.errstate(all="ignore"):  # non-finite inputs are the point of some callers
        s = np.where(counts > 0, (q64 @ k64.T) * scale, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        seen = ~np.isneginf(m)
        w = counts * np.exp(s - np.where(seen, m, 0.0))
        denom = w.sum(axis=-1, keepdims=True)
        safe = np.where(seen, denom, 1.0)
        o = np.where(seen, (w @ v64) / safe, 0.0)
        lse = np.where(seen, m + np.log(safe), -np.inf)[:, 0]
    return o, lse


def rounded_row_reference(
    q_rows: np.ndarray,
    rows: npt.ArrayLike,
    k: np.ndarray,
    v: np.ndarray,
    *,
    tq: int,
    tk: int,
    causal: bool,
    scale: float,
    dtype: str,
) -> F64:
    """`oracle.rounded_reference` for selected rows: fp32 scores, P rounded to `dtype`."""
    r = _check_rows(q_rows, rows, k, v, tq, tk)
    store = np.dtype(DTYPES[dtype].numpy)
    q32, k32, v32 = (np.asarray(x, dtype=np.float32) for x in (q_rows, k, v))
    counts = key_counts(r, k.shape[0], tq=tq, tk=tk, causal=causal).astype(np.float32)
    with np.errstate(all="ignore"):
        s = np.where(counts > 0, (q32 @ k32.T) * np.float32(scale), np.float32(-np.inf))
        m = s.max(axis=-1, keepdims=True)
        seen = ~np.isneginf(m)
        p = np.exp(s - np.where(seen, m, np.float32(0.0)))
        total = (counts * p).sum(axis=-1, keepdims=True)
        p = p / np.where(seen, total, np.float32(1.0))
        p = p.astype(store).astype(np.float32)  # the rounding that the rule measures
        out = np.where(seen, (counts * p) @ v32, np.float32(0.0))
    rounded: F64 = out.astype(store).astype(np.float64)
    return rounded


def score_slack(q: np.ndarray, k: np.ndarray, scale: float) -> float:
    """A-priori error of fp32 scores (natural-log units) for (B, H, T, d) inputs q and k.

    SCORE_ULPS * sqrt(d) * 2**-24 * max over (i, j) of scale * sum_x |q_ix k_jx|. With logits
    in the thousands it is ~1e-2: the usual LSE bound of 1e-4 is out of reach of any fp32
    kernel there (fp32 cannot even store 1e4 to 1e-4).
    """
    d = q.shape[-1]
    aq = np.abs(np.asarray(q, np.float64))
    ak = np.abs(np.asarray(k, np.float64))
    worst = float((aq @ np.swapaxes(ak, -1, -2)).max()) if aq.size and ak.size else 0.0
    return SCORE_ULPS * math.sqrt(d) * U32 * abs(scale) * worst


def sum_slack(n_terms: int) -> float:
    """A-priori relative error of an fp32 running sum of `n_terms` tile contributions."""
    return SUM_SIGMAS * math.sqrt(max(n_terms, 1)) * U32


@dataclass(frozen=True)
class Judgement:
    """A kernel's (O, LSE) against the oracle: non-finite pattern, errors, bounds, verdict."""

    o_err: float
    o_bound: float
    lse_err: float
    lse_bound: float
    mismatch: str | None  # where NaN/+inf/-inf of O or LSE differ from the oracle's; None: same

    @property
    def passed(self) -> bool:
        """Same non-finite pattern, finite errors within their bounds."""
        return (
            self.mismatch is None and self.o_err <= self.o_bound and self.lse_err <= self.lse_bound
        )

    def describe(self) -> str:
        """One line: verdict, non-finite mismatch (if any), both errors against their bounds."""
        verdict = "pass" if self.passed else "FAIL"
        where = f" {self.mismatch};" if self.mismatch else ""
        return (
            f"{verdict}:{where} O err {self.o_err:.3g} (bound {self.o_bound:.3g}), "
            f"LSE err {self.lse_err:.3g} (bound {self.lse_bound:.3g})"
        )


_KINDS = (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf))


def nonfinite_mismatch(name: str, got: np.ndarray, want: np.ndarray) -> str | None:
    """Where `got` has NaN/+inf/-inf and `want` has not, or the reverse; None when identical."""
    for kind, test in _KINDS:
        bad = test(got) != test(want)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            return (
                f"{name}: {int(bad.sum())} elements differ in {kind}, first at {idx} "
                f"(kernel {got[idx]!r}, oracle {want[idx]!r})"
            )
    return None


def _max(a: np.ndarray) -> float:
    return float(a.max()) if a.size else 0.0


def judge(
    o: np.ndarray,
    lse: np.ndarray,
    o64: np.ndarray,
    lse64: np.ndarray,
    o_ref: np.ndarray | None,
    *,
    dtype: str,
    o_slack: float = 0.0,
    lse_slack: float = 0.0,
) -> Judgement:
    """docs/design.md's rule on outputs that may be non-finite (any shapes, O's last axis d).

    The NaN, +inf and -inf elements of O and LSE must match the oracle's (O64, LSE64)
    exactly. On the finite elements: fp16/bf16 max|O - O64| <= 2 max|O_ref - O64| + 1e-5 +
    `o_slack` (absolute; `o_ref` from `rounded_reference` or `rounded_row_reference`), fp32
    ||O - O64|| / ||O64|| <= 1e-5 + `o_slack` (relative; `o_ref` unused), and
    |LSE - LSE64| <= 1e-4 + `lse_slack`.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: unknown dtype; choose one of {', '.join(DTYPES)}")
    of, lf = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    if of.shape != o64.shape or lf.shape != lse64.shape:
        raise ValueError(
            f"o{of.shape} lse{lf.shape}: expected o{o64.shape} and lse{lse64.shape}; "
            "pass outputs of the same rows as the oracle's"
        )
    mismatch = nonfinite_mismatch("O", of, o64) or nonfinite_mismatch("LSE", lf, lse64)
    fin = np.isfinite(o64) & np.isfinite(of)
    diff = np.abs(of[fin] - o64[fin])
    if DTYPES[dtype].tensor_core:
        if o_ref is None:
            raise ValueError(f"dtype={dtype}: the fp16/bf16 rule needs o_ref; pass it")
        ref = np.asarray(o_ref, np.float64)
        ok = fin & np.isfinite(ref)
        o_err = _max(diff)
        o_bound = (
            LOW_PRECISION_FACTOR * _max(np.abs(ref[ok] - o64[ok])) + LOW_PRECISION_ATOL + o_slack
        )
    else:
        norm64 = float(np.linalg.norm(o64[fin]))
        err = float(np.linalg.norm(diff))
        o_err = err / norm64 if norm64 > 0 else err
        o_bound = FP32_RTOL + o_slack
    lfin = np.isfinite(lse64) & np.isfinite(lf)
    lse_err = _max(np.abs(lf[lfin] - lse64[lfin]))
    return Judgement(o_err, o_bound, lse_err, LSE_ATOL + lse_slack, mismatch)


# PyCUDA passes memcpy_dtod byte counts as 32-bit unsigned ints: copies stay below this.
MAX_COPY_BYTES = 1 << 30


def fill_periodic(dst: Any, block: np.ndarray) -> None:
    """Fill a contiguous GPUArray so that its flat element e is block.flat[e % block.size].

    One host-to-device copy of the block, then device-to-device doubling (a few milliseconds
    for tens of GiB); the result is exactly what `row_reference` assumes of periodic keys when
    the block holds whole tokens.
    """
    from flashgen.runtime import gpu as runtime  # PyCUDA only when a GPU is used

    drv = runtime.gpu().drv
    flat = np.ascontiguousarray(block).reshape(-1)
    item = flat.dtype.itemsize
    total = int(dst.size)
    first = min(flat.size, total)
    drv.memcpy_htod(dst.gpudata, flat[:first].view(np.uint8))
    base, done = int(dst.gpudata), first
    # each copy's length must stay a multiple of the block, or later copies (which read from
    # the start) land out of phase and the tensor stops being periodic
    cap = max(flat.size, (MAX_COPY_BYTES // item) // flat.size * flat.size)
    while done < total:
        # copy from the start: `done` is a multiple of the block until the last, partial copy
        n = min(done, total - done, cap)
        drv.memcpy_dtod(base + done * item, base, n * item)
        done += n
    drv.Context.synchronize()


def read_rows(a: Any, first_row: int, count: int, width: int) -> np.ndarray:
    """Rows [first_row, first_row + count) of a contiguous GPUArray viewed as (rows, width)."""
    from flashgen.runtime import gpu as runtime

    out = np.empty((count, width), dtype=a.dtype)
    offset = int(a.gpudata) + first_row * width * a.dtype.itemsize
    runtime.gpu().drv.memcpy_dtoh(out.reshape(-1).view(np.uint8), offset)
    return out
