"""The NumPy oracle: float64 attention, the rounded-P reference, and the correctness rule.

Every family computes `softmax(Q·Kᵀ·scale + mask)·V` with causal attention aligned to the
bottom-right corner (query `i` sees keys `j <= i + Tk - Tq`); a query row that sees no key
outputs zeros and LSE `-inf`. `reference` computes that in float64 on the already-rounded
inputs; `rounded_reference` is FlashAttention's "reference in the low dtype" (P rounded to
the storage dtype before P·V); `check_outputs` applies docs/design.md's rule to a kernel's output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from flashgen.generator.dtypes import DTYPES
from flashgen.generator.features import BY_KEYWORD, RUNTIME_FEATURES, Feature
from flashgen.generator.features.hook import HookCall

F64 = npt.NDArray[np.float64]

# Score elements (heads x Tq x Tk) one chunk of heads may hold: 2**22 float64 is 32 MiB, so a
# T = 2k problem runs one head at a time while many small heads are batched together.
CHUNK_SCORES = 1 << 22

# The correctness rule (docs/design.md), in one place.
LOW_PRECISION_FACTOR = 2.0  # fp16/bf16: kernel error <= 2 x the rounded reference's error ...
LOW_PRECISION_ATOL = 1e-5  # ... + this absolute slack
FP32_RTOL = 1e-5  # fp32: ||O - O64|| / ||O64||
# LSE: |LSE - LSE64| <= LSE_ATOL (fixed, kept for rowref's slack-widened judgement of extreme
# inputs) is replaced in `check_outputs` by `lse_bound`: what fp32 arithmetic can miss.
LSE_ATOL = 1e-4
# fp32 unit roundoff (half an ulp, relative)
U32 = 2.0**-24
# `lse_bound`'s model of a score q.k summed on tensor cores: products are added to the fp32
# accumulator in groups of SCORE_GROUP (A100: 8; H100: 16 - the smaller is the worse case),
# each group aligned to its largest operand and truncated, which costs at most
# SCORE_GROUP_ULPS ulps of the running magnitude (the final truncation plus the bits shifted
# out of the other addends); the running magnitude never exceeds scale * sum_x |q_x k_x|.
SCORE_GROUP = 8
SCORE_GROUP_ULPS = 2
# Whatever the model leaves out (ex2.approx and log2f are within 2 ulps, i.e. ~1e-7 relative;
# the shuffle reduction order): an absolute floor, ten times the fp32 resolution of an LSE of 8.
LSE_FLOOR = 1e-5


@dataclass(frozen=True)
class CheckOutcome:
    """A kernel output judged against the oracle: errors, their bounds, and the verdict."""

    o_err: float
    o_bound: float
    lse_err: float
    lse_bound: float
    has_nan: bool
    passed: bool

    @property
    def ratio(self) -> float:
        """The worse of error/bound for O and LSE (<= 1 passes; inf when NaN was found)."""
        if self.has_nan:
            return float("inf")
        return max(error_ratio(self.o_err, self.o_bound), error_ratio(self.lse_err, self.lse_bound))


def error_ratio(err: float, bound: float) -> float:
    """err / bound, with 0/0 = 0 and anything else over a zero bound = inf."""
    if err == 0.0:
        return 0.0
    return err / bound if bound > 0 else float("inf")


def default_scale(d: int) -> float:
    """The softmax scale every family uses when none is given: 1/sqrt(d)."""
    return 1.0 / float(np.sqrt(d))


def causal_mask(tq: int, tk: int) -> npt.NDArray[np.bool_]:
    """(Tq, Tk) boolean mask of visible keys, bottom-right aligned: j <= i + Tk - Tq."""
    return visible(tq, tk, causal=True)


def _check_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q/k/v ndim={q.ndim}/{k.ndim}/{v.ndim}: the oracle needs (B, H, T, d) arrays; "
            "reshape to 4 dimensions"
        )
    if (
        q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]
        or k.shape[1] < 1 or q.shape[1] % k.shape[1]
    ):  # fmt: skip
        raise ValueError(
            f"q{q.shape} k{k.shape} v{v.shape}: need q (B, H, Tq, d), k (B, H_kv, Tk, d) and "
            "v (B, H_kv, Tk, dv) with H a multiple of H_kv; make batch, heads and d agree"
        )


FeatureValues = tuple[tuple[Feature, Any], ...]

HOOK_KEYWORDS = ("score_mod", "mask_mod")
"""The oracle's hook keywords: a `features.hook.HookCall` (the hook and its aux values)."""


