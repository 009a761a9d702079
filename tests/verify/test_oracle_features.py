"""The oracle's attention features (issue 12) against a plain per-row formula.

Sliding windows, softcap, ALiBi, grouped-query heads and a value head dim of its own, each on
its own and combined, compared with a loop that writes the definition out one query row at a
time in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashgen.verify import oracle


def plain(q, k, v, *, causal, scale, window=None, softcap=None, slopes=None):
    """softmax over the keys query i may see of (capped) scale*q.k - slope*|p - j|, times V."""
    b, h, tq, _ = q.shape
    h_kv, tk, dv = k.shape[1], k.shape[2], v.shape[3]
    o = np.zeros((b, h, tq, dv))
    lse = np.full((b, h, tq), -np.inf)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // h_kv)
            for i in range(tq):
                p = i + tk - tq  # the query's position among the keys
                logits, values = [], []
                for j in range(tk):
                    if causal and j > p:
                        continue
                    if window is not None:
                        left, right = window
                        if (left >= 0 and j < p - left) or (right >= 0 and j > p + right):
                            continue
                    s = scale * float(np.dot(q[bi, hi, i], k[bi, kv, j]))
                    if softcap is not None:
                        s = softcap * math.tanh(s / softcap)
                    if slopes is not None:
                        s -= slopes[hi] * abs(p - j)
                    logits.append(s)
                    values.append(v[bi, kv, j])
                if not logits:
                    continue  # no key: O = 0, LSE = -inf
                m = max(logits)
                w = [math.exp(x - m) for x in logits]
                o[bi, hi, i] = sum(wi * vi for wi, vi in zip(w, values, strict=True)) / sum(w)
                lse[bi, hi, i] = m + math.log(sum(w))
    return o, lse


CASES = [
    ({"window": (3, 0)}, False),
    ({"window": (2, 2)}, False),
    ({"window": (4, -1)}, True),  # window left of a causal mask
    ({"window": (0, 0)}, False),  # each query sees one key (or none)
    ({"window": (-1, 1)}, False),  # unbounded on the left
    ({"softcap": 2.5}, False),
    ({"softcap": 30.0}, True),
    ({"slopes": np.array([0.5, 0.25, 0.125, 0.0625])}, False),
    ({"slopes": np.array([0.5, 0.25, 0.125, 0.0625])}, True),
    ({"window": (5, 1), "softcap": 4.0, "slopes": np.array([0.3, 0.2, 0.1, 0.05])}, True),
]


@pytest.mark.parametrize(("features", "causal"), CASES)
@pytest.mark.parametrize(("tq", "tk", "h_kv", "dv"), [(7, 11, 4, 8), (11, 7, 2, 8), (6, 6, 1, 5)])
def test_oracle_features_match_the_plain_formula(features, causal, tq, tk, h_kv, dv):
    rng = np.random.default_rng(tq * 100 + tk)
    q = rng.standard_normal((2, 4, tq, 8)) * 2
    k = rng.standard_normal((2, h_kv, tk, 8)) * 2
    v = rng.standard_normal((2, h_kv, tk, dv))
    kw = {kk: vv for kk, vv in features.items() if kk != "slopes"}
    o, lse = oracle.reference(
        q, k, v, causal=causal, scale=0.4, alibi_slopes=features.get("slopes"), **kw
    )
    o_ref, lse_ref = plain(q, k, v, causal=causal, scale=0.4, **features)
    assert o.shape == (2, 4, tq, dv)
    np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    finite = np.isfinite(lse_ref)
    np.testing.assert_allclose(lse[finite], lse_ref[finite], rtol=1e-12, atol=1e-12)


def test_an_empty_window_leaves_every_row_without_keys():
    q = np.ones((1, 1, 4, 8))
    k = v = np.ones((1, 1, 8, 8))
    # every query sits at key position >= 4; a window of (0, 0) shifted past the keys: none
    o, lse = oracle.reference(q, k, v, causal=False, scale=1.0, window=(0, 0))
    assert np.isfinite(lse).all()  # one key each
    o, lse = oracle.reference(q[:, :, :4], k[:, :, :2], v[:, :, :2], causal=True, scale=1.0,
                              window=(0, 0))  # fmt: skip
    assert np.isneginf(lse[0, 0, :2]).all() and (o[0, 0, :2] == 0).all()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_rounded_reference_follows_the_same_features(dtype):
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 4, 9, 16))
    k = rng.standard_normal((1, 2, 13, 16))
    v = rng.standard_normal((1, 2, 13, 16))
    kw = {"window": (4, 1), "softcap": 3.0, "alibi_slopes": np.array([0.4, 0.2, 0.1, 0.05])}
    o64, _ = oracle.reference(q, k, v, causal=True, scale=0.3, **kw)
    o_lo = oracle.rounded_reference(q, k, v, causal=True, scale=0.3, dtype=dtype, **kw)
    plain_o = oracle.rounded_reference(q, k, v, causal=True, scale=0.3, dtype=dtype)
    # close to the float64 answer with the features, far from the one without them
    err = np.abs(o_lo - o64).max()
    assert err < 0.05 and np.abs(plain_o - o64).max() > 5 * err
