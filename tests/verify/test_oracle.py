"""The NumPy oracle against a direct per-row formula, and the correctness rule's edges."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashgen.verify import oracle
from flashgen.verify.oracle import check_outputs, reference, rounded_reference


def direct(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float):
    """Attention one row at a time with math.fsum: the definition, written out."""
    b, h, tq, d = q.shape
    tk = k.shape[2]
    o = np.zeros((b, h, tq, d))
    lse = np.full((b, h, tq), -math.inf)
    for bi in range(b):
        for hi in range(h):
            for i in range(tq):
                keys = [j for j in range(tk) if not causal or j <= i + tk - tq]
                if not keys:
                    continue
                s = [scale * math.fsum(q[bi, hi, i] * k[bi, hi, j]) for j in keys]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                z = math.fsum(w)
                for c in range(d):
                    o[bi, hi, i, c] = (
                        math.fsum(wj * v[bi, hi, j, c] for wj, j in zip(w, keys, strict=True)) / z
                    )
                lse[bi, hi, i] = m + math.log(z)
    return o, lse


def rand(shape: tuple[int, ...], seed: int, gain: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape) * gain


@given(
    b=st.integers(1, 2),
    h=st.integers(1, 2),
    tq=st.integers(1, 9),
    tk=st.integers(1, 9),
    d=st.integers(1, 5),
    causal=st.booleans(),
    scale=st.floats(0.05, 3.0),
    seed=st.integers(0, 2**31),
)
def test_reference_matches_the_per_row_formula(b, h, tq, tk, d, causal, scale, seed):
    q, k, v = (
        rand((b, h, tq, d), seed, 3.0),
        rand((b, h, tk, d), seed + 1, 3.0),
        rand((b, h, tk, d), seed + 2),
    )
    o, lse = reference(q, k, v, causal=causal, scale=scale)
    o_want, lse_want = direct(q, k, v, causal, scale)
    np.testing.assert_allclose(o, o_want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, lse_want, rtol=1e-12, atol=1e-12)


def test_causal_rows_that_see_no_key_give_zeros_and_minus_inf():
    q, k, v = rand((1, 2, 5, 4), 0), rand((1, 2, 2, 4), 1), rand((1, 2, 2, 4), 2)
    o, lse = reference(q, k, v, causal=True, scale=0.5)
    # Tq=5, Tk=2: row i sees keys j <= i - 3, so rows 0..2 see none
    assert np.all(o[:, :, :3] == 0.0)
    assert np.all(np.isneginf(lse[:, :, :3]))
    assert np.all(np.isfinite(lse[:, :, 3:]))
    assert np.all(np.abs(o[:, :, 3:]).sum(axis=-1) > 0)


def test_causal_is_aligned_to_the_bottom_right_when_tq_lt_tk():
    # q = 0 makes every visible key weigh the same; v = identity reveals which keys were seen
    tq, tk = 2, 5
    q = np.zeros((1, 1, tq, tk))
    k = rand((1, 1, tk, tk), 3)
    v = np.eye(tk)[None, None]
    o, lse = reference(q, k, v, causal=True, scale=1.0)
    np.testing.assert_allclose(o[0, 0, 0], [0.25, 0.25, 0.25, 0.25, 0.0])  # keys 0..3
    np.testing.assert_allclose(o[0, 0, 1], [0.2] * 5)  # the last row sees every key
    np.testing.assert_allclose(lse[0, 0], [math.log(4), math.log(5)])


def test_head_chunking_does_not_change_the_result(monkeypatch):
    q, k, v = rand((2, 3, 17, 8), 4), rand((2, 3, 11, 8), 5), rand((2, 3, 11, 8), 6)
    whole = reference(q, k, v, causal=True, scale=0.3)
    monkeypatch.setattr(oracle, "CHUNK_SCORES", 17 * 11 * 2)  # two heads per chunk
    chunked = reference(q, k, v, causal=True, scale=0.3)
    np.testing.assert_array_equal(whole[0], chunked[0])
    np.testing.assert_array_equal(whole[1], chunked[1])


@pytest.mark.parametrize("dtype,np_type", [("bf16", ml_dtypes.bfloat16), ("fp16", np.float16)])
def test_rounded_reference_differs_from_o64_by_a_small_nonzero_amount(dtype, np_type):
    q, k, v = (rand((2, 2, 64, 32), s).astype(np_type) for s in (7, 8, 9))
    o64, _ = reference(q, k, v, causal=False, scale=0.2)
    o_ref = rounded_reference(q, k, v, causal=False, scale=0.2, dtype=dtype)
    err = np.abs(o_ref - o64).max()
    assert 0 < err < 0.02
    # it holds storage-dtype values exactly
    np.testing.assert_array_equal(o_ref, o_ref.astype(np_type).astype(np.float64))


def test_rounded_reference_keeps_rows_that_see_no_key_at_zero():
    q, k, v = (
        rand((1, 1, t, 16), s).astype(ml_dtypes.bfloat16) for s, t in ((1, 6), (2, 2), (3, 2))
    )
    o_ref = rounded_reference(q, k, v, causal=True, scale=0.25, dtype="bf16")
    assert np.all(o_ref[0, 0, :4] == 0.0) and np.all(np.isfinite(o_ref))


def inputs(dtype: str, causal_gap: bool = False, seed: int = 0):
    np_type = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}[dtype]
    tq, tk = (40, 25) if causal_gap else (33, 47)
    q = rand((2, 2, tq, 16), seed, 2.0).astype(np_type)
    k = rand((2, 2, tk, 16), seed + 1, 2.0).astype(np_type)
    v = rand((2, 2, tk, 16), seed + 2).astype(np_type)
    return q, k, v


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_check_outputs_accepts_the_rounded_reference_itself(dtype):
    q, k, v = inputs(dtype, causal_gap=True)
    o_ref = rounded_reference(q, k, v, causal=True, scale=0.3, dtype=dtype)
    _, lse64 = reference(q, k, v, causal=True, scale=0.3)
    out = check_outputs(
        o_ref, lse64.astype(np.float32), q, k, v, causal=True, scale=0.3, dtype=dtype
    )
    assert out.passed and not out.has_nan
    assert out.o_err <= out.o_bound and out.ratio <= 1.0


def test_check_outputs_accepts_the_fp32_rounded_oracle():
    q, k, v = inputs("fp32")
    o64, lse64 = reference(q, k, v, causal=False, scale=0.3)
    out = check_outputs(
        o64.astype(np.float32), lse64.astype(np.float32), q, k, v,
        causal=False, scale=0.3, dtype="fp32",
    )  # fmt: skip
    assert out.passed and out.o_err < 1e-7 and out.o_bound == oracle.FP32_RTOL


@pytest.mark.parametrize("where", ["o", "lse"])
def test_check_outputs_rejects_any_nan(where):
    q, k, v = inputs("bf16")
    o64, lse64 = reference(q, k, v, causal=False, scale=0.3)
    o, lse = o64.copy(), lse64.copy()
    (o if where == "o" else lse)[1, 1, 5, ...] = np.nan
    out = check_outputs(o, lse, q, k, v, causal=False, scale=0.3, dtype="bf16")
    assert out.has_nan and not out.passed and out.ratio == math.inf


def test_low_precision_bound_is_twice_the_reference_error_plus_1e_5():
    q, k, v = inputs("bf16")
    o64, lse64 = reference(q, k, v, causal=False, scale=0.3)
    o_ref = rounded_reference(q, k, v, causal=False, scale=0.3, dtype="bf16")
    bound = 2 * np.abs(o_ref - o64).max() + 1e-5
    for factor, ok in ((0.99, True), (1.01, False)):
        o = o64.copy()
        o[0, 1, 2, 3] += factor * bound
        out = check_outputs(o, lse64, q, k, v, causal=False, scale=0.3, dtype="bf16")
        assert out.o_bound == pytest.approx(bound)
        assert out.passed is ok


def test_fp32_bound_is_relative_to_the_oracle_norm():
    q, k, v = inputs("fp32")
    o64, lse64 = reference(q, k, v, causal=False, scale=0.3)
    for rel, ok in ((0.9e-5, True), (1.1e-5, False)):
        out = check_outputs(o64 * (1 + rel), lse64, q, k, v, causal=False, scale=0.3, dtype="fp32")
        assert out.o_err == pytest.approx(rel)
        assert out.passed is ok


def test_fp32_with_an_all_zero_oracle_compares_absolutely():
    q, k, _ = inputs("fp32")
    v = np.zeros_like(k)
    o64, lse64 = reference(q, k, v, causal=False, scale=0.3)
    assert np.linalg.norm(o64) == 0
    small, large = o64.copy(), o64.copy()
    small[0, 0, 0, 0], large[0, 0, 0, 0] = 5e-6, 1e-3
    assert check_outputs(small, lse64, q, k, v, causal=False, scale=0.3, dtype="fp32").passed
    assert not check_outputs(large, lse64, q, k, v, causal=False, scale=0.3, dtype="fp32").passed


def test_lse_bound_is_the_a_priori_fp32_error_and_is_enforced():
    q, k, v = inputs("fp16")
    o64, lse64 = reference(q, k, v, causal=False, scale=0.3)
    bound = oracle.lse_bound(q, k, scale=0.3)
    # ordinary logits: tighter than the old fixed 1e-4, never below the floor
    assert oracle.LSE_FLOOR < bound < 1e-4
    for delta, ok in ((0.9 * bound, True), (1.1 * bound, False)):
        lse = lse64.copy()
        lse[1, 0, 3] += delta
        out = check_outputs(o64, lse, q, k, v, causal=False, scale=0.3, dtype="fp16")
        assert out.lse_err == pytest.approx(delta) and out.passed is ok
        assert out.lse_bound == bound


def test_lse_bound_grows_with_the_scores_magnitude_and_the_head_dim():
    q, k, _ = inputs("fp32")
    base = oracle.lse_bound(q, k, scale=0.3)
    assert oracle.lse_bound(q * 8, k * 8, scale=0.3) > 10 * base  # ulp(S) grows with S
    wide = np.concatenate([q] * 4, axis=-1), np.concatenate([k] * 4, axis=-1)
    assert oracle.lse_bound(*wide, scale=0.3) > 4 * base  # 4x the groups, each 4x S


# Issue 9: six fp16 d=256 mma variants measured LSE errors up to 1.23e-4 (1.08e-4 the least) on
# this case under the `thorough` profile, against the old fixed 1e-4; so did fp16 d=128.
THOROUGH_FAILURE = {
    "b": 1,
    "h": 1,
    "tq": 1,
    "tk": 1,
    "scale": 0.5,
    "logit_max": 60.0,
    "seed": 11242,
}
MEASURED_LSE_ERR = 1.23e-4


def _shipped_spec(d, dtype):
    """Any shipped variant of this head dim and dtype (make_inputs reads only d and dtype)."""
    from flashgen.generator.space import shipped

    return next(s for s in shipped() if s.d == d and s.dtype == dtype)


@pytest.mark.parametrize("d", [128, 256])
def test_the_thorough_failure_is_within_the_derived_lse_bound(d):
    from flashgen.verify.checks import Case, make_inputs

    q, k, _ = make_inputs(_shipped_spec(d, "fp16"), Case(**THOROUGH_FAILURE))
    bound = oracle.lse_bound(q, k, scale=0.5)
    # One key: LSE is the score itself, a sum of d products that Q and K's gain (up to 64)
    # makes large and cancelling (sum |q_x k_x| is ~10-200x the logit of 60), so one fp32
    # ulp of that magnitude is ~1e-4..1e-3: the old 1e-4 asked for less than one ulp.
    assert bound > 4 * MEASURED_LSE_ERR  # room for worse hardware than the H200's
    assert bound > oracle.LSE_ATOL


# ---- injected kernel bugs: a kernel with any of them must fail the check ----------------------
def _attend(q, k, v, *, causal, scale, bug=None):
    """Float64 attention with one injected bug, rounded as a kernel returns it (O to the
    storage dtype, LSE to fp32); bug=None is a correct kernel."""
    qf, kf, vf = (np.asarray(x, np.float64) for x in (q, k, v))
    if bug == "swapped_v_rows":
        vf = vf.copy()
        vf[:, :, [0, 1]] = vf[:, :, [1, 0]]
    s = np.einsum("bhid,bhjd->bhij", qf, kf) * (scale * 1.0001 if bug == "scale" else scale)
    tq, tk = q.shape[2], k.shape[2]
    if bug == "diagonal_plus_1":
        s[:, :, np.arange(min(tq, tk)), np.arange(min(tq, tk))] += 1.0
    if bug == "diagonal_minus_1":
        s[:, :, np.arange(min(tq, tk)), np.arange(min(tq, tk))] -= 1.0
    visible = oracle.causal_mask(tq, tk) if causal else np.ones((tq, tk), bool)
    if bug == "dropped_key":
        visible = visible.copy()
        visible[:, tk // 2] = False
    s = np.where(visible, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    o = (p @ vf) / p.sum(-1, keepdims=True)
    lse = (m + np.log(p.sum(-1, keepdims=True)))[..., 0]
    return o.astype(q.dtype), lse.astype(np.float32)


BUGS = ["diagonal_plus_1", "diagonal_minus_1", "dropped_key", "scale", "swapped_v_rows"]
# (dtype, d, logit_max or None for standard normal Q, K, causal): the suite's kinds of problem
BUG_PROBLEMS = [
    ("fp16", 64, None, False),
    ("bf16", 128, None, True),
    ("fp32", 64, None, False),
    ("fp16", 256, 60.0, False),
    ("bf16", 64, 60.0, True),
    ("fp16", 128, 20.0, True),
]


def _bug_inputs(dtype, d, logit_max, seed=5):
    from flashgen.verify.checks import Case, make_inputs

    return make_inputs(_shipped_spec(d, dtype), Case(1, 2, 37, 67, None, logit_max, seed))


@pytest.mark.parametrize(("dtype", "d", "logit_max", "causal"), BUG_PROBLEMS)
def test_a_correct_kernel_passes_the_bug_problems(dtype, d, logit_max, causal):
    q, k, v = _bug_inputs(dtype, d, logit_max)
    scale = d**-0.5
    o, lse = _attend(q, k, v, causal=causal, scale=scale)
    out = check_outputs(o, lse, q, k, v, causal=causal, scale=scale, dtype=dtype)
    assert out.passed, out


@pytest.mark.parametrize("bug", BUGS)
@pytest.mark.parametrize(("dtype", "d", "logit_max", "causal"), BUG_PROBLEMS)
def test_injected_kernel_bugs_fail_the_check(bug, dtype, d, logit_max, causal):
    q, k, v = _bug_inputs(dtype, d, logit_max)
    scale = d**-0.5
    o, lse = _attend(q, k, v, causal=causal, scale=scale, bug=bug)
    out = check_outputs(o, lse, q, k, v, causal=causal, scale=scale, dtype=dtype)
    assert not out.passed, (bug, out)


def test_lse_minus_inf_must_match_exactly():
    q, k, v = inputs("bf16", causal_gap=True)  # Tq=40 > Tk=25: rows 0..14 see no key
    o64, lse64 = reference(q, k, v, causal=True, scale=0.3)
    assert np.isneginf(lse64[0, 0, 0])
    finite_for_empty = lse64.copy()
    finite_for_empty[0, 0, 0] = -1e30
    out = check_outputs(o64, finite_for_empty, q, k, v, causal=True, scale=0.3, dtype="bf16")
    assert not out.passed and out.lse_err == math.inf
    empty_for_seen = lse64.copy()
    empty_for_seen[0, 0, 20] = -np.inf
    out = check_outputs(o64, empty_for_seen, q, k, v, causal=True, scale=0.3, dtype="bf16")
    assert not out.passed and out.lse_err == math.inf


def test_check_outputs_rejects_wrong_shapes_and_dtypes():
    q, k, v = inputs("bf16")
    o64, lse64 = reference(q, k, v, causal=False, scale=0.3)
    with pytest.raises(ValueError, match="expected o"):
        check_outputs(o64[:, :, :-1], lse64, q, k, v, causal=False, scale=0.3, dtype="bf16")
    with pytest.raises(ValueError, match="dtype='int8'"):
        check_outputs(o64, lse64, q, k, v, causal=False, scale=0.3, dtype="int8")


def test_max_abs_logit_is_the_largest_scaled_score():
    q, k = rand((2, 3, 5, 4), 1), rand((2, 3, 7, 4), 2)
    want = np.abs(np.einsum("bhid,bhjd->bhij", q, k)).max() * 0.7
    assert oracle.max_abs_logit(q, k, 0.7) == pytest.approx(want, rel=1e-5)
