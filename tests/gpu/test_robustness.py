"""Robustness on the GPU (issue 6): non-finite inputs, extreme scales, more than 2**31
elements in one tensor, and bitwise determinism.

Non-finite inputs. The kernel's NaN, +inf and -inf elements of O and LSE must sit exactly where
the float64 oracle's are (`oracle.reference`: IEEE propagation; a row whose every logit is
-inf, or that sees no key, gives O = 0 and LSE = -inf), and its finite elements obey the usual
rule (`rowref.judge`). Each case also asserts that the oracle's answer is the one the case is
about (a NaN Q row makes exactly that row NaN, ...), so a change of the oracle cannot quietly
turn a case into a different one.

Not covered, by design: a NaN or inf in V at a key that a row which sees other keys does NOT
see (causal mask). The row's probability for that key is 0, and 0 * inf = NaN inside the P*V
product, in the oracle's matmul and on the tensor cores alike; whether the kernel's product
includes the key depends on its tiling. Such a value poisons rows the mask hides it from (as
in FlashAttention). Rows that see no key at all must still come out as zeros.

Huge tensors are filled on the GPU by tiling one random block of P (prime) tokens, so an index
that wraps at 2**31 or 2**32 elements reads a different token than the right one; the oracle
for the checked rows is `rowref.row_reference` on the same block.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from flashgen.generator.compile import CompiledKernel
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.verify.checks import gpu_execute
from flashgen.verify.oracle import F64, max_abs_logit, reference, rounded_reference
from flashgen.verify.rowref import (
    Judgement,
    fill_periodic,
    judge,
    read_rows,
    rounded_row_reference,
    row_reference,
    score_slack,
    sum_slack,
    visible_keys,
)

pytestmark = pytest.mark.gpu

# One variant per family and storage type of interest, causal and not.
SPECS = (
    KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp32", causal=False),
    KernelSpec(family="simt", d=64, br=16, bc=64, dtype="bf16", causal=True),
    KernelSpec(family="mma", d=128, br=128, bc=64, dtype="bf16", causal=True, warps=4, stages=1),
    KernelSpec(family="mma", d=64, br=128, bc=64, dtype="fp16", causal=False, warps=4, stages=2),
)

B, H = 1, 2
TQ, TK = 150, 203  # ragged against every tile; Tq < Tk, so every causal row sees a key
HUGE_SCALE = 1e3  # times 1/sqrt(d)
TINY_SCALE = 1e-6
MODERATE_LOGIT = 30.0
TIE_LOGIT = 1e4


@dataclass(frozen=True)
class Problem:
    """Host inputs (storage dtype), the softmax scale, and which a-priori slack applies."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scale: float
    slack_lse: bool = False  # logits so large that fp32 cannot hold LSE to 1e-4 (score_slack)
    slack_o: bool = False  # ... nor P to the usual precision


@dataclass(frozen=True)
class Case:
    """A hostile input: how to build it, and what the oracle must say about it."""

    name: str
    build: Callable[[KernelSpec], Problem]
    expect: Callable[[KernelSpec, Problem, F64, F64], None]


# ---- building inputs ---------------------------------------------------------------------
def _store(spec: KernelSpec) -> np.dtype[Any]:
    return np.dtype(spec.dtype_info.numpy)


def _normal(shape: tuple[int, ...], seed: int) -> F64:
    return np.random.default_rng(seed).standard_normal(shape)


def _qkv64(spec: KernelSpec, seed: int, tq: int = TQ, tk: int = TK) -> tuple[F64, F64, F64]:
    d = spec.d
    return (
        _normal((B, H, tq, d), seed),
        _normal((B, H, tk, d), seed + 1),
        _normal((B, H, tk, d), seed + 2),
    )


def _problem(
    spec: KernelSpec, q: F64, k: F64, v: F64, scale: float | None = None, **kw: bool
) -> Problem:
    st = _store(spec)
    scale = spec.d**-0.5 if scale is None else scale
    return Problem(q.astype(st), k.astype(st), v.astype(st), scale, **kw)


