"""The NumPy oracle of attention's backward pass: float64 gradients and their correctness rule.

The forward function is `oracle.reference`'s (same conventions: (B, H, T, d) arrays, causal
aligned to the bottom-right corner, a sliding window around the query's key position, softcap
on the scaled logit before the mask, ALiBi per query head, grouped-query K/V, v's own head dim
dv). Given the upstream gradient dO of the output, the backward is FlashAttention's:

    P  = softmax(logits)           recomputed, every feature applied
    dV = Pᵀ dO                     dP = dO Vᵀ
    D  = rowsum(dO ∘ O)            dS = P ∘ (dP - D)       (softmax's Jacobian, row by row)
    dS ∘= 1 - tanh²(s / c)         with softcap c: d/ds c·tanh(s/c)
    dS ∘= d score_mod / d s        with a score_mod hook (its `grad`), where P > 0
    dQ = scale · dS K              dK = scale · dSᵀ Q

With grouped-query attention dK and dV are summed over the query heads that share a K/V
head, so they have k's and v's shapes. A query row that sees no key has P = 0 and contributes
nothing: its dQ row is zero and it adds nothing to dK or dV (no NaN).

User hooks (`score_mod=`, `mask_mod=`: a `features.hook.HookCall` each, as `oracle.reference`
takes them) enter as the forward applies them: the score_mod on the scaled (natural-log) score
s = scale·q·k, the mask_mod's dropped keys at -inf. The chain rule multiplies dS by the
score_mod's derivative at s, only where P > 0: a masked key (P = 0) adds exactly nothing even
where the derivative is not finite there, as in the kernels.

`reference_grads` is the float64 answer on the given inputs; `rounded_reference_grads` is
what a careful fp16/bf16 kernel computes (FlashAttention's "reference in the low dtype"); its
error is the yardstick of `check_grads`, which applies FlashAttention's gradient rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from flashgen.generator.dtypes import DTYPES
from flashgen.verify.oracle import (
    F64,
    LOW_PRECISION_FACTOR,
    _check_shapes,
    _finish_scores,
    _head_chunks,
    _mask,
    _max,
    default_scale,
    error_ratio,
    expand_kv,
    feature_values,
    split_hooks,
)

# The gradient rule: max|g - g64| <= GRAD_FACTOR * max|g_ref - g64| + eps, per gradient, with
# g_ref = `rounded_reference_grads`. The factor is FlashAttention's (and the forward's) 2.
GRAD_FACTOR = LOW_PRECISION_FACTOR
# eps = GRAD_EPS_ULPS * (the storage dtype's machine epsilon) * max|g64|: one storage ulp at the
# gradient's largest magnitude. Why it is needed: the reference's error is a single sample of
# the rounding noise. A kernel's fp32 accumulator differs from the reference's in summation
# order (tensor-core groups, atomics across key blocks for dQ, GQA heads added in another
# order), so where the exact value lies near a rounding boundary the two round to neighbouring
# storage values: one ulp apart, at an element whose reference error may happen to be ~0.
# Relative to max|g64| (not absolute like the forward's 1e-5) because gradients scale with dO
# and V, and there is no natural unit for them. FlashAttention's Hopper tests use the same
# size of slack: 2 * max|(g + 0.3 - 0.3) - g| in the low dtype, i.e. about one ulp at
# max(|g|, 0.3). It is 7.8e-3 * max|g64| for bf16, 9.8e-4 for fp16 and 1.2e-7 for fp32,
# still far below what a wrong formula moves (tests/verify/test_oracle_bwd.py injects bugs).
GRAD_EPS_ULPS = 1.0
GRAD_NAMES = ("dq", "dk", "dv")


@dataclass(frozen=True)
class GradOutcome:
    """One kernel gradient judged against the oracle: its error, the bound, and the verdict."""

    name: str  # "dq", "dk" or "dv"
    err: float  # max |g - g64|
    ref_err: float  # max |g_ref - g64|, the same-precision reference's error
    eps: float  # GRAD_EPS_ULPS storage ulps at max|g64|
    bound: float  # GRAD_FACTOR * ref_err + eps
    has_nan: bool
    passed: bool

    @property
    def ratio(self) -> float:
        """err / bound (<= 1 passes; inf when NaN was found)."""
        if self.has_nan:
            return float("inf")
        return error_ratio(self.err, self.bound)


def _store_dtype(dtype: str) -> np.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: unknown dtype; choose one of {', '.join(DTYPES)}")
    return np.dtype(DTYPES[dtype].numpy)


def _check_do(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray) -> None:
    _check_shapes(q, k, v)
    want = (*q.shape[:3], v.shape[3])
    if do.shape != want:
        raise ValueError(
            f"do{do.shape}: the output's gradient must have O's shape {want} "
            "(B, H, Tq, dv); pass dL/dO of the whole output"
        )


def _backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    scale: float | None,
    causal: bool,
    store: np.dtype | None,
    **features: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) in float64 (store=None), or a low-precision kernel's (store = the storage
    dtype): inputs rounded to it, float32 math, P and dS rounded to it before the matmuls
    that read them as tensor-core operands, the outputs rounded to it.

    One body for both, so the reference and its yardstick cannot drift apart in a feature.
    """
    _check_do(q, k, v, do)
    b, h, tq, d = q.shape
    h_kv, tk, dv = k.shape[1], k.shape[2], v.shape[3]
    group = h // h_kv
    scale = default_scale(d) if scale is None else scale
    work = np.float64 if store is None else np.float32
    t = np.dtype(work).type

    def load(x: np.ndarray) -> np.ndarray:
        # a kernel reads the storage dtype: rounding here is a no-op on already-rounded inputs
        return np.asarray(x).astype(store if store is not None else work).astype(work)

    def rnd(x: np.ndarray) -> np.ndarray:
        return x if store is None else x.astype(store).astype(work)

    ke, ve = expand_kv(q, k, v)  # one K/V head per query head; dK/dV are summed back below
    q3 = load(q).reshape(b * h, tq, d)
    k3 = load(ke).reshape(b * h, tk, d)
    v3 = load(ve).reshape(b * h, tk, dv)
    do3 = load(do).reshape(b * h, tq, dv)
    plain, hooks = split_hooks(features)
    feats = feature_values(plain)
    mask = _mask(tq, tk, causal, feats)
    dq = np.zeros((b * h, tq, d), work)
    dk = np.zeros((b * h, tk, d), work)
    dvv = np.zeros((b * h, tk, dv), work)
    for c in _head_chunks(b * h, tq, tk):
        raw = np.matmul(q3[c], k3[c].transpose(0, 2, 1)) * t(scale)
        s = _finish_scores(raw, c, h, mask, feats, hooks)
        m = s.max(axis=-1, keepdims=True)
        seen = ~np.isneginf(m)
        # A row that sees no key has every logit -inf: exp(-inf - 0) = 0 makes its P row
        # zero, so every product below gives it zero gradient without a NaN (0/0 avoided).
        p = np.exp(s - np.where(seen, m, t(0.0)))
        p = p / np.where(seen, p.sum(axis=-1, keepdims=True), t(1.0))
        p_op = rnd(p)  # P as the P·V and Pᵀ·dO operand (the forward's rounding)
        o = rnd(np.matmul(p_op, v3[c]))  # the forward's stored output, which D reads
        dvv[c] = np.matmul(p_op.transpose(0, 2, 1), do3[c])
        dp = np.matmul(do3[c], v3[c].transpose(0, 2, 1))
        dd = (do3[c] * o).sum(axis=-1, keepdims=True)
        ds = p * (dp - dd)  # fp32 P here: a kernel keeps it in registers for dS
        for feature, value in feats:  # the chain rule through each feature's logit term
            factor = feature.dlogits(value, raw)
            if factor is not None:
                ds = ds * factor
        if hooks.score is not None:  # the score_mod's chain rule, on the same scaled scores
            factor = hooks.score.dlogits(raw, c, h)
            with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 where P = 0: dropped
                ds = np.where(p != 0, ds * factor, t(0.0))
        ds_op = rnd(ds)  # dS as the dS·K and dSᵀ·Q operand
        # the scale is applied to the accumulators at the end, as FlashAttention does
        dq[c] = np.matmul(ds_op, k3[c]) * t(scale)
        dk[c] = np.matmul(ds_op.transpose(0, 2, 1), q3[c]) * t(scale)
    # grouped-query heads: query head i used K/V head i // group (np.repeat's order), so the
    # group's contributions are adjacent; summed in the accumulator type, then stored
    dk_kv = dk.reshape(b, h_kv, group, tk, d).sum(axis=2)
    dv_kv = dvv.reshape(b, h_kv, group, tk, dv).sum(axis=2)
    return (
        rnd(dq).reshape(b, h, tq, d).astype(np.float64),
        rnd(dk_kv).astype(np.float64),
        rnd(dv_kv).astype(np.float64),
    )