@dataclass(frozen=True)
class Hooks:
    """A problem's user hooks for the oracle (None: none of that kind)."""

    score: HookCall | None = None
    mask: HookCall | None = None


def split_hooks(features: dict[str, Any]) -> tuple[dict[str, Any], Hooks]:
    """The feature keywords without `score_mod` / `mask_mod`, and those hooks (checked: a
    HookCall of the right kind)."""
    rest = {k: v for k, v in features.items() if k not in HOOK_KEYWORDS}
    calls: list[HookCall | None] = []
    for kw in HOOK_KEYWORDS:
        call = features.get(kw)
        if call is not None and not (isinstance(call, HookCall) and call.hook.kind == kw):
            raise TypeError(
                f"{kw}={call!r}: must be a HookCall of a {kw} hook; pass "
                f"HookCall(hook, aux={{...}}) (flashgen.generator.features.hook)"
            )
        calls.append(call)
    return rest, Hooks(*calls)


def feature_values(features: dict[str, Any]) -> FeatureValues:
    """The oracle's feature keywords (`window=`, `softcap=`, `alibi_slopes=`: each feature's
    `keyword`) as (feature, value) in registry order; None: off. TypeError on an unknown one."""
    unknown = sorted(set(features) - set(BY_KEYWORD))
    if unknown:
        raise TypeError(
            f"unknown feature keyword {', '.join(unknown)}; the features take "
            f"{', '.join(BY_KEYWORD)}"
        )
    return tuple((f, features.get(f.keyword)) for f in RUNTIME_FEATURES)


def visible(tq: int, tk: int, *, causal: bool, **features: Any) -> npt.NDArray[np.bool_]:
    """(Tq, Tk) mask of the keys each query sees. Query i sits at key position
    p = i + Tk - Tq (bottom-right alignment); causal keeps j <= p, and each feature its own
    keys (`Feature.visible`: a sliding window (left, right) keeps p - left <= j <= p + right,
    a negative side unbounded)."""
    i = np.arange(tq)[:, None] + (tk - tq)
    j = np.arange(tk)[None, :]
    ok = np.ones((tq, tk), np.bool_)
    if causal:
        ok &= j <= i
    for feature, value in feature_values(features):
        keep = feature.visible(value, tq, tk)
        if keep is not None:
            ok &= keep
    return ok


def _mask(tq: int, tk: int, causal: bool, feats: FeatureValues) -> npt.NDArray[np.bool_] | None:
    """`visible`, or None when nothing is masked (no causal mask, no masking feature)."""
    masks = [m for f, v in feats if (m := f.visible(v, tq, tk)) is not None]
    if not causal and not masks:
        return None
    ok = visible(tq, tk, causal=causal)
    for m in masks:
        ok &= m
    return ok


def _finish_scores(
    s: np.ndarray,
    rows: slice,
    h: int,
    mask: npt.NDArray[np.bool_] | None,
    feats: FeatureValues,
    hooks: Hooks = Hooks(),  # noqa: B008 (immutable)
) -> np.ndarray:
    """Scaled scores s of the (batch*head) `rows` -> the logits the softmax sees: each
    feature's logit term in registry order (softcap, then ALiBi's bias), the score_mod hook,
    then the mask (-inf) and the mask_mod hook's; in s's own float type (float64 or float32)."""
    heads = np.arange(rows.start, rows.stop) % h
    for feature, value in feats:
        s = feature.logits(value, s, heads)
    if hooks.score is not None:
        s = hooks.score.logits(s, rows, h)
    if mask is not None:
        s = np.where(mask, s, s.dtype.type(-np.inf))
    if hooks.mask is not None:
        s = np.where(hooks.mask.keep(rows, h, s.shape[1], s.shape[2]), s, s.dtype.type(-np.inf))
    return s


def expand_kv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """K and V with one head per query head: grouped-query attention written out plainly
    (query head i reads K/V head i // (H / H_kv)); unchanged when the head counts agree."""
    _check_shapes(q, k, v)
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return k, v
    return np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)


