"""`flashgen.attention_with_kvcache` on the GPU through PyCUDA: NumPy inputs against the float64
oracle per sequence (contiguous and shuffled pages, ragged and zero lengths, GQA, features),
GPUArray inputs equal to the NumPy call's output bit for bit, bad device lengths as NaN rows."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import flashgen
from flashgen.runtime import gpu as runtime
from flashgen.verify.oracle import check_outputs

pytestmark = pytest.mark.gpu

NP_TYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def make(
    b: int, tq: int, h: int, h_kv: int, d: int, lens: list[int], dtype: str, page: int, seed: int
) -> dict[str, Any]:
    """q (B, Tq, H, d); a cache of max(lens) + 5 keys per sequence, contiguous (page 0) or in
    shuffled pages of `page` keys (a few unused); int32 lengths."""
    rng = np.random.default_rng(seed)
    t = NP_TYPES[dtype]
    cap = max(max(lens), 1) + 5
    q = rng.standard_normal((b, tq, h, d)).astype(t)
    k, v = (rng.standard_normal((b, cap, h_kv, d)).astype(t) for _ in "kv")
    out: dict[str, Any] = {"q": q, "k_dense": k, "v_dense": v, "lens": lens, "table": None,
                           "seqlens": np.array(lens, np.int32)}  # fmt: skip
    if not page:
        return {**out, "k": k, "v": v}
    per_seq = -(-cap // page)
    n_pages = b * per_seq + 3
    table = rng.permutation(n_pages)[: b * per_seq].reshape(b, per_seq).astype(np.int32)
    kp, vp = (rng.standard_normal((n_pages, page, h_kv, d)).astype(t) for _ in "kv")
    for s in range(b):
        for j in range(per_seq):
            lo, hi = j * page, min(cap, (j + 1) * page)
            kp[table[s, j], : hi - lo] = k[s, lo:hi]
            vp[table[s, j], : hi - lo] = v[s, lo:hi]
    return {**out, "k": kp, "v": vp, "table": table}


def assert_matches_oracle(o: Any, lse: Any, c: dict[str, Any], causal: bool, dtype: str,
                          **features: Any) -> None:  # fmt: skip
    d = c["q"].shape[-1]
    for s, n in enumerate(c["lens"]):
        if n == 0:  # no key: zeros and -inf
            assert (np.asarray(o[s], np.float32) == 0).all() and (lse[s] == -np.inf).all(), s
            continue
        qs, ks, vs, os_ = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (
            c["q"][s : s + 1], c["k_dense"][s : s + 1, :n], c["v_dense"][s : s + 1, :n],
            o[s : s + 1]))  # fmt: skip
        res = check_outputs(os_, lse[s : s + 1], qs, ks, vs, causal=causal, scale=d**-0.5,
                            dtype=dtype, **features)  # fmt: skip
        assert res.passed, (s, n, res)


CASES = [
    # (b, tq, h, h_kv, d, dtype, causal, page, lens)
    (4, 1, 32, 8, 128, "bf16", False, 0, [1, 77, 4096, 0]),
    (3, 4, 16, 4, 128, "fp16", True, 16, [5, 1000, 3000]),
    (2, 2, 8, 1, 64, "bf16", True, 7, [100, 1]),
    (2, 1, 4, 4, 256, "fp16", False, 256, [1500, 40]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}q{c[1]}h{c[2]}/{c[3]}d{c[4]}"
                                                      f"{c[5]}{'c' if c[6] else ''}p{c[7]}")
def test_numpy_calls_match_the_oracle(case: tuple[Any, ...]) -> None:
    b, tq, h, h_kv, d, dtype, causal, page, lens = case
    c = make(b, tq, h, h_kv, d, lens, dtype, page, seed=sum(lens))
    o, lse = flashgen.attention_with_kvcache(
        c["q"], c["k"], c["v"], c["seqlens"], block_table=c["table"], causal=causal,
        return_lse=True,
    )  # fmt: skip
    assert isinstance(o, np.ndarray) and o.shape == (b, tq, h, d) and o.dtype == c["q"].dtype
    assert lse.shape == (b, h, tq) and lse.dtype == np.float32
    assert_matches_oracle(o, lse, c, causal, dtype)


@pytest.mark.parametrize("features", [{"window": (50, 0)}, {"softcap": 15.0},
                                      {"alibi_slopes": np.linspace(0.05, 0.8, 8,
                                                                   dtype=np.float32)}])  # fmt: skip
def test_features(features: dict[str, Any]) -> None:
    c = make(2, 2, 8, 2, 64, [300, 61], "bf16", 0, seed=5)
    o, lse = flashgen.attention_with_kvcache(c["q"], c["k"], c["v"], c["seqlens"], causal=True,
                                             return_lse=True, **features)  # fmt: skip
    assert_matches_oracle(o, lse, c, True, "bf16", **features)


def test_gpuarrays_give_what_numpy_gives_and_stay_on_the_gpu() -> None:
    c = make(3, 1, 16, 2, 128, [2000, 0, 513], "bf16", 16, seed=9)
    want_o, want_lse = flashgen.attention_with_kvcache(
        c["q"], c["k"], c["v"], c["seqlens"], block_table=c["table"], return_lse=True
    )
    dev = {n: runtime.to_device(c[n]) for n in ("q", "k", "v", "seqlens", "table")}
    o, lse = flashgen.attention_with_kvcache(
        dev["q"], dev["k"], dev["v"], dev["seqlens"], block_table=dev["table"], return_lse=True
    )
    assert hasattr(o, "gpudata") and hasattr(lse, "gpudata")
    assert np.array_equal(runtime.to_host(o).view(np.uint16), want_o.view(np.uint16))
    assert np.array_equal(runtime.to_host(lse), want_lse)


def test_out_of_range_device_lengths_and_pages_give_nan_rows() -> None:
    c = make(3, 1, 8, 2, 64, [100, 100, 100], "fp16", 16, seed=3)
    lens = runtime.to_device(np.array([100, 10_000, 50], np.int32))  # 1: past the capacity
    table = c["table"].copy()
    table[2, 0] = 10_000  # 2: a page past the cache
    o, lse = flashgen.attention_with_kvcache(
        runtime.to_device(c["q"]), runtime.to_device(c["k"]), runtime.to_device(c["v"]), lens,
        block_table=runtime.to_device(table), return_lse=True,
    )  # fmt: skip
    o, lse = runtime.to_host(o).astype(np.float32), runtime.to_host(lse)
    assert np.isfinite(o[0]).all() and np.isfinite(lse[0]).all()
    assert np.isnan(o[1]).all() and np.isnan(lse[1]).all()
    assert np.isnan(o[2]).all() and np.isnan(lse[2]).all()


@pytest.mark.parametrize("tq, causal, features", [(1, False, {}), (4, True, {"softcap": 20.0}),
                                                  (16, True, {"window": (300, 0)})])  # fmt: skip
def test_flashgen_attentions_decode_route_matches_the_oracle(
    tq: int, causal: bool, features: dict[str, Any]
) -> None:
    """A dense call with few query rows against many keys runs the decode kernel
    (runtime/dense_decode.py), with the forward's results."""
    import flashgen.api
    from flashgen.runtime.dense_decode import DenseDecodeLaunch

    rng = np.random.default_rng(tq)
    q = rng.standard_normal((2, 16, tq, 128)).astype(ml_dtypes.bfloat16)
    k, v = (rng.standard_normal((2, 4, 3000, 128)).astype(ml_dtypes.bfloat16) for _ in "kv")
    flashgen.api._entries.clear()
    o, lse = flashgen.attention(q, k, v, causal=causal, return_lse=True, **features)
    (entry,) = flashgen.api._entries.values()
    assert type(entry.bound) is DenseDecodeLaunch  # the decode route ran, not the forward
    res = check_outputs(o, lse, q, k, v, causal=causal, scale=128**-0.5, dtype="bf16", **features)
    assert res.passed, res
