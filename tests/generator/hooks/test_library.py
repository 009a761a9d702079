"""The ready-made hooks against the built-in features' own oracle terms (features/*.py and the
oracle's causal mask), on random problems: the same numbers, to the bit where the arithmetic
is the same, else to float64 rounding."""

from __future__ import annotations

import numpy as np
import pytest

from flashgen.generator.features import ALIBI, SOFTCAP, WINDOW
from flashgen.generator.hooks import evaluate_hook
from flashgen.generator.hooks.library import (
    LIBRARY,
    alibi_hook,
    causal_hook,
    document_hook,
    prefix_lm_hook,
    softcap_hook,
    window_hook,
)
from flashgen.verify.oracle import visible

SHAPES = [(7, 7), (5, 13), (13, 5), (1, 9), (9, 1)]  # Tq == Tk, Tq < Tk (decode-like), Tq > Tk


@pytest.mark.parametrize(("tq", "tk"), SHAPES)
def test_softcap_matches_the_feature(tq: int, tk: int) -> None:
    rng = np.random.default_rng(tq * 100 + tk)
    heads = np.array([0, 2, 5])
    s = rng.standard_normal((3, tq, tk)) * 40.0
    for cap in (float(np.float32(rng.uniform(0.5, 100.0))), 30.0, 1.0):
        got = evaluate_hook(
            softcap_hook(), heads=heads, tq=tq, tk=tk, score=s, aux={"softcap": cap}
        )
        assert np.array_equal(got, SOFTCAP.logits(cap, s, heads))
        grad = evaluate_hook(
            softcap_hook(), heads=heads, tq=tq, tk=tk, score=s, aux={"softcap": cap}, grad=True
        )
        want = SOFTCAP.dlogits(cap, s)
        assert want is not None
        np.testing.assert_allclose(grad, want, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize(("tq", "tk"), SHAPES)
def test_alibi_matches_the_feature(tq: int, tk: int) -> None:
    rng = np.random.default_rng(tq * 100 + tk + 1)
    n_heads = 6
    slopes = ALIBI.case_value(float(rng.uniform(1e-3, 1.0)), n_heads)
    heads = np.array([1, 3, 4, 5])  # any subset of query heads, as the oracle's chunks pass
    s = rng.standard_normal((4, tq, tk)) * 5.0
    aux = {"alibi_slopes": slopes}
    got = evaluate_hook(alibi_hook(), heads=heads, tq=tq, tk=tk, score=s, aux=aux)
    assert np.array_equal(got, ALIBI.logits(slopes, s, heads))
    assert not np.array_equal(got, s)  # the bias did something
    grad = evaluate_hook(alibi_hook(), heads=heads, tq=tq, tk=tk, score=s, aux=aux, grad=True)
    assert np.array_equal(grad, np.ones_like(s))  # the feature's dlogits is None: 1


def full(mask: np.ndarray, n_heads: int) -> np.ndarray:
    return np.broadcast_to(mask, (n_heads, *mask.shape))


@pytest.mark.parametrize(("tq", "tk"), SHAPES)
def test_causal_matches_the_oracle(tq: int, tk: int) -> None:
    got = evaluate_hook(causal_hook(), heads=[0, 1], tq=tq, tk=tk)
    assert np.array_equal(got, full(visible(tq, tk, causal=True), 2))


@pytest.mark.parametrize(("tq", "tk"), SHAPES)
def test_window_matches_the_feature(tq: int, tk: int) -> None:
    rng = np.random.default_rng(tq * 100 + tk + 2)
    sides = [-1, 0, 1, 3, tq, tk, tq + tk + 2, 2**31 - 1, *rng.integers(0, tq + tk, 4).tolist()]
    for left in sides:
        for right in sides:
            if left == right == -1:
                continue  # the feature's "off"
            aux = {"window_left": left, "window_right": right}
            got = evaluate_hook(window_hook(), heads=[0], tq=tq, tk=tk, aux=aux)
            want = WINDOW.visible((left, right), tq, tk)
            assert want is not None
            assert np.array_equal(got, full(want, 1)), (left, right)


@pytest.mark.parametrize("seed", range(3))
def test_document_mask(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = 40
    doc_ids = np.sort(rng.integers(0, 5, t)).astype(np.int32)  # packed documents
    got = evaluate_hook(document_hook(), heads=[0], tq=t, tk=t, aux={"doc_ids": doc_ids})
    assert np.array_equal(got[0], doc_ids[:, None] == doc_ids[None, :])
    assert not got.all() and got.any()


@pytest.mark.parametrize(("tq", "tk"), SHAPES)
def test_prefix_lm_mask(tq: int, tk: int) -> None:
    for prefix in (0, 1, tk // 2, tk, tk + 5):
        got = evaluate_hook(prefix_lm_hook(), heads=[0], tq=tq, tk=tk, aux={"prefix": prefix})
        j = np.arange(tk)[None, :]
        want = (j < prefix) | visible(tq, tk, causal=True)
        assert np.array_equal(got[0], want), prefix


def test_library_hooks_have_distinct_identities() -> None:
    digests = {name: make().digest for name, make in LIBRARY.items()}
    assert len(set(digests.values())) == len(digests)