def _head_chunks(bh: int, tq: int, tk: int) -> Iterator[slice]:
    step = max(1, CHUNK_SCORES // max(1, tq * tk))
    for start in range(0, bh, step):
        yield slice(start, min(bh, start + step))


def max_abs_logit(q: np.ndarray, k: np.ndarray, scale: float) -> float:
    """max |scale * q_i . k_j| over every head and (i, j) pair, mask ignored (float32 math)."""
    k, _ = expand_kv(q, k, k)
    b, h, tq, d = q.shape
    tk = k.shape[2]
    q3 = q.reshape(b * h, tq, d).astype(np.float32)
    k3 = k.reshape(b * h, tk, d).astype(np.float32)
    best = 0.0
    for c in _head_chunks(b * h, tq, tk):
        s = np.matmul(q3[c], k3[c].transpose(0, 2, 1))
        best = max(best, float(np.abs(s).max()) * abs(scale))
    return best


def lse_bound(
    q: np.ndarray,
    k: np.ndarray,
    *,
    scale: float,
    causal: bool = False,
    **features: Any,
) -> float:
    """The largest |LSE - LSE64| that fp32 arithmetic allows a correct kernel (natural log).

    LSE = logsumexp_j s_j is 1-Lipschitz in max_j |ds_j|, so an error in the scores moves it
    by at most the largest score error; the rest is the relative error of the sum l and the
    rounding of the result. With S = max over (i, j) of scale * sum_x |q_ix k_jx| (every pair,
    mask ignored), M = max |scale * q_i . k_j|, n = the most keys a row sees, d the head dim:

      scores      (d / SCORE_GROUP) * SCORE_GROUP_ULPS * ulp32(S)   tensor-core groups
      scale       U32 * M          scale * log2(e) is one fp32 number (relative error U32)
      exponents   4 * U32 * (2 M) + 4 * U32    the fp32 argument s * scale_log2 - m (|.| <= 2M)
                                               and ex2.approx (2 ulps) of every p
      sum         n * U32          l summed in fp32 from n positive terms (gamma_n)
      result      2 * ulp32(LSE)   (m + log2 l) * ln 2 rounded twice; LSE <= M + log(n)
      floor       LSE_FLOOR

    This replaces a fixed 1e-4, which asked for less than one fp32 ulp of S at large logits:
    issue 9's `thorough` failure (fp16, d = 256, B=H=Tq=Tk=1, scale 0.5, logit 60, seed 11242:
    1.08e-4..1.23e-4 measured on the H200) has S ~ 1.2e4, where one ulp is 9.8e-4.
    FlashAttention's form (2x a same-precision reference's error) is not used for LSE: on one
    score that error is a single sample that can be ~0, and NumPy's fp32 rounds to nearest
    where tensor cores truncate. The bound still sees real bugs on the suite's problems: a
    scale off by 1e-4 moves LSE by 1e-4 * E_p[s] (6e-3 at logits of 60, while d = 256 with
    many keys allows ~1e-3), and at ordinary logits the bound is ~2e-5..5e-5, below the old
    1e-4 (tests/verify/test_oracle.py injects diagonal, dropped-key, scale and swapped-V bugs).

    Features add what their fp32 evaluation can miss on one logit (LSE moves by at most the
    largest logit error; each feature's `lse_terms`, in registry order):
      softcap c   8 * U32 * c + 4 * U32 * M   tanh on the SFU (a few 1e-7 absolute, times c)
                                              and the roundings of s * scale / c and c * log2 e;
                                              the logits shrink to |.| <= c, so M = min(M, c)
                                              in the other terms
      ALiBi       2 * U32 * (A + M)           slope * log2 e and the fused add of -slope * dist,
                                              A = max slope * (Tq + Tk) the largest |bias|;
                                              the exponent terms see M + A
      score_mod   `HookCall.lse_terms`: (ops + 2) * 4 * U32 * X + (G - 1)+ * (score error)
                  + G * 2 U32 M,
                  X the largest finite intermediate of the hook over the problem, G the largest
                  |d new / d score|, the score error the tensor-core term above; the exponent
                  terms see M' = the largest finite |new score| (a model for well-conditioned
                  hooks, not a proof: docs/hooks.md)
    A mask_mod adds no error (it only removes keys).
    """
    features, hooks = split_hooks(features)
    k, _ = expand_kv(q, k, k)
    b, h, tq, d = q.shape
    tk = k.shape[2]
    q3 = np.abs(q.reshape(b * h, tq, d).astype(np.float64))
    k3 = np.abs(k.reshape(b * h, tk, d).astype(np.float64))
    big_s = 0.0
    for c in _head_chunks(b * h, tq, tk):
        big_s = max(big_s, float(np.matmul(q3[c], k3[c].transpose(0, 2, 1)).max()) * scale)
    big_m = min(max_abs_logit(q, k, scale), big_s)
    n = tk  # the last query row sees every key, causal or not (bottom-right alignment)
    groups = math.ceil(d / SCORE_GROUP)
    terms = 0.0
    for feature, value in feature_values(features):
        term, big_m = feature.lse_terms(value, big_m, tq, tk)
        terms += term
    if hooks.score is not None:
        term, big_m = _hook_lse_terms(
            hooks.score, q, k, scale, groups * SCORE_GROUP_ULPS * ulp32(big_s)
        )
        terms += term
    lse_max = big_m + math.log(max(n, 1))
    return float(
        groups * SCORE_GROUP_ULPS * ulp32(big_s)
        + U32 * big_m
        + 4 * U32 * (2 * big_m + 1)
        + n * U32
        + 2 * ulp32(lse_max)
        + terms
        + LSE_FLOOR
    )


def _hook_lse_terms(
    call: HookCall, q: np.ndarray, k: np.ndarray, scale: float, score_err: float
) -> tuple[float, float]:
    """A score_mod's (error, M') over every (batch, head) chunk of the problem (k expanded)."""
    b, h, tq, d = q.shape
    tk = k.shape[2]
    q3 = q.reshape(b * h, tq, d).astype(np.float64)
    k3 = k.reshape(b * h, tk, d).astype(np.float64)
    err, new = 0.0, 0.0
    for c in _head_chunks(b * h, tq, tk):
        s = np.matmul(q3[c], k3[c].transpose(0, 2, 1)) * scale
        e, n = call.lse_terms(s, c, h, score_err)
        err, new = max(err, e), max(new, n)
    return err, new


def ulp32(x: float) -> float:
    """The spacing of float32 numbers at |x| (0 -> the smallest subnormal; inf -> inf)."""
    if not math.isfinite(x):
        return math.inf
    return float(np.spacing(np.float32(min(abs(x), float(np.finfo(np.float32).max)))))


def reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool,
    scale: float,
    **features: Any,
) -> tuple[F64, F64]:
    """Float64 attention of (B, H, T, d) inputs: returns (O64 (B,H,Tq,dv), LSE64 (B,H,Tq)).

    Scores s = scale * q.k; with `softcap` c > 0, s = c * tanh(s / c); with `alibi_slopes`
    (one per query head), s -= slope * |p - j|; with `score_mod` (a `HookCall`), s becomes the
    hook's value (evaluated in float64); then keys outside `visible` (causal and/or a
    sliding `window` (left, right)) and those a `mask_mod` drops are masked. k and v may have
    fewer heads than q (grouped-query attention) and v its own head dim dv.
    LSE is the natural-log log-sum-exp of the final scores; rows that see no key (or
    whose every logit is -inf) get O = 0 and LSE = -inf. Non-finite inputs follow IEEE
    arithmetic: a NaN or +inf logit makes its row's O and LSE NaN.
    """
    features, hooks = split_hooks(features)
    k, v = expand_kv(q, k, v)
    b, h, tq, d = q.shape
    tk, dv = k.shape[2], v.shape[3]
    q3 = q.reshape(b * h, tq, d).astype(np.float64)
    k3 = k.reshape(b * h, tk, d).astype(np.float64)
    v3 = v.reshape(b * h, tk, dv).astype(np.float64)
    feats = feature_values(features)
    mask = _mask(tq, tk, causal, feats)
    o = np.zeros((b * h, tq, dv), np.float64)
    lse = np.full((b * h, tq), -np.inf, np.float64)
    for c in _head_chunks(b * h, tq, tk):
        s = np.matmul(q3[c], k3[c].transpose(0, 2, 1)) * scale
        s = _finish_scores(s, c, h, mask, feats, hooks)
        m = s.max(axis=-1, keepdims=True)
        # rows with a logit above -inf; a NaN or +inf max is kept, so such rows come out NaN
        # (IEEE propagation) instead of passing for rows that see no key
        seen = ~np.isneginf(m)
        p = np.exp(s - np.where(seen, m, 0.0))
        denom = p.sum(axis=-1, keepdims=True)
        safe = np.where(seen, denom, 1.0)
        o[c] = np.where(seen, np.matmul(p, v3[c]) / safe, 0.0)
        lse[c] = np.where(seen, m + np.log(safe), -np.inf)[..., 0]
    return o.reshape(b, h, tq, dv), lse.reshape(b, h, tq)