def _positive(x: F64) -> F64:
    """Strictly positive entries (so q . (-inf row) is -inf, never inf - inf)."""
    return np.abs(x) + 0.25


def _gain_for(q: F64, k: F64, scale: float, logit: float) -> float:
    """The factor for q and k that makes the largest |scale * q.k| equal `logit`."""
    return math.sqrt(logit / max_abs_logit(q, k, scale))


def _sees(spec: KernelSpec, tq: int, tk: int, key: int) -> np.ndarray:
    """(tq,) bool: which query rows see key `key`."""
    return visible_keys(np.arange(tq), tq=tq, tk=tk, causal=spec.causal) > key


# ---- what the oracle must say ----------------------------------------------------------------
def _nan_rows_exactly(o64: F64, lse64: F64, rows: np.ndarray) -> None:
    """Rows `rows` ((B, H, Tq) bool) are NaN in O and LSE; every other row is finite."""
    assert np.isnan(o64[rows]).all() and np.isnan(lse64[rows]).all()
    assert np.isfinite(o64[~rows]).all() and np.isfinite(lse64[~rows]).all()


def _all_finite(spec: KernelSpec, prob: Problem, o64: F64, lse64: F64) -> None:
    assert np.isfinite(o64).all() and np.isfinite(lse64).all()


# ---- the cases -------------------------------------------------------------------------------
def _nan_q_row(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 1)
    q[0, 1, 37, 5] = np.nan
    return _problem(spec, q, k, v)


def _expect_nan_q_row(spec: KernelSpec, prob: Problem, o64: F64, lse64: F64) -> None:
    rows = np.zeros((B, H, TQ), bool)
    rows[0, 1, 37] = True
    _nan_rows_exactly(o64, lse64, rows)


NAN_KEY = 100


def _nan_k_row(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 2)
    k[0, 0, NAN_KEY, 3] = np.nan
    return _problem(spec, q, k, v)


def _expect_nan_k_row(spec: KernelSpec, prob: Problem, o64: F64, lse64: F64) -> None:
    rows = np.zeros((B, H, TQ), bool)
    rows[0, 0] = _sees(spec, TQ, TK, NAN_KEY)  # causal: only the rows that see the key
    _nan_rows_exactly(o64, lse64, rows)


# Tq > Tk: under the causal mask the first Tq - Tk rows see no key.
TQ2, TK2 = 203, 150
EMPTY_NAN_ROW, SEEN_NAN_ROW = 10, 120


def _nan_q_rows_tq_gt_tk(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 3, tq=TQ2, tk=TK2)
    q[0, 0, EMPTY_NAN_ROW, :] = np.nan
    q[0, 1, SEEN_NAN_ROW, 0] = np.nan
    return _problem(spec, q, k, v)


def _expect_nan_q_rows_tq_gt_tk(spec: KernelSpec, prob: Problem, o64: F64, lse64: F64) -> None:
    n_vis = visible_keys(np.arange(TQ2), tq=TQ2, tk=TK2, causal=spec.causal)
    empty = np.broadcast_to(n_vis == 0, (B, H, TQ2))
    nan = np.zeros((B, H, TQ2), bool)
    nan[0, 1, SEEN_NAN_ROW] = True
    nan[0, 0, EMPTY_NAN_ROW] = not spec.causal  # causal: that row sees no key -> 0, -inf
    assert np.isnan(o64[nan]).all() and np.isnan(lse64[nan]).all()
    assert (o64[empty] == 0).all() and np.isneginf(lse64[empty]).all()
    rest = ~nan & ~empty
    assert np.isfinite(o64[rest]).all() and np.isfinite(lse64[rest]).all()


