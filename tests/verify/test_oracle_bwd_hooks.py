"""The backward oracle with user hooks: the library's hooks give the built-in features' float64
gradients, a hooked gradient is the derivative of the hooked forward (central differences of
`oracle.reference` with the same hooks), and keys a mask drops add nothing even where the
score_mod's derivative is not finite."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashgen.generator import hooks as hk
from flashgen.generator.features.hook import HookCall
from flashgen.generator.hooks import library
from flashgen.verify import oracle
from flashgen.verify.oracle_bwd import check_grads, reference_grads, rounded_reference_grads


def problem(seed: int, h: int = 4, h_kv: int = 2, tq: int = 9, tk: int = 11, gain: float = 1.5):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, h, tq, 8)) * gain
    k = rng.standard_normal((2, h_kv, tk, 8)) * gain
    v = rng.standard_normal((2, h_kv, tk, 8))
    do = rng.standard_normal((2, h, tq, 8))
    return q, k, v, do


def slopes(h: int, scale: float) -> np.ndarray:
    return (scale * 2.0 ** (-8.0 * (np.arange(h) + 1) / h)).astype(np.float32)


def _both(s, b, h, i, j, cap, sl):  # softcap then ALiBi, the built-ins' order, in one hook
    return library.alibi_score(library.softcap_score(s, b, h, i, j, cap), b, h, i, j, sl)


BOTH = hk.trace_score_mod(_both, library.SOFTCAP_AUX, library.ALIBI_AUX)


def _assert_same_grads(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> None:
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=name)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    causal=st.booleans(),
    tq=st.integers(1, 14),
    tk=st.integers(1, 14),
    cap=st.floats(0.5, 50.0),
    slope=st.floats(1e-3, 1.0),
    left=st.integers(-1, 15),
    right=st.integers(-1, 15),
)
def test_library_hooks_give_the_built_in_features_gradients(
    seed, causal, tq, tk, cap, slope, left, right
):
    """softcap's derivative is 1 - tanh^2 (not 1): a backward that skipped the hook's chain
    rule, or took it at another point than the forward's scaled score, fails here."""
    q, k, v, do = problem(seed, tq=tq, tk=tk)
    cap = float(np.float32(cap))  # the hook reads a float32 aux scalar, as the kernel does
    sl = slopes(q.shape[1], slope)
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"softcap": cap}, {"score_mod": HookCall(library.softcap_hook(), {"softcap": cap})}),
        ({"alibi_slopes": sl}, {"score_mod": HookCall(library.alibi_hook(), {"alibi_slopes": sl})}),
        (
            {"softcap": cap, "alibi_slopes": sl},
            {"score_mod": HookCall(BOTH, {"softcap": cap, "alibi_slopes": sl})},
        ),
        (
            {"window": (left, right)},
            {"mask_mod": HookCall(
                library.window_hook(), {"window_left": left, "window_right": right}
            )},
        ),  # fmt: skip
    ]
    for features, hooks in cases:
        want = reference_grads(q, k, v, do, causal=causal, scale=0.3, **features)
        got = reference_grads(q, k, v, do, causal=causal, scale=0.3, **hooks)
        _assert_same_grads(got, want)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_rounded_reference_takes_hooks_and_stays_close_to_the_built_in(dtype):
    q, k, v, do = problem(3, tq=33, tk=47)
    hooks = {"score_mod": HookCall(library.softcap_hook(), {"softcap": 2.0})}
    got = rounded_reference_grads(q, k, v, do, dtype=dtype, scale=0.3, causal=True, **hooks)
    want = rounded_reference_grads(q, k, v, do, dtype=dtype, scale=0.3, causal=True, softcap=2.0)
    exact = reference_grads(q, k, v, do, scale=0.3, causal=True, softcap=2.0)
    for g, w, e in zip(got, want, exact, strict=True):
        # the hook in float64 rounded to fp32 vs the built-in's fp32 tanh: a few storage ulps
        assert np.abs(g - w).max() <= 4 * np.abs(w - e).max() + 1e-6


