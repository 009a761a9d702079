"""`flashgen.attention_varlen` on the GPU through PyCUDA (family wgmma, sm_90): NumPy packed
batches against the float64 oracle per sequence (zero-length sequences, Tq != Tk per sequence,
GQA, features, rows after the last sequence), GPUArray inputs equal to the NumPy call's output
bit for bit."""

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


@pytest.fixture(autouse=True)
def _hopper() -> None:
    if runtime.device_arch() != "sm_90":
        pytest.skip("the varlen kernels are family wgmma's (sm_90)")


def make(lens_q: list[int], lens_k: list[int], h: int, h_kv: int, d: int, dtype: str, seed: int,
         slack: int = 0) -> dict[str, Any]:  # fmt: skip
    rng = np.random.default_rng(seed)
    t = NP_TYPES[dtype]
    tq, tk = sum(lens_q) + slack, sum(lens_k) + slack
    return {
        "q": rng.standard_normal((tq, h, d)).astype(t),
        "k": rng.standard_normal((tk, h_kv, d)).astype(t),
        "v": rng.standard_normal((tk, h_kv, d)).astype(t),
        "cu_q": np.array([0, *np.cumsum(lens_q)], np.int32),
        "cu_k": np.array([0, *np.cumsum(lens_k)], np.int32),
        "lens_q": lens_q, "lens_k": lens_k,
    }  # fmt: skip


def assert_matches_oracle(o: np.ndarray, lse: np.ndarray, c: dict[str, Any], causal: bool,
                          dtype: str, **features: Any) -> None:  # fmt: skip
    d = c["q"].shape[-1]
    cq, ck = c["cu_q"], c["cu_k"]
    for s, (nq, nk) in enumerate(zip(c["lens_q"], c["lens_k"], strict=True)):
        if nq == 0:
            continue
        rows = slice(int(cq[s]), int(cq[s]) + nq)
        if nk == 0:  # no key: zeros and -inf
            assert (np.asarray(o[rows], np.float32) == 0).all() and (lse[:, rows] == -np.inf).all()
            continue
        keys = slice(int(ck[s]), int(ck[s]) + nk)
        qs, ks, vs, os_ = (np.ascontiguousarray(x.transpose(1, 0, 2)[None]) for x in (
            c["q"][rows], c["k"][keys], c["v"][keys], o[rows]))  # fmt: skip
        res = check_outputs(os_, np.ascontiguousarray(lse[:, rows][None]), qs, ks, vs,
                            causal=causal, scale=d**-0.5, dtype=dtype, **features)  # fmt: skip
        assert res.passed, (s, nq, nk, res)


CASES = [
    # (lens_q, lens_k (None: = lens_q), h, h_kv, d, dtype, causal)
    ([300, 0, 1, 128, 1000, 77], None, 8, 2, 128, "bf16", True),
    ([5, 700, 33], [900, 700, 2], 6, 3, 64, "fp16", True),
    ([256, 17], [0, 400], 4, 4, 64, "bf16", False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"n{len(c[0])}h{c[2]}/{c[3]}d{c[4]}{c[5]}"
                                                      f"{'c' if c[6] else ''}")
def test_numpy_calls_match_the_oracle(case: tuple[Any, ...]) -> None:
    lens_q, lens_k, h, h_kv, d, dtype, causal = case
    c = make(lens_q, lens_k or lens_q, h, h_kv, d, dtype, seed=sum(lens_q))
    o, lse = flashgen.attention_varlen(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"],
                                       causal=causal, return_lse=True)  # fmt: skip
    assert isinstance(o, np.ndarray) and o.shape == c["q"].shape and o.dtype == c["q"].dtype
    assert_matches_oracle(o, lse, c, causal, dtype)


@pytest.mark.parametrize("features", [{"window": (40, 0)}, {"softcap": 12.0},
                                      {"alibi_slopes": np.linspace(0.05, 0.8, 4,
                                                                   dtype=np.float32)}])  # fmt: skip
def test_features(features: dict[str, Any]) -> None:
    c = make([200, 31, 0, 90], [200, 31, 5, 90], 4, 2, 64, "bf16", seed=4)
    o, lse = flashgen.attention_varlen(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"],
                                       causal=True, return_lse=True, **features)  # fmt: skip
    assert_matches_oracle(o, lse, c, True, "bf16", **features)


def test_rows_after_the_last_sequence_are_zeros() -> None:
    c = make([100, 50], [100, 50], 4, 4, 64, "fp16", seed=2, slack=30)
    o, lse = flashgen.attention_varlen(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"],
                                       return_lse=True)  # fmt: skip
    assert (np.asarray(o[150:], np.float32) == 0).all() and (lse[:, 150:] == -np.inf).all()
    assert_matches_oracle(o, lse, c, False, "fp16")


def test_gpuarrays_give_what_numpy_gives_and_stay_on_the_gpu() -> None:
    c = make([300, 0, 1000, 77], [300, 0, 1000, 77], 8, 2, 128, "bf16", seed=6)
    want_o, want_lse = flashgen.attention_varlen(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"],
                                                 causal=True, return_lse=True)  # fmt: skip
    dev = {n: runtime.to_device(c[n]) for n in ("q", "k", "v", "cu_q", "cu_k")}
    o, lse = flashgen.attention_varlen(dev["q"], dev["k"], dev["v"], dev["cu_q"], dev["cu_k"],
                                       1000, 1000, causal=True, return_lse=True)  # fmt: skip
    assert hasattr(o, "gpudata")
    assert np.array_equal(runtime.to_host(o).view(np.uint16), want_o.view(np.uint16))
    assert np.array_equal(runtime.to_host(lse), want_lse)