def _inf_in_v(spec: KernelSpec, tq: int = TQ, tk: int = TK, seed: int = 4) -> Problem:
    q, k, v = _qkv64(spec, seed, tq=tq, tk=tk)
    # Key 0 is seen by every row that sees any key. Its logit is 0, so its probability is far
    # from underflowing even in fp16, and inf * p stays inf.
    k[0, :, 0, :] = 0.0
    v[0, 1, 0, 5] = np.inf
    v[0, 0, 0, 9] = -np.inf
    v[0, 0, 0, 11] = np.nan
    return _problem(spec, q, k, v)


def _expect_inf_in_v(spec: KernelSpec, prob: Problem, o64: F64, lse64: F64) -> None:
    tq = prob.q.shape[2]
    seen = visible_keys(np.arange(tq), tq=tq, tk=prob.k.shape[2], causal=spec.causal) > 0
    assert np.isposinf(o64[0, 1, seen, 5]).all()
    assert np.isneginf(o64[0, 0, seen, 9]).all()
    assert np.isnan(o64[0, 0, seen, 11]).all()
    assert (~np.isfinite(o64)).sum() == 3 * seen.sum()  # nothing else is touched
    assert (o64[:, :, ~seen] == 0).all()  # rows that see no key: zeros, whatever V holds
    assert np.isfinite(lse64[:, :, seen]).all()


def _inf_in_v_tq_gt_tk(spec: KernelSpec) -> Problem:
    return _inf_in_v(spec, tq=TQ2, tk=TK2, seed=5)


MINUS_INF_KEYS = [0, 77, TK - 1]


def _minus_inf_keys_positive_q(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 6)
    k[:, :, MINUS_INF_KEYS, :] = -np.inf
    return _problem(spec, _positive(q), k, v)


def _expect_zero_weight(spec: KernelSpec, prob: Problem, o64: F64, lse64: F64) -> None:
    _all_finite(spec, prob, o64, lse64)
    # zero weight: the values of those keys do not matter at all
    v = prob.v.copy()
    v[:, :, MINUS_INF_KEYS, :] = 1000.0
    with np.errstate(all="ignore"):
        o_other, _ = reference(prob.q, prob.k, v, causal=spec.causal, scale=prob.scale)
    np.testing.assert_allclose(o_other, o64, rtol=0, atol=1e-12)


def _all_keys_minus_inf_positive_q(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 7)
    k[0, 0] = -np.inf
    return _problem(spec, _positive(q), k, v)


def _expect_all_keys_minus_inf(spec: KernelSpec, prob: Problem, o64: F64, lse64: F64) -> None:
    assert (o64[0, 0] == 0).all() and np.isneginf(lse64[0, 0]).all()
    assert np.isfinite(o64[0, 1]).all() and np.isfinite(lse64[0, 1]).all()


INF_KEY = 60


def _minus_inf_key_mixed_q(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 8)
    k[0, 1, INF_KEY, :] = -np.inf  # q has both signs: q . k = inf - inf = NaN
    return _problem(spec, q, k, v)


def _plus_inf_key_positive_q(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 9)
    k[0, 1, INF_KEY, :] = np.inf  # a +inf logit: exp(inf - inf) = NaN in IEEE arithmetic
    return _problem(spec, _positive(q), k, v)


def _expect_rows_seeing_inf_key_nan(spec: KernelSpec, prob: Problem, o64: F64, lse64: F64) -> None:
    rows = np.zeros((B, H, TQ), bool)
    rows[0, 1] = _sees(spec, TQ, TK, INF_KEY)
    _nan_rows_exactly(o64, lse64, rows)


def _huge_scale_moderate_logits(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 10)
    scale = HUGE_SCALE * spec.d**-0.5
    g = _gain_for(q, k, scale, MODERATE_LOGIT)  # tiny inputs, a huge scale, logits up to 30
    return _problem(spec, q * g, k * g, v, scale)


def _huge_scale_normal_inputs(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 11)  # logits in the thousands: softmax is nearly one-hot
    return _problem(spec, q, k, v, HUGE_SCALE * spec.d**-0.5, slack_lse=True, slack_o=True)