def rounded_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool,
    scale: float,
    dtype: str,
    **features: Any,
) -> F64:
    """FlashAttention's "reference in the low dtype": its error is the yardstick for a kernel.

    Scores and softmax in float32 (from the rounded inputs), the normalised P rounded to the
    storage dtype before P·V (float32 accumulation), the output rounded to the storage dtype.
    Returned as float64 holding exactly the storage-dtype values. Features as in `reference`.
    """
    features, hooks = split_hooks(features)
    k, v = expand_kv(q, k, v)
    store = np.dtype(DTYPES[dtype].numpy)
    b, h, tq, d = q.shape
    tk, dv = k.shape[2], v.shape[3]
    q3 = q.reshape(b * h, tq, d).astype(np.float32)
    k3 = k.reshape(b * h, tk, d).astype(np.float32)
    v3 = v.reshape(b * h, tk, dv).astype(np.float32)
    feats = feature_values(features)
    mask = _mask(tq, tk, causal, feats)
    o = np.zeros((b * h, tq, dv), np.float64)
    for c in _head_chunks(b * h, tq, tk):
        s = np.matmul(q3[c], k3[c].transpose(0, 2, 1)) * np.float32(scale)
        s = _finish_scores(s, c, h, mask, feats, hooks)
        m = s.max(axis=-1, keepdims=True)
        seen = ~np.isneginf(m)
        p = np.exp(s - np.where(seen, m, np.float32(0.0)))
        p = p / np.where(seen, p.sum(axis=-1, keepdims=True), np.float32(1.0))
        p = p.astype(store).astype(np.float32)  # the rounding that the rule measures
        out = np.where(seen, np.matmul(p, v3[c]), np.float32(0.0))
        o[c] = out.astype(store).astype(np.float64)
    return o.reshape(b, h, tq, dv)


