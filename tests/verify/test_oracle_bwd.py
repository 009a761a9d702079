"""The backward oracle (oracle_bwd): float64 gradients and FlashAttention's gradient rule.

The float64 gradients are compared with central finite differences of a plain float64 forward
written here from the definition (every feature: causal with Tq < Tk and Tq > Tk, windows that
leave rows without keys, softcap, ALiBi, grouped-query heads, dv != d), and with torch's float64
autograd of a naive attention when torch is installed. The rule must accept the same-precision
reference and the float64 gradients stored in the low dtype, and reject a gradient moved past
its bound or computed with one of the usual backward bugs.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flashgen.verify import oracle, oracle_bwd
from flashgen.verify.oracle_bwd import check_grads, reference_grads, rounded_reference_grads

STORE = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}


def keys_seen(tq: int, tk: int, causal: bool, window: tuple[int, int] | None) -> np.ndarray:
    """(Tq, Tk) booleans from the definition: query i sits at key position p = i + Tk - Tq."""
    ok = np.zeros((tq, tk), bool)
    for i in range(tq):
        p = i + tk - tq
        for j in range(tk):
            seen = not (causal and j > p)
            if window is not None:
                left, right = window
                seen &= not ((left >= 0 and j < p - left) or (right >= 0 and j > p + right))
            ok[i, j] = seen
    return ok


def logits_and_mask(q, k, *, scale, causal=False, window=None, softcap=None, slopes=None):
    """Per query head: the logits the softmax sees (masked ones arbitrary) and the mask."""
    b, h, tq, _ = q.shape
    h_kv, tk = k.shape[1], k.shape[2]
    kv = [hi // (h // h_kv) for hi in range(h)]  # query head -> its K/V head
    s = np.einsum("bhid,bhjd->bhij", q, k[:, kv]) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if slopes is not None:
        dist = np.array([[abs(i + tk - tq - j) for j in range(tk)] for i in range(tq)], float)
        s = s - np.asarray(slopes)[None, :, None, None] * dist
    return s, keys_seen(tq, tk, causal, window), kv


def plain_forward(q, k, v, **feats) -> np.ndarray:
    """softmax over the keys a query sees, times V; a row that sees none outputs zeros."""
    s, seen, kv = logits_and_mask(q, k, **feats)
    s = np.where(seen, s, -np.inf)
    rows = seen.any(axis=1)[:, None]
    m = np.where(rows, s.max(axis=-1, keepdims=True), 0.0)
    w = np.exp(s - m)
    p = w / np.where(rows, w.sum(axis=-1, keepdims=True), 1.0)
    return np.einsum("bhij,bhjd->bhid", p, v[:, kv])


def finite_difference_grads(q, k, v, do, step=1e-5, **feats):
    """Central differences of L = sum(O * dO) in every element of q, k and v."""
    args = [q.copy(), k.copy(), v.copy()]
    grads = []
    for a in args:
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            x = a[idx]
            a[idx] = x + step
            up = float(np.sum(plain_forward(*args, **feats) * do))
            a[idx] = x - step
            down = float(np.sum(plain_forward(*args, **feats) * do))
            a[idx] = x
            g[idx] = (up - down) / (2 * step)
        grads.append(g)
    return grads


def problem(b, h, h_kv, tq, tk, d, dv, seed=0, gain=1.5):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, tq, d)) * gain
    k = rng.standard_normal((b, h_kv, tk, d)) * gain
    v = rng.standard_normal((b, h_kv, tk, dv))
    do = rng.standard_normal((b, h, tq, dv))
    return q, k, v, do


SLOPES = np.array([0.5, 0.25, 0.125, 0.0625])
# (id, (h, h_kv, tq, tk, d, dv), features): every feature, alone and together
CASES: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("plain", (2, 2, 5, 5, 4, 4), {}),
    ("causal-tq<tk", (2, 2, 3, 6, 4, 4), {"causal": True}),
    ("causal-tq>tk-empty-rows", (2, 2, 6, 3, 4, 4), {"causal": True}),
    ("window-2-1", (2, 2, 5, 7, 3, 3), {"window": (2, 1)}),
    ("window-1-0-empty-rows", (2, 2, 6, 3, 3, 3), {"window": (1, 0)}),
    ("window-0-0-causal-empty", (2, 2, 5, 2, 3, 3), {"causal": True, "window": (0, 0)}),
    ("window-unbounded-left", (2, 2, 4, 6, 3, 3), {"window": (-1, 1)}),
    ("softcap", (2, 2, 4, 5, 4, 4), {"softcap": 1.5}),
    ("alibi-causal", (4, 4, 4, 5, 3, 3), {"causal": True, "slopes": SLOPES}),
    ("gqa-2", (4, 2, 4, 5, 3, 3), {}),
    ("gqa-4-dv", (4, 1, 4, 5, 3, 5), {"causal": True}),
    ("dv-ne-d", (2, 2, 4, 5, 4, 2), {}),
    (
        "everything",
        (4, 2, 7, 5, 3, 2),
        {"causal": True, "window": (3, 1), "softcap": 2.0, "slopes": SLOPES},
    ),
]
IDS = [c[0] for c in CASES]


def oracle_kw(feats: dict[str, Any]) -> dict[str, Any]:
    """The test's feature spelling (slopes) -> the oracle's (alibi_slopes)."""
    kw = {key: val for key, val in feats.items() if key != "slopes"}
    return {**kw, "alibi_slopes": feats.get("slopes")}


@pytest.mark.parametrize(("name", "dims", "feats"), CASES, ids=IDS)
def test_gradients_match_finite_differences_of_the_plain_forward(name, dims, feats):
    h, h_kv, tq, tk, d, dv = dims
    q, k, v, do = problem(1, h, h_kv, tq, tk, d, dv, seed=len(name))
    # the plain forward is the oracle's forward (so the differences differentiate the same thing)
    o, _ = oracle.reference(q, k, v, scale=0.6, **{"causal": False, **oracle_kw(feats)})
    np.testing.assert_allclose(plain_forward(q, k, v, scale=0.6, **feats), o, atol=1e-13)
    got = reference_grads(q, k, v, do, scale=0.6, **oracle_kw(feats))
    want = finite_difference_grads(q, k, v, do, scale=0.6, **feats)
    for g, w, x in zip(got, want, (q, k, v), strict=True):
        assert g.shape == x.shape and g.dtype == np.float64
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-8)


def torch_grads(q, k, v, do, *, scale, causal=False, window=None, softcap=None, slopes=None):
    """torch float64 autograd through a naive attention written from the definition."""
    torch = pytest.importorskip("torch")
    qt, kt, vt = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    ke, ve = kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1)
    s = torch.einsum("bhid,bhjd->bhij", qt, ke) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    tq, tk = q.shape[2], k.shape[2]
    pos = torch.arange(tq)[:, None] + tk - tq
    j = torch.arange(tk)[None, :]
    if slopes is not None:
        s = s - torch.tensor(slopes)[None, :, None, None] * (pos - j).abs()
    seen = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        seen &= j <= pos
    if window is not None:
        if window[0] >= 0:
            seen &= j >= pos - window[0]
        if window[1] >= 0:
            seen &= j <= pos + window[1]
    empty = ~seen.any(dim=1, keepdim=True)
    # an all -inf row's softmax is NaN and NaN * 0 stays NaN in backward: give empty rows
    # finite dummy logits and zero their output instead
    s = torch.where(empty, 0.0, s.masked_fill(~seen, -math.inf))
    o = torch.where(empty[:, :1], 0.0, torch.softmax(s, dim=-1) @ ve)
    (o * torch.tensor(do)).sum().backward()
    return [t.grad.numpy() for t in (qt, kt, vt)]


@pytest.mark.parametrize(("name", "dims", "feats"), CASES, ids=IDS)
def test_gradients_match_torch_float64_autograd(name, dims, feats):
    h, h_kv, tq, tk, d, dv = dims
    # larger than the finite-difference problems: two batches, longer rows, wider heads
    q, k, v, do = problem(2, h, h_kv, tq + 6, tk + 5, 2 * d, 2 * dv, seed=7)
    want = torch_grads(q, k, v, do, scale=0.3, **feats)
    got = reference_grads(q, k, v, do, scale=0.3, **oracle_kw(feats))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_rows_and_keys_outside_every_window_get_exactly_zero_gradient():
    # Tq=6 > Tk=3, window (1, 0): query i sits at p = i - 3 and sees keys p-1..p, so rows 0..2
    # see no key, row 3 one key (P = 1: dS = 0, so dQ = 0 too) and rows 4, 5 two keys
    q, k, v, do = problem(1, 2, 2, 6, 3, 4, 4)
    dq, dk, dv = reference_grads(q, k, v, do, scale=0.5, window=(1, 0))
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    assert (dq[:, :, :4] == 0).all() and (np.abs(dq[:, :, 4:]).sum(-1) > 0).all()
    # causal (0, 0) with Tq=3 < Tk=7: keys before the first query's position 4 are never seen
    q, k, v, do = problem(1, 2, 2, 3, 7, 4, 4)
    dq, dk, dv = reference_grads(q, k, v, do, scale=0.5, causal=True, window=(0, 0))
    assert (dk[:, :, :4] == 0).all() and (dv[:, :, :4] == 0).all()
    # one key per query: P = 1, so dS = dO.v - dO.o = 0 (up to the two sums' rounding) and
    # dQ = 0, while dV is dO itself
    np.testing.assert_allclose(dq, 0, atol=1e-14)
    np.testing.assert_array_equal(dv[:, :, 4:], do)
    # Tq=7 > Tk=1, causal: only the last row sees the key; its P = 1 gives dK = 0, dV = dO
    q, k, v, do = problem(1, 2, 1, 7, 1, 4, 4)
    dq, dk, dv = reference_grads(q, k, v, do, causal=True, scale=0.5)
    assert (dq[:, :, :6] == 0).all() and np.isfinite(dq).all()
    np.testing.assert_allclose(dk, 0, atol=1e-14)
    np.testing.assert_array_equal(dv[:, 0, 0], do[:, :, 6].sum(axis=1))


def test_scale_defaults_to_one_over_sqrt_d():
    q, k, v, do = problem(1, 2, 1, 4, 5, 9, 3)
    a = reference_grads(q, k, v, do)
    b = reference_grads(q, k, v, do, scale=1 / 3)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_head_chunking_does_not_change_the_gradients(monkeypatch):
    q, k, v, do = problem(2, 4, 2, 9, 11, 8, 6)
    kw: dict[str, Any] = {"scale": 0.3, "causal": True, "softcap": 3.0, "alibi_slopes": SLOPES}
    whole = reference_grads(q, k, v, do, **kw)
    low = rounded_reference_grads(q, k, v, do, dtype="bf16", **kw)
    monkeypatch.setattr(oracle, "CHUNK_SCORES", 9 * 11 * 3)  # three heads per chunk
    for a, b in zip(whole, reference_grads(q, k, v, do, **kw), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(low, rounded_reference_grads(q, k, v, do, dtype="bf16", **kw), strict=True):
        np.testing.assert_array_equal(a, b)


def test_do_must_have_the_output_shape():
    q, k, v, do = problem(1, 2, 2, 4, 5, 8, 6)
    with pytest.raises(ValueError, match="O's shape"):
        reference_grads(q, k, v, do[..., :5])
    with pytest.raises(ValueError, match="H a multiple of H_kv"):
        reference_grads(q, k[:, :, :, :4], v, do)


# ---- the same-precision reference ------------------------------------------------------------
def low_problem(dtype: str, seed: int = 0, dims=(4, 2, 37, 45, 32, 16)):
    """A problem already in the storage dtype (as a kernel receives it)."""
    h, h_kv, tq, tk, d, dv = dims
    return tuple(x.astype(STORE[dtype]) for x in problem(1, h, h_kv, tq, tk, d, dv, seed))


FEATS: dict[str, Any] = {
    "scale": 32**-0.5, "causal": True, "window": (20, 3), "softcap": 3.0, "alibi_slopes": SLOPES,
}  # fmt: skip


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_rounded_reference_is_close_to_float64_and_holds_storage_values(dtype):
    q, k, v, do = low_problem(dtype)
    g64 = reference_grads(q, k, v, do, **FEATS)
    g_lo = rounded_reference_grads(q, k, v, do, dtype=dtype, **FEATS)
    for lo, exact in zip(g_lo, g64, strict=True):
        err = np.abs(lo - exact).max() / np.abs(exact).max()
        assert 0 < err < (0.03 if dtype == "bf16" else 0.004)
        np.testing.assert_array_equal(lo, lo.astype(STORE[dtype]).astype(np.float64))


def test_rounded_reference_keeps_rows_without_keys_at_zero():
    q, k, v, do = low_problem("bf16", dims=(2, 2, 6, 3, 16, 16))
    dq, dk, dv = rounded_reference_grads(q, k, v, do, dtype="bf16", causal=True)
    assert (dq[:, :, :3] == 0).all() and np.isfinite(dk).all() and np.isfinite(dv).all()


# ---- the rule ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_check_accepts_the_rounded_reference_and_the_stored_float64_gradients(dtype):
    q, k, v, do = low_problem(dtype)
    g_lo = rounded_reference_grads(q, k, v, do, dtype=dtype, **FEATS)
    g64 = reference_grads(q, k, v, do, **FEATS)
    for got in (g_lo, tuple(g.astype(STORE[dtype]) for g in g64)):
        outs = check_grads(got, q, k, v, do, dtype=dtype, **FEATS)
        assert [o.name for o in outs] == ["dq", "dk", "dv"]
        assert all(o.passed and o.ratio <= 1 and not o.has_nan for o in outs), outs


@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_check_bound_is_twice_the_reference_error_plus_one_ulp_of_the_largest(dtype, which):
    q, k, v, do = low_problem(dtype, seed=3)
    g64 = reference_grads(q, k, v, do, **FEATS)
    g_lo = rounded_reference_grads(q, k, v, do, dtype=dtype, **FEATS)
    scale = FEATS.get("scale") or 1.0 / math.sqrt(q.shape[-1])
    floor = oracle_bwd.cancel_floor(q, k, v, do, scale)
    assert 0 < floor < 1e-4 * np.abs(g64[which]).max()  # far below any storage ulp
    eps = float(ml_dtypes.finfo(STORE[dtype]).eps) * np.abs(g64[which]).max() + floor
    bound = 2 * np.abs(g_lo[which] - g64[which]).max() + eps
    for factor, ok in ((0.99, True), (1.01, False)):
        got = [g.copy() for g in g64]
        got[which][0, 1, 2, 3] += factor * bound
        outs = check_grads(tuple(got), q, k, v, do, dtype=dtype, **FEATS)
        assert outs[which].bound == pytest.approx(bound) and outs[which].eps == pytest.approx(eps)
        assert outs[which].passed is ok
        # the other two gradients are untouched float64 values: error 0
        assert all(o.passed and o.err == 0 for i, o in enumerate(outs) if i != which)


def test_check_rejects_nan_and_wrong_shapes_and_dtypes():
    q, k, v, do = low_problem("fp16", dims=(2, 1, 8, 9, 16, 8))
    g = [x.copy() for x in reference_grads(q, k, v, do)]
    g[1][0, 0, 4, 2] = np.nan
    outs = check_grads(tuple(g), q, k, v, do, dtype="fp16")
    assert outs[1].has_nan and not outs[1].passed and outs[1].ratio == math.inf
    assert outs[0].passed and outs[2].passed
    with pytest.raises(ValueError, match="expected"):
        check_grads((g[0], g[2], g[1]), q, k, v, do, dtype="fp16")
    with pytest.raises(ValueError, match="dtype='int8'"):
        check_grads(tuple(g), q, k, v, do, dtype="int8")


def buggy_grads(q, k, v, do, bug, *, scale, causal, window, softcap, alibi_slopes):
    """A float64 backward written out with einsum, with one injected bug (None: correct)."""
    qf, kf, vf, dof = (np.asarray(x, np.float64) for x in (q, k, v, do))
    tq, tk = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    ke, ve = np.repeat(kf, group, axis=1), np.repeat(vf, group, axis=1)
    raw = np.einsum("bhid,bhjd->bhij", qf, ke) * scale
    th = np.tanh(raw / softcap)
    pos = np.arange(tq)[:, None] + tk - tq + (1 if bug == "diagonal_plus_1" else 0)
    j = np.arange(tk)[None, :]
    s = softcap * th - alibi_slopes[None, :, None, None] * np.abs(pos - j)
    seen = (j <= pos) & (j >= pos - window[0]) & (j <= pos + window[1])
    s = np.where(seen, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))  # every row sees a key in these problems
    p /= p.sum(-1, keepdims=True)
    o = p @ ve
    dp = dof @ ve.transpose(0, 1, 3, 2)
    ds = p * (dp - (0 if bug == "no_D" else (dof * o).sum(-1, keepdims=True)))
    ds *= 1 if bug == "no_softcap_grad" else 1 - th**2
    dq = ds @ ke * scale
    dk = ds.transpose(0, 1, 3, 2) @ qf * (1 if bug == "dk_unscaled" else scale)
    dv = p.transpose(0, 1, 3, 2) @ dof
    b, h_kv = k.shape[:2]
    if bug == "gqa_first_head_only":
        dk, dv = dk[:, ::group] * group, dv[:, ::group] * group
    else:
        dk = dk.reshape(b, h_kv, group, tk, -1).sum(2)
        dv = dv.reshape(b, h_kv, group, tk, -1).sum(2)
    return tuple(g.astype(q.dtype) for g in (dq, dk, dv))  # stored as a kernel returns them


BWD_BUGS = ["no_D", "no_softcap_grad", "dk_unscaled", "gqa_first_head_only", "diagonal_plus_1"]


@pytest.mark.parametrize("bug", [None, *BWD_BUGS])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_injected_backward_bugs_fail_the_check(dtype, bug):
    q, k, v, do = low_problem(dtype, seed=11)
    got = buggy_grads(q, k, v, do, bug, **FEATS)
    outs = check_grads(got, q, k, v, do, dtype=dtype, **FEATS)
    if bug is None:  # the einsum backward is a correct kernel: it passes
        assert all(o.passed for o in outs), outs
    else:
        assert not all(o.passed for o in outs), (bug, outs)


def test_grad_eps_is_one_storage_ulp_of_the_largest_gradient():
    g = np.array([[-3.0, 0.5], [1.0, 2.0]])
    assert oracle_bwd.grad_eps(g, "bf16") == 3.0 * 2.0**-7
    assert oracle_bwd.grad_eps(g, "fp16") == 3.0 * 2.0**-10
    assert oracle_bwd.grad_eps(g, "fp32") == 3.0 * 2.0**-23
    assert oracle_bwd.grad_eps(np.zeros((2, 2)), "bf16") == 0.0


def test_an_exactly_zero_gradient_allows_fp32_cancellation_noise_only():
    # one key per row: dS = P (dP - D) is exactly 0, so dQ = dK = 0; a kernel's fp32 dP - D
    # leaves ulps of |dO||V| there, which the cancellation floor admits (and nothing larger)
    rng = np.random.default_rng(7)
    q, k, v, do = (rng.standard_normal((1, 1, 1, 16)) for _ in range(4))
    g64 = reference_grads(q, k, v, do)
    assert np.abs(g64[0]).max() < 1e-12 and np.abs(g64[1]).max() < 1e-12  # zero, up to float64
    noisy = (g64[0] + 2e-7, g64[1] - 2e-7, g64[2])
    assert all(o.passed for o in check_grads(noisy, q, k, v, do, dtype="bf16"))
    wrong = (g64[0] + 1e-3, g64[1], g64[2])
    assert not check_grads(wrong, q, k, v, do, dtype="bf16")[0].passed