def _tiny_scale(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 12)  # logits ~1e-6: softmax is uniform
    return _problem(spec, q, k, v, TINY_SCALE)


def _tiny_scale_large_inputs(spec: KernelSpec) -> Problem:
    q, k, v = _qkv64(spec, 13)
    g = _gain_for(q, k, TINY_SCALE, MODERATE_LOGIT)  # entries in the thousands (fp16 holds them)
    return _problem(spec, q * g, k * g, v, TINY_SCALE)


def _logits_1e4_ties(spec: KernelSpec) -> Problem:
    """Logits of exactly +-1e4 (as the storage dtype rounds it): q_i = a * e_pi(i), k = +-1.

    Rows with even pi(i) find their +1e4 keys only in the second half of the keys, odd ones
    only in the first half, so the running max jumps by 2e4 in one visiting order or the
    other (simt visits keys first to last, mma last to first): alpha = exp2(-2.9e4) = 0.
    """
    rng = np.random.default_rng(14)
    d = spec.d
    q = np.zeros((B, H, TQ, d))
    pi = rng.integers(0, d, (B, H, TQ))
    np.put_along_axis(q, pi[..., None], TIE_LOGIT, axis=-1)
    k = rng.choice([-1.0, 1.0], size=(B, H, TK, d))
    half = TK // 2
    k[:, :, :half, 0::2] = -1.0
    k[:, :, half:, 1::2] = -1.0
    v = _normal((B, H, TK, d), 15)
    return _problem(spec, q, k, v, 1.0, slack_lse=True)


def _expect_logits_1e4(spec: KernelSpec, prob: Problem, o64: F64, lse64: F64) -> None:
    _all_finite(spec, prob, o64, lse64)
    assert np.abs(lse64).max() > 0.99 * TIE_LOGIT  # the logits really are that large


CASES = (
    Case("nan-in-one-q-row", _nan_q_row, _expect_nan_q_row),
    Case("nan-in-one-k-row", _nan_k_row, _expect_nan_k_row),
    Case("nan-q-rows-tq-gt-tk", _nan_q_rows_tq_gt_tk, _expect_nan_q_rows_tq_gt_tk),
    Case("inf-and-nan-in-v", _inf_in_v, _expect_inf_in_v),
    Case("inf-and-nan-in-v-tq-gt-tk", _inf_in_v_tq_gt_tk, _expect_inf_in_v),
    Case("minus-inf-k-rows-positive-q", _minus_inf_keys_positive_q, _expect_zero_weight),
    Case("all-k-minus-inf-positive-q", _all_keys_minus_inf_positive_q, _expect_all_keys_minus_inf),
    Case("minus-inf-k-row-mixed-q", _minus_inf_key_mixed_q, _expect_rows_seeing_inf_key_nan),
    Case("plus-inf-k-row-positive-q", _plus_inf_key_positive_q, _expect_rows_seeing_inf_key_nan),
    Case("huge-scale-moderate-logits", _huge_scale_moderate_logits, _all_finite),
    Case("huge-scale-normal-inputs", _huge_scale_normal_inputs, _all_finite),
    Case("tiny-scale", _tiny_scale, _all_finite),
    Case("tiny-scale-large-inputs", _tiny_scale_large_inputs, _all_finite),
    Case("logits-1e4-ties", _logits_1e4_ties, _expect_logits_1e4),
)