def reference_grads(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    scale: float | None = None,
    causal: bool = False,
    **features: Any,
) -> tuple[F64, F64, F64]:
    """Float64 gradients (dQ, dK, dV) of L = sum(O ∘ dO), O = `oracle.reference`'s output.

    q (B, H, Tq, d), k (B, H_kv, Tk, d), v (B, H_kv, Tk, dv), do (B, H, Tq, dv); the results
    have the shapes of q, k and v (dK and dV summed over each K/V head's query heads).
    `scale` defaults to 1/sqrt(d); features and hooks as in `oracle.reference`. Rows that see no key
    contribute zero. Non-finite inputs follow IEEE arithmetic (NaN spreads).
    """
    return _backward(
        q, k, v, do, scale=scale, causal=causal, store=None, **features
    )


def rounded_reference_grads(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    dtype: str,
    scale: float | None = None,
    causal: bool = False,
    **features: Any,
) -> tuple[F64, F64, F64]:
    """FlashAttention's "reference in the low dtype" for gradients: the yardstick of the rule.

    What a careful fp16/bf16 kernel computes: q, k, v, dO in the storage dtype; scores,
    softmax, dP, D and dS in float32; P rounded to the storage dtype before Pᵀ·dO (and before
    P·V for the forward O that D = rowsum(dO ∘ O) reads, as the kernel reads its stored O);
    dS rounded to it before dS·K and dSᵀ·Q; float32 accumulation (GQA heads included); the
    scale applied to the accumulators; each gradient rounded to the storage dtype. Returned
    as float64 holding exactly the storage-dtype values. Features as in `reference_grads`.
    """
    return _backward(
        q, k, v, do, scale=scale, causal=causal, store=_store_dtype(dtype), **features
    )