def test_the_gradient_rule_takes_hooks():
    q, k, v, do = problem(4, tq=20, tk=20)
    doc = np.repeat(np.arange(4, dtype=np.int32), 5)
    hooks = {
        "score_mod": HookCall(library.softcap_hook(), {"softcap": 3.0}),
        "mask_mod": HookCall(library.document_hook(), {"doc_ids": doc}),
    }
    ref = rounded_reference_grads(q, k, v, do, dtype="bf16", scale=0.3, **hooks)
    assert all(o.passed for o in check_grads(ref, q, k, v, do, dtype="bf16", scale=0.3, **hooks))
    # the built-in softcap's gradients are not the document-masked ones: the rule sees hooks
    plain = rounded_reference_grads(q, k, v, do, dtype="bf16", scale=0.3, softcap=3.0)
    outcomes = check_grads(plain, q, k, v, do, dtype="bf16", scale=0.3, **hooks)
    assert not all(o.passed for o in outcomes)


# ---- the hooked gradient is the hooked forward's derivative -----------------------------------
def _rel_bias(score, b, h, q_idx, kv_idx, bias, gain, curve, center):
    # every aux kind (2-D and 1-D tables, a float and an int scalar) and a score-dependent
    # derivative gain[h] + 0.5 * curve * (1 - tanh^2(curve * score)) that varies per head
    rel = hk.minimum(hk.maximum(kv_idx - q_idx + center, 0), 7)
    return gain[h] * score + bias[h, rel] + 0.5 * hk.tanh(score * curve)


CUSTOM = hk.trace_score_mod(
    _rel_bias,
    hk.Aux("bias", "float32", 2),
    hk.Aux("gain", "float32", 1),
    hk.Aux("curve", "float32", 0),
    hk.Aux("center", "int32", 0),
)


def _custom_aux(h: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "bias": rng.standard_normal((h, 8)).astype(np.float32),
        "gain": rng.uniform(0.5, 1.5, h).astype(np.float32),
        "curve": 0.75,
        "center": 3,
    }


def _loss(q, k, v, do, kw) -> float:
    o, _ = oracle.reference(q, k, v, **kw)
    return float(np.sum(o * do))


def _finite_differences(q, k, v, do, kw, step=1e-6):
    args = [q.copy(), k.copy(), v.copy()]
    out = []
    for a in args:
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            x = a[idx]
            a[idx] = x + step
            up = _loss(*args, do, kw)
            a[idx] = x - step
            down = _loss(*args, do, kw)
            a[idx] = x
            g[idx] = (up - down) / (2 * step)
        out.append(g)
    return out


DOCS = np.array([0, 0, 1, 1, 1, 2, 2], np.int32)
FD_CASES = [
    ("custom", 7, 9, False, lambda h: {"score_mod": HookCall(CUSTOM, _custom_aux(h, 1))}),
    ("custom-causal", 9, 6, True, lambda h: {"score_mod": HookCall(CUSTOM, _custom_aux(h, 2))}),
    ("softcap+document", 7, 7, False, lambda h: {
        "score_mod": HookCall(library.softcap_hook(), {"softcap": 1.5}),
        "mask_mod": HookCall(library.document_hook(), {"doc_ids": DOCS}),
    }),
    ("prefix-lm", 6, 8, False, lambda h: {
        "mask_mod": HookCall(library.prefix_lm_hook(), {"prefix": 3}),
    }),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "tq", "tk", "causal", "hooks"), FD_CASES, ids=[c[0] for c in FD_CASES]
)
def test_hooked_gradients_match_finite_differences_of_the_hooked_forward(
    name, tq, tk, causal, hooks
):
    rng = np.random.default_rng(len(name))
    h, h_kv, d = 2, 1, 3
    q = rng.standard_normal((1, h, tq, d))
    k = rng.standard_normal((1, h_kv, tk, d))
    v = rng.standard_normal((1, h_kv, tk, d))
    do = rng.standard_normal((1, h, tq, d))
    kw = {"causal": causal, "scale": 0.7, **hooks(h)}
    got = reference_grads(q, k, v, do, **kw)
    want = _finite_differences(q, k, v, do, kw)
    for g_name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7, err_msg=g_name)


def test_a_dropped_key_adds_nothing_where_the_derivative_is_not_finite():
    """A score_mod that overflows on the keys causal masking hides (value and derivative inf
    there): those keys have P = 0, so dS is 0 there, not 0 * inf = NaN."""
    wild = hk.trace_score_mod(
        lambda s, b, h, i, j: hk.where(j <= i, s, hk.exp(s * 1000.0 + 1000.0))
    )
    q, k, v, do = problem(5, tq=8, tk=8)
    with np.errstate(over="ignore"):
        got = reference_grads(q, k, v, do, causal=True, scale=0.3, score_mod=HookCall(wild))
    want = reference_grads(q, k, v, do, causal=True, scale=0.3)
    _assert_same_grads(got, want)
    assert all(np.isfinite(g).all() for g in got)