def evaluate(
    spec: KernelSpec, case: Case, prob: Problem, o: np.ndarray, lse: np.ndarray
) -> Judgement:
    """The oracle on `prob`, the case's premise about it, and the rule applied to (o, lse)."""
    with np.errstate(all="ignore"):
        o64, lse64 = reference(prob.q, prob.k, prob.v, causal=spec.causal, scale=prob.scale)
        o_ref = (
            rounded_reference(
                prob.q, prob.k, prob.v, causal=spec.causal, scale=prob.scale, dtype=spec.dtype
            )
            if spec.dtype_info.tensor_core
            else None
        )
    case.expect(spec, prob, o64, lse64)
    o_slack = lse_slack = 0.0
    if prob.slack_lse or prob.slack_o:
        delta = score_slack(prob.q, prob.k, prob.scale)
        lse_slack = delta if prob.slack_lse else 0.0
        if prob.slack_o:
            # a score error delta moves P by a factor exp(+-delta): O by up to 2 delta max|V|
            vmax = float(np.abs(prob.v.astype(np.float64)).max())
            fin = o64[np.isfinite(o64)]
            if spec.dtype_info.tensor_core:
                o_slack = 2 * delta * vmax
            else:  # relative, like the fp32 rule itself
                o_slack = 2 * delta * vmax * math.sqrt(fin.size) / float(np.linalg.norm(fin))
    return judge(o, lse, o64, lse64, o_ref, dtype=spec.dtype, o_slack=o_slack, lse_slack=lse_slack)


def _load(spec: KernelSpec, compiled: dict[KernelSpec, CompiledKernel | Exception]) -> None:
    built = compiled[spec]
    if isinstance(built, Exception):
        pytest.fail(f"{spec.name} did not compile: {built}", pytrace=False)
    runtime.get_function(spec, built)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_non_finite_and_extreme_inputs_follow_the_float64_oracle(
    spec: KernelSpec, case: Case, compiled: dict[KernelSpec, CompiledKernel | Exception]
) -> None:
    _load(spec, compiled)
    prob = case.build(spec)
    o, lse = gpu_execute(spec, prob.q, prob.k, prob.v, prob.scale)
    verdict = evaluate(spec, case, prob, o, lse)
    assert verdict.passed, f"{spec.name} {case.name}: {verdict.describe()}"


# ---- determinism ---------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_ten_runs_on_the_same_inputs_are_bitwise_equal(
    spec: KernelSpec, compiled: dict[KernelSpec, CompiledKernel | Exception]
) -> None:
    _load(spec, compiled)
    rng = np.random.default_rng(21)
    shape_q, shape_kv = (2, 3, 300, spec.d), (2, 3, 517, spec.d)
    st = _store(spec)
    q, k, v = (rng.standard_normal(s).astype(st) for s in (shape_q, shape_kv, shape_kv))
    dq, dk, dv = (runtime.to_device(x) for x in (q, k, v))
    first: tuple[bytes, bytes] | None = None
    for run in range(10):
        o = runtime.empty(shape_q, spec.dtype)
        lse = runtime.empty(shape_q[:3], np.float32)
        runtime.launch(spec, dq, dk, dv, o, lse, poison_outputs=True)
        ho, hl = runtime.to_host(o), runtime.to_host(lse)
        assert np.isfinite(ho.astype(np.float64)).all() and np.isfinite(hl).all()
        got = (ho.tobytes(), hl.tobytes())
        if first is None:
            first = got
        else:
            assert got[0] == first[0], f"run {run}: O differs from run 0"
            assert got[1] == first[1], f"run {run}: LSE differs from run 0"


# ---- more than 2**31 elements in one tensor ------------------------------------------------
PERIOD = 65521  # tokens in the tiled random block: prime, so no wrap of 2**k elements aliases
BF16_D128 = dict(d=128, dtype="bf16")


