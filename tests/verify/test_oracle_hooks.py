"""The float64 oracle with user hooks: the library's hooks agree with the built-in features, the
hook's inputs are the right ones, and the rule judges a hooked kernel's outputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashgen.generator import hooks as hk
from flashgen.generator.features.hook import HookCall
from flashgen.generator.hooks import library
from flashgen.verify import oracle


def problem(seed: int, b: int = 2, h: int = 4, h_kv: int = 2, tq: int = 37, tk: int = 53):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, tq, 32))
    k = rng.standard_normal((b, h_kv, tk, 32))
    v = rng.standard_normal((b, h_kv, tk, 16))
    return q, k, v


def slopes(h: int, scale: float) -> np.ndarray:
    return (scale * 2.0 ** (-8.0 * (np.arange(h) + 1) / h)).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    causal=st.booleans(),
    tq=st.integers(1, 40),
    tk=st.integers(1, 40),
    cap=st.floats(0.5, 50.0),
    slope=st.floats(1e-3, 1.0),
    left=st.integers(-1, 45),
    right=st.integers(-1, 45),
)
def test_library_hooks_equal_the_built_in_features(seed, causal, tq, tk, cap, slope, left, right):
    q, k, v = problem(seed, tq=tq, tk=tk)
    cap = float(np.float32(cap))  # the hook reads a float32 aux scalar, as the kernel does
    sl = slopes(q.shape[1], slope)
    builtin = {"softcap": cap, "alibi_slopes": sl}
    # softcap then ALiBi, as the built-ins apply them (registry order), in one score_mod
    both = hk.trace_score_mod(
        lambda s, b, h, i, j, c, a: library.alibi_score(
            library.softcap_score(s, b, h, i, j, c), b, h, i, j, a
        ),
        library.SOFTCAP_AUX,
        library.ALIBI_AUX,
    )
    cases = [
        ({"softcap": cap}, {"score_mod": HookCall(library.softcap_hook(), {"softcap": cap})}),
        ({"alibi_slopes": sl}, {"score_mod": HookCall(library.alibi_hook(), {"alibi_slopes": sl})}),
        (builtin, {"score_mod": HookCall(both, {"softcap": cap, "alibi_slopes": sl})}),
        (
            {"window": (left, right)},
            {
                "mask_mod": HookCall(
                    library.window_hook(), {"window_left": left, "window_right": right}
                )
            },
        ),  # fmt: skip
    ]
    for features, hooks in cases:
        o1, l1 = oracle.reference(q, k, v, causal=causal, scale=0.3, **features)
        o2, l2 = oracle.reference(q, k, v, causal=causal, scale=0.3, **hooks)
        np.testing.assert_allclose(o2, o1, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(l2, l1, rtol=1e-12, atol=1e-12)
        r1 = oracle.rounded_reference(q, k, v, causal=causal, scale=0.3, dtype="bf16", **features)
        r2 = oracle.rounded_reference(q, k, v, causal=causal, scale=0.3, dtype="bf16", **hooks)
        # fp32 scores: the hook is evaluated in float64 and rounded, the built-ins in fp32
        assert np.abs(r2 - r1).max() <= 2 * np.abs(r1).max() * 2**-8


def test_the_causal_mask_hook_is_causal():
    q, k, v = problem(1)
    o1, l1 = oracle.reference(q, k, v, causal=True, scale=0.3)
    o2, l2 = oracle.reference(
        q, k, v, causal=False, scale=0.3, mask_mod=HookCall(library.causal_hook())
    )
    assert np.array_equal(o1, o2) and np.array_equal(l1, l2)


def test_the_hook_sees_batch_query_head_and_bottom_right_positions():
    """A score_mod that adds b, h, q_idx, kv_idx, Tq and Tk with distinct weights: the oracle's
    logits must be exactly those (GQA: h is the query head, not the K/V head)."""
    q, k, v = problem(2, b=2, h=4, h_kv=2, tq=5, tk=7)
    hook = hk.trace_score_mod(
        lambda s, b, h, i, j: (
            s * 0.0 + b * 1000 + h * 100 + i * 10 + j + hk.Q_LEN * 1e4 + hk.KV_LEN * 1e5
        )
    )
    call = HookCall(hook)
    s = np.zeros((8, 5, 7))
    got = call.logits(s, slice(0, 8), 4)
    bh = np.arange(8)[:, None, None]
    want = (bh // 4) * 1000 + (bh % 4) * 100 + np.arange(5)[:, None] * 10 + np.arange(7) + 5e4 + 7e5
    assert np.array_equal(got, np.broadcast_to(want, got.shape))


def test_a_document_mask_hides_other_documents_per_batch_and_head():
    q, k, v = problem(3, b=1, h=2, h_kv=2, tq=12, tk=12)
    doc = np.repeat(np.arange(3, dtype=np.int32), 4)
    o, lse = oracle.reference(
        q,
        k,
        v,
        causal=False,
        scale=0.3,
        mask_mod=HookCall(library.document_hook(), {"doc_ids": doc}),
    )
    for d in range(3):  # each document alone is plain attention
        part = slice(4 * d, 4 * d + 4)
        o_d, l_d = oracle.reference(
            q[:, :, part], k[:, :, part], v[:, :, part], causal=False, scale=0.3
        )
        np.testing.assert_allclose(o[:, :, part], o_d, rtol=1e-12)
        np.testing.assert_allclose(lse[:, :, part], l_d, rtol=1e-12)


def test_hook_keywords_must_be_hook_calls_of_their_kind():
    q, k, v = problem(4)
    with pytest.raises(TypeError, match="score_mod=.*must be a HookCall of a score_mod hook"):
        oracle.reference(q, k, v, causal=False, scale=0.3, score_mod=library.softcap_hook())
    with pytest.raises(TypeError, match="mask_mod=.*must be a HookCall of a mask_mod hook"):
        oracle.reference(
            q,
            k,
            v,
            causal=False,
            scale=0.3,
            mask_mod=HookCall(library.softcap_hook(), {"softcap": 1.0}),
        )


def test_a_score_mod_widens_the_lse_bound_by_its_fp32_evaluation():
    """The hook's terms: an identity hook costs only its kernel multiplies; the library's
    softcap and ALiBi hooks stay within a few times the built-ins' terms."""
    q, k, v = problem(5)
    plain = oracle.lse_bound(q, k, scale=0.3)
    ident = hk.trace_score_mod(lambda s, b, h, i, j: s)
    with_ident = oracle.lse_bound(q, k, scale=0.3, score_mod=HookCall(ident))
    assert plain < with_ident < plain + 1e-5
    sl = slopes(4, 0.5)
    for builtin, hooks in [
        ({"softcap": 2.0}, HookCall(library.softcap_hook(), {"softcap": 2.0})),
        ({"alibi_slopes": sl}, HookCall(library.alibi_hook(), {"alibi_slopes": sl})),
    ]:
        b = oracle.lse_bound(q, k, scale=0.3, **builtin)
        assert b <= oracle.lse_bound(q, k, scale=0.3, score_mod=hooks) <= 5 * b


def test_check_outputs_judges_a_hooked_forward():
    """The oracle's own answer passes; the answer without the hook (a kernel that ignored
    it) and one with a hook off by one key position fail."""
    q, k, v = problem(6)
    sl = slopes(4, 0.5)
    call = HookCall(library.alibi_hook(), {"alibi_slopes": sl})
    o, lse = oracle.reference(q, k, v, causal=True, scale=0.3, score_mod=call)
    args = {"causal": True, "scale": 0.3, "dtype": "fp32", "score_mod": call}
    assert oracle.check_outputs(o, lse, q, k, v, **args).passed
    o0, l0 = oracle.reference(q, k, v, causal=True, scale=0.3)
    assert not oracle.check_outputs(o0, l0, q, k, v, **args).passed
    shifted = hk.trace_score_mod(
        lambda s, b, h, i, j, a: library.alibi_score(s, b, h, i + 1, j, a), library.ALIBI_AUX
    )
    o1, l1 = oracle.reference(
        q, k, v, causal=True, scale=0.3, score_mod=HookCall(shifted, {"alibi_slopes": sl})
    )
    assert not oracle.check_outputs(o1, l1, q, k, v, **args).passed