def grad_eps(g64: np.ndarray, dtype: str) -> float:
    """The rule's slack for one gradient: GRAD_EPS_ULPS storage ulps at max|g64| (see above)."""
    # the spacing of the storage dtype at 1 (its machine epsilon; np.finfo refuses bfloat16)
    machine_eps = float(np.spacing(np.ones((), _store_dtype(dtype))))
    return GRAD_EPS_ULPS * machine_eps * _max(np.abs(g64))


CANCEL_ULPS = 8.0
"""fp32 ulps of the cancellation floor (see `cancel_floor`)."""


def cancel_floor(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, scale: float
) -> float:
    """An absolute slack for the cancellation in dS = P * (dP - D).

    dP = dO.V^T and D = rowsum(dO * O) are fp32 values of size ~max|dO| * max|V| whose
    difference can be exactly zero in exact arithmetic (a row seeing one key: dQ = dK = 0),
    while any fp32 kernel leaves a few ulps of them; dQ and dK carry that times scale * |K|
    (or |Q|). So CANCEL_ULPS fp32 ulps of max|dO| * max|V| * scale * max(|Q|, |K|): ~1e-6 for
    unit-normal inputs at d = 64, far below a bf16/fp16 ulp of any real gradient. Without it
    an exactly-zero gradient demands bit-exact zeros (the relative eps is then 0).
    """
    qk = max(_max(np.abs(np.asarray(q, np.float64))), _max(np.abs(np.asarray(k, np.float64))))
    dov = _max(np.abs(np.asarray(do, np.float64))) * _max(np.abs(np.asarray(v, np.float64)))
    return CANCEL_ULPS * 2.0**-23 * dov * scale * qk


def check_grads(
    got: tuple[np.ndarray, np.ndarray, np.ndarray],
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    dtype: str,
    scale: float | None = None,
    causal: bool = False,
    **features: Any,
) -> list[GradOutcome]:
    """Judge a kernel's (dQ, dK, dV) with FlashAttention's gradient rule, one outcome each.

    For each gradient g: max|g - g64| <= 2 * max|g_ref - g64| + eps, where g64 is
    `reference_grads` on the same (already rounded) inputs, g_ref `rounded_reference_grads`,
    and eps = `grad_eps` (one storage ulp at max|g64|) + `cancel_floor` (fp32 cancellation in
    dS). The same rule for fp32, whose
    reference is plain float32 arithmetic. Any NaN fails. Features as in `reference_grads`.
    """
    _store_dtype(dtype)  # an unknown dtype is refused before any work
    feature_values(split_hooks(features)[0])  # unknown keywords fail before any work
    feats: dict[str, Any] = {"scale": scale, "causal": causal, **features}
    g64 = reference_grads(q, k, v, do, **feats)
    if len(got) != 3 or any(np.shape(a) != b.shape for a, b in zip(got, g64, strict=False)):
        raise ValueError(
            f"got shapes {[np.shape(a) for a in got]}: expected (dq, dk, dv) of shapes "
            f"{[g.shape for g in g64]} (those of q, k and v); pass the kernel's full gradients"
        )
    g_ref = rounded_reference_grads(q, k, v, do, dtype=dtype, **feats)
    floor = cancel_floor(q, k, v, do, default_scale(q.shape[-1]) if scale is None else scale)
    outcomes: list[GradOutcome] = []
    for name, g, want, ref in zip(GRAD_NAMES, got, g64, g_ref, strict=True):
        gf = np.asarray(g, dtype=np.float64)
        has_nan = bool(np.isnan(gf).any())
        err = _max(np.abs(gf - want))
        ref_err = _max(np.abs(ref - want))
        eps = grad_eps(want, dtype) + floor
        bound = GRAD_FACTOR * ref_err + eps
        outcomes.append(
            GradOutcome(name, err, ref_err, eps, bound, has_nan, (not has_nan) and err <= bound)
        )
    return outcomes