def check_rows_of_head(
    spec: KernelSpec,
    blocks: tuple[np.ndarray, np.ndarray, np.ndarray],
    o: Any,
    lse: Any,
    *,
    bh: int,
    t: int,
    rows: np.ndarray,
) -> Judgement:
    """Judge rows `rows` (consecutive) of head `bh` (= b * H + h) of a tiled problem."""
    qb, kb, vb = blocks
    base = bh * t  # the head's first token in the tiled buffers
    keys = (base + np.arange(min(PERIOD, t))) % PERIOD  # one period of the head's keys
    q_rows = qb[(base + rows) % PERIOD]
    scale = spec.d**-0.5
    k_keys, v_keys = kb[keys], vb[keys]
    o64, lse64 = row_reference(
        q_rows, rows, k_keys, v_keys, tq=t, tk=t, causal=spec.causal, scale=scale
    )
    o_ref = rounded_row_reference(
        q_rows, rows, k_keys, v_keys, tq=t, tk=t, causal=spec.causal, scale=scale,
        dtype=spec.dtype,
    )  # fmt: skip
    got_o = read_rows(o, base + int(rows[0]), rows.size, spec.d)
    got_lse = read_rows(lse, base + int(rows[0]), rows.size, 1)[:, 0]
    slack = sum_slack(math.ceil(t / spec.bc))  # fp32 running sums over every key tile
    return judge(
        got_o, got_lse, o64, lse64, o_ref, dtype=spec.dtype,
        o_slack=2 * slack * float(np.abs(o64).max()), lse_slack=slack,
    )  # fmt: skip


HUGE = (
    # 2 * 32771 heads of 257 tokens: head base offsets pass 2**31 elements in batch 1
    pytest.param(
        KernelSpec(family="simt", br=32, bc=32, causal=False, **BF16_D128), 2, 32771, 257,
        id="simt-B2-H32771-T257",
    ),
    pytest.param(
        KernelSpec(family="mma", br=128, bc=64, causal=False, warps=4, stages=1, **BF16_D128),
        2, 32771, 257, id="mma-B2-H32771-T257",
    ),
    # the brief's long-sequence shape: 64 heads of 262147 tokens, 2**31 + 24576 elements
    pytest.param(
        KernelSpec(family="mma", br=128, bc=64, causal=True, warps=4, stages=1, **BF16_D128),
        1, 64, 262147, id="mma-causal-B1-H64-T262147",
    ),
)  # fmt: skip


@pytest.mark.parametrize(("spec", "b", "h", "t"), HUGE)
def test_more_than_2_31_elements_in_one_tensor_give_the_right_last_rows(
    spec: KernelSpec,
    b: int,
    h: int,
    t: int,
    compiled: dict[KernelSpec, CompiledKernel | Exception],
) -> None:
    d = spec.d
    elems = b * h * t * d
    assert elems > 2**31, elems
    need = 4 * elems * 2 + b * h * t * 4
    free, _ = runtime.gpu().drv.mem_get_info()
    if free < need + (1 << 30):
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory; {free / 2**30:.1f} free")
    _load(spec, compiled)
    # the device arrays live only inside run_huge: they are freed before anything is asserted
    for where, verdict in run_huge(spec, b, h, t):
        assert verdict.passed, f"{spec.name} {where}: {verdict.describe()}"