def check_outputs(
    o: np.ndarray,
    lse: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool,
    scale: float,
    dtype: str,
    **features: Any,
) -> CheckOutcome:
    """Judge a kernel's (O, LSE) with the correctness rule of docs/design.md (features as in
    `reference`).

    fp16/bf16: max|O - O64| <= 2 * max|O_ref - O64| + 1e-5 (O_ref: `rounded_reference`);
    fp32: ||O - O64|| / ||O64|| <= 1e-5 (when ||O64|| = 0, ||O|| itself must be <= 1e-5);
    LSE: |LSE - LSE64| <= `lse_bound` (what fp32 arithmetic allows; ~1e-5 at ordinary logits)
    where LSE64 is finite, and exactly -inf where it is -inf. Any NaN in O or LSE fails.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: unknown dtype; choose one of {', '.join(DTYPES)}")
    feature_values(split_hooks(features)[0])  # unknown keywords fail before any work
    o64, lse64 = reference(q, k, v, causal=causal, scale=scale, **features)
    if o.shape != o64.shape or lse.shape != lse64.shape:
        raise ValueError(
            f"o{o.shape} lse{lse.shape}: expected o{o64.shape} and lse{lse64.shape}; "
            "pass the kernel's full outputs"
        )
    of = np.asarray(o, dtype=np.float64)
    lf = np.asarray(lse, dtype=np.float64)
    has_nan = bool(np.isnan(of).any() or np.isnan(lf).any())

    diff = np.abs(of - o64)
    if DTYPES[dtype].tensor_core:  # the two low-precision storage types
        o_ref = rounded_reference(q, k, v, causal=causal, scale=scale, dtype=dtype, **features)
        o_err = _max(diff)
        o_bound = LOW_PRECISION_FACTOR * _max(np.abs(o_ref - o64)) + LOW_PRECISION_ATOL
    else:
        norm64 = float(np.linalg.norm(o64))
        err_norm = float(np.sqrt(np.nansum(np.square(diff))))
        # An all-zero oracle (e.g. V = 0) has no scale to be relative to: compare absolutely.
        o_err = err_norm / norm64 if norm64 > 0 else err_norm
        o_bound = FP32_RTOL

    lse_err = _lse_error(lf, lse64)
    l_bound = lse_bound(q, k, scale=scale, causal=causal, **features)
    passed = (not has_nan) and o_err <= o_bound and lse_err <= l_bound
    return CheckOutcome(o_err, o_bound, lse_err, l_bound, has_nan, passed)


def _max(a: np.ndarray) -> float:
    # NaN is reported by has_nan; it must not hide the size of the other errors
    return float(np.nanmax(a)) if a.size and not np.isnan(a).all() else 0.0


def _lse_error(lse: F64, lse64: F64) -> float:
    """Max |LSE - LSE64| over rows that see a key; inf if a row's -inf status disagrees."""
    empty = np.isneginf(lse64)
    if (empty & ~np.isneginf(lse)).any():
        return float("inf")
    finite = ~empty
    if not finite.any():
        return 0.0
    got = lse[finite]
    if np.isinf(got).any():  # a kernel row that saw keys reported +-inf
        return float("inf")
    return _max(np.abs(got - lse64[finite]))