def run_huge(spec: KernelSpec, b: int, h: int, t: int) -> list[tuple[str, Judgement]]:
    """One launch on (b, h, t, d) tensors tiled from random blocks; judge rows of a few heads."""
    d = spec.d
    rng = np.random.default_rng(2**31)
    st = _store(spec)
    blocks = (
        rng.standard_normal((PERIOD, d)).astype(st),
        rng.standard_normal((PERIOD, d)).astype(st),
        rng.standard_normal((PERIOD, d)).astype(st),
    )
    q, k, v, o = (runtime.empty((b, h, t, d), spec.dtype) for _ in range(4))
    lse = runtime.empty((b, h, t), np.float32)
    for x, block in zip((q, k, v), blocks, strict=True):
        fill_periodic(x, block)
    runtime.launch(spec, q, k, v, o, lse, poison_outputs=True)
    last = b * h - 1
    picks = [
        (last, np.arange(t - 6, t)),  # the very last rows: offsets past 2**31 elements
        (last, np.arange(0, 3)),  # the first rows of the last head
        (0, np.arange(t - 3, t)),
        (last // 2 + 1, np.arange(t // 2, t // 2 + 4)),
    ]
    out = []
    for bh, rows in picks:
        verdict = check_rows_of_head(spec, blocks, o, lse, bh=bh, t=t, rows=rows)
        out.append((f"head {bh} (b={bh // h}, h={bh % h}) rows {rows[0]}..{rows[-1]}", verdict))
    del q, k, v, o, lse
    gc.collect()
    return out


# ---- window edges past 2**31 (a broadcast K/V of almost 2**31 keys) ------------------------------
WINDOWED = tuple(
    KernelSpec(family=f, d=64, dtype="bf16", causal=False, features=("window",))
    for f in ("simt", "mma")
)  # wgmma loads K/V with TMA, which refuses a token stride of 0


@pytest.mark.parametrize("tq", [40, 2048], ids=["tq40", "tq2048"])
@pytest.mark.parametrize("spec", WINDOWED, ids=lambda s: s.family)
def test_window_edges_past_2_31_keep_every_row(
    spec: KernelSpec, tq: int, compiled: dict[KernelSpec, CompiledKernel | Exception]
) -> None:
    """Tk = 2**31 - 1024 keys, all one vector (K and V of token stride 0, which validation
    accepts), window (10, 1500): the kernels computed p + window_right in int, which passed
    2**31 for the last rows, and 32 rows came back with O = 0 and LSE = -inf. Every row sees
    n identical keys, so its O is v0 and its LSE the score plus ln(n), exactly. Tq = 40: the
    right side reaches every key (passed as unbounded); Tq = 2048: it does not, and the last
    ~480 rows' edge p + 1500 passes 2**31 in the kernel."""
    from pycuda import gpuarray

    from flashgen.generator.features import FeatureArgs
    from flashgen.runtime.validate import MAX_LENGTH

    _load(spec, compiled)
    d, tk, left, right = spec.d, MAX_LENGTH, 10, 1500
    st = _store(spec)
    rng = np.random.default_rng(tq)
    q = rng.standard_normal((1, 1, tq, d)).astype(st)
    k0, v0 = (rng.standard_normal((1, 1, 1, d)).astype(st) for _ in "kv")
    rows_kv = [runtime.to_device(x) for x in (k0, v0)]
    k, v = (
        gpuarray.GPUArray((1, 1, tk, d), st, gpudata=x.gpudata, strides=(0, 0, 0, st.itemsize))
        for x in rows_kv
    )
    dq = runtime.to_device(q)
    o = runtime.empty((1, 1, tq, d), spec.dtype)
    lse = runtime.empty((1, 1, tq), np.float32)
    with pytest.warns(Warning):  # AccuracyWarning: Tk is past the rule's length, by design
        runtime.launch(spec, dq, k, v, o, lse, features=FeatureArgs(window=(left, right)),
                       poison_outputs=True)  # fmt: skip
    got_o, got_lse = runtime.to_host(o)[0, 0].astype(np.float64), runtime.to_host(lse)[0, 0]
    i = np.arange(tq)
    p = i + tk - tq  # each row's key position
    n = np.minimum(tk - 1, p + right) - np.maximum(0, p - left) + 1
    scale = d**-0.5
    s = (q[0, 0].astype(np.float64) @ k0[0, 0, 0].astype(np.float64)) * scale
    want_lse = s + np.log(n)
    empty = np.flatnonzero(~np.isfinite(got_lse))
    assert empty.size == 0, f"{empty.size} rows with LSE -inf/NaN, from row {empty[:1]}"
    v64 = v0[0, 0, 0].astype(np.float64)
    o_err = np.abs(got_o - v64).max()
    assert o_err <= 2**-7 * np.abs(v64).max(), f"O off v0 by {o_err:.3g}"
    lse_err = np.abs(got_lse - want_lse).max()
    slack = score_slack(q, k0, scale) + sum_slack(int(n.max()))
    assert lse_err <= 1e-4 + slack + 1e-5 * np.abs(want_lse).max(), f"LSE off by {lse_err:.3g}"
