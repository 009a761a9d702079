"""`flashgen.attention` on the GPU: NumPy and GPUArray inputs, strided views, LSE, selection."""

from __future__ import annotations

import threading
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import flashgen
from flashgen.generator.select import arch_major, select
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.verify.checks import check_variant
from flashgen.verify.oracle import check_outputs

pytestmark = pytest.mark.gpu

NP_TYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def rand(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(NP_TYPES[dtype])


def qkv(dtype: str, b: int = 2, h: int = 3, tq: int = 77, tk: int = 130, d: int = 64):
    return (
        rand((b, h, tq, d), dtype, 1),
        rand((b, h, tk, d), dtype, 2),
        rand((b, h, tk, d), dtype, 3),
    )


def assert_correct(o: Any, lse: Any, q, k, v, *, causal: bool, scale: float, dtype: str) -> None:
    out = check_outputs(
        np.asarray(o), np.asarray(lse), q, k, v, causal=causal, scale=scale, dtype=dtype
    )
    assert out.passed, out


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", [(77, 130), (130, 77), (1, 1)])
def test_numpy_in_numpy_out(dtype: str, causal: bool, tq: int, tk: int) -> None:
    q, k, v = qkv(dtype, tq=tq, tk=tk)
    o, lse = flashgen.attention(q, k, v, causal=causal, return_lse=True)
    assert isinstance(o, np.ndarray) and o.dtype == q.dtype and o.shape == q.shape
    assert isinstance(lse, np.ndarray) and lse.dtype == np.float32 and lse.shape == q.shape[:3]
    assert_correct(o, lse, q, k, v, causal=causal, scale=64**-0.5, dtype=dtype)


def test_gpuarray_in_gpuarray_out() -> None:
    q, k, v = qkv("bf16")
    dq, dk, dv = (runtime.to_device(x) for x in (q, k, v))
    o, lse = flashgen.attention(dq, dk, dv, return_lse=True)
    assert not isinstance(o, np.ndarray) and hasattr(o, "gpudata")
    assert o.shape == q.shape and o.dtype == q.dtype
    assert_correct(runtime.to_host(o), runtime.to_host(lse), q, k, v, causal=False,
                   scale=0.125, dtype="bf16")  # fmt: skip
    np.testing.assert_array_equal(runtime.to_host(dq).view(np.uint16), q.view(np.uint16))


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("pad", [8, 1])  # 8: mma-aligned strides, 1: only simt can take them
def test_strided_gpuarray_views(dtype: str, pad: int) -> None:
    # A (B, T, H, d + pad) buffer viewed as (B, H, T, d) from token 5 on: every stride is odd.
    b, h, t, d = 2, 3, 90, 64
    host = rand((b, t + 5, h, d + pad), dtype, 7)
    dev = runtime.to_device(host)
    view = dev[:, 5:, :, :d].transpose((0, 2, 1, 3))
    want = host[:, 5:, :, :d].transpose(0, 2, 1, 3)
    assert view.shape == want.shape == (b, h, t, d)
    o, lse = flashgen.attention(view, view, view, causal=True, scale=0.2, return_lse=True)
    assert_correct(runtime.to_host(o), runtime.to_host(lse), want, want, want, causal=True,
                   scale=0.2, dtype=dtype)  # fmt: skip


def test_numpy_strided_views_are_copied() -> None:
    q, k, v = qkv("fp16", tq=150, tk=160)
    q, k, v = q[:, ::2, ::2], k[:, ::2, 1::2], v[:, ::2, 1::2]  # every head and token stride odd
    o, lse = flashgen.attention(q, k, v, causal=True, return_lse=True)
    assert_correct(o, lse, q, k, v, causal=True, scale=0.125, dtype="fp16")


def test_rows_that_see_no_key_give_zeros_and_minus_inf() -> None:
    q, k, v = qkv("bf16", tq=100, tk=30)
    o, lse = flashgen.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(o[:, :, :70].astype(np.float32) == 0)
    assert np.all(np.isneginf(lse[:, :, :70])) and np.all(np.isfinite(lse[:, :, 70:]))


def test_scale_is_honoured() -> None:
    q, k, v = qkv("fp32")
    o, lse = flashgen.attention(q, k, v, scale=0.37, return_lse=True)
    assert_correct(o, lse, q, k, v, causal=False, scale=0.37, dtype="fp32")


@pytest.mark.parametrize("dtype,family", [("bf16", "mma"), ("fp16", "mma"), ("fp32", "simt")])
def test_spec_none_runs_the_selected_variant(dtype: str, family: str) -> None:
    q, k, v = qkv(dtype)
    arch = runtime.device_arch()
    spec = select(64, dtype, True, arch, gpu_name=runtime.device_name())
    if family == "mma" and arch_major(arch) == 9:
        family = "wgmma"  # Hopper runs the wgmma family by default
    assert spec.family == family
    auto = flashgen.attention(q, k, v, causal=True)
    explicit = flashgen.attention(q, k, v, causal=True, spec=spec)
    np.testing.assert_array_equal(auto.view(np.uint8), explicit.view(np.uint8))


def test_a_given_spec_is_used_and_checked() -> None:
    q, k, v = qkv("bf16")
    spec = KernelSpec(family="simt", d=64, br=16, bc=64, dtype="bf16", causal=False)
    o, lse = flashgen.attention(q, k, v, spec=spec, return_lse=True)
    assert_correct(o, lse, q, k, v, causal=False, scale=0.125, dtype="bf16")
    with pytest.raises(ValueError, match="compiled for d=64"):
        flashgen.attention(*qkv("bf16", d=128), spec=spec)
    with pytest.raises(ValueError, match="compiled with causal=False"):
        flashgen.attention(q, k, v, spec=spec, causal=True)


def test_misaligned_views_are_refused_by_mma_before_launch() -> None:
    host = rand((1, 40, 2, 65), "fp16", 3)
    view = runtime.to_device(host)[:, :, :, :64].transpose((0, 2, 1, 3))  # token stride 130
    mma = next(s for s in shipped("mma") if s.d == 64 and s.dtype == "fp16" and not s.causal)
    with pytest.raises(ValueError, match="family mma needs multiples of 8"):
        flashgen.attention(view, view, view, spec=mma)


def test_variants_above_48_kib_of_shared_memory_launch() -> None:
    big = max(shipped(), key=lambda s: s.smem_bytes)
    assert big.smem_bytes > 48 * 1024
    result = check_variant(big, b=1, h=2, tq=big.br * 2 + 3, tk=300, seed=1)
    assert result.passed, result.describe()


def test_bf16_round_trips_bit_exactly() -> None:
    x = rand((2, 3, 5, 16), "bf16", 4)
    np.testing.assert_array_equal(
        runtime.to_host(runtime.to_device(x)).view(np.uint16), x.view(np.uint16)
    )


def test_calls_from_another_thread_use_the_same_context() -> None:
    q, k, v = qkv("fp16")
    main = flashgen.attention(q, k, v)
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(flashgen.attention(q, k, v)))
    worker.start()
    worker.join()
    np.testing.assert_array_equal(out[0].view(np.uint16), main.view(np.uint16))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_features_on_numpy_inputs_match_the_oracle(dtype: str) -> None:
    """flashgen.attention with GQA, a window (both sides), softcap and ALiBi at d = 40."""
    rng = np.random.default_rng(3)
    store = {"bf16": ml_dtypes.bfloat16, "fp32": np.float32}[dtype]
    q = rng.standard_normal((1, 4, 97, 40)).astype(store)
    k, v = (rng.standard_normal((1, 2, 131, 40)).astype(store) for _ in "kv")
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    kw = {"window": (20, 7), "softcap": 15.0, "alibi_slopes": slopes}
    o, lse = flashgen.attention(q, k, v, return_lse=True, **kw)
    out = check_outputs(o, lse, q, k, v, causal=False, scale=40**-0.5, dtype=dtype, **kw)
    assert out.passed, out


@pytest.mark.parametrize(("d", "dv"), [(192, 128), (64, 128), (80, 40)])
def test_v_with_a_head_dim_of_its_own_matches_the_oracle(d: int, dv: int) -> None:
    """O has v's head dim; the selected variant (wgmma on Hopper when dv <= d) computes it."""
    rng = np.random.default_rng(d + dv)
    q = rng.standard_normal((2, 4, 133, d)).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((2, 2, 151, d)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((2, 2, 151, dv)).astype(ml_dtypes.bfloat16)
    o, lse = flashgen.attention(q, k, v, causal=True, return_lse=True)
    assert o.shape == (2, 4, 133, dv)
    out = check_outputs(o, lse, q, k, v, causal=True, scale=d**-0.5, dtype="bf16")
    assert out.passed, out


def test_alibi_slope_views_at_one_pointer_are_checked_on_every_call() -> None:
    """The GPUArray signature cache keyed the slopes by pointer alone: after one valid call,
    a strided, shorter or float64 array at that pointer ran unchecked (wrong values, reads past
    the end, float64 bits read as float32). Each call now gives the right answer or a clear
    error."""
    from pycuda import gpuarray

    q, k, v = qkv("bf16", b=1, h=4, tq=97, tk=131)
    dq, dk, dv = (runtime.to_device(x) for x in (q, k, v))
    host = np.array([0.5, 0.0, 0.25, 0.0, 0.125, 0.0, 0.0625, 0.0], np.float32)
    wide = runtime.to_device(host)
    first = wide[:4]

    def check(slopes: Any, values: np.ndarray) -> None:
        o, lse = flashgen.attention(dq, dk, dv, alibi_slopes=slopes, return_lse=True)
        out = check_outputs(runtime.to_host(o), runtime.to_host(lse), q, k, v, causal=False,
                            scale=64**-0.5, dtype="bf16", alibi_slopes=values)  # fmt: skip
        assert out.passed, out

    check(first, host[:4])
    check(first, host[:4])  # the remembered signature
    with pytest.raises(ValueError, match="must be contiguous"):
        flashgen.attention(dq, dk, dv, alibi_slopes=wide[::2])
    with pytest.raises(ValueError, match=r"alibi_slopes.shape=\(1,\): must be \(4,\)"):
        flashgen.attention(dq, dk, dv, alibi_slopes=wide[:1])
    as_f64 = gpuarray.GPUArray((4,), np.float64, gpudata=wide.gpudata)  # the same pointer
    with pytest.raises(ValueError, match=r"alibi_slopes.dtype=float64: must be float32"):
        flashgen.attention(dq, dk, dv, alibi_slopes=as_f64)
    check(runtime.to_device(host[::2]), host[::2])


# ---- hooks (score_mod / mask_mod with aux values) ----------------------------------------------
def test_hooked_numpy_and_gpuarray_calls_match_the_oracle() -> None:
    from flashgen.generator.features.hook import HookCall
    from flashgen.generator.hooks import library

    doc, cap = library.document_hook(), library.softcap_hook()
    q, k, v = qkv("bf16", tq=300, tk=300)
    t = q.shape[2]
    for docs in (3, 7, 1):  # one signature: each call's own table (and summary)
        ids = np.sort(np.random.default_rng(docs).integers(0, docs, t)).astype(np.int32)
        kw = {
            "mask_mod": HookCall(doc, {"doc_ids": ids}),
            "score_mod": HookCall(cap, {"softcap": 15.0}),
        }
        hooks = {"mask_mod": doc, "score_mod": cap}
        o, lse = flashgen.attention(
            q, k, v, aux={"doc_ids": ids, "softcap": 15.0}, return_lse=True, **hooks
        )  # fmt: skip
        out = check_outputs(o, lse, q, k, v, causal=False, scale=64**-0.5, dtype="bf16", **kw)
        assert out.passed, (docs, out)
        dq, dk, dv, dids = (runtime.to_device(x) for x in (q, k, v, ids))
        og, lg = flashgen.attention(
            dq, dk, dv, aux={"doc_ids": dids, "softcap": 15.0}, return_lse=True, **hooks
        )  # fmt: skip
        host = (runtime.to_host(og), runtime.to_host(lg))
        out = check_outputs(*host, q, k, v, causal=False, scale=64**-0.5, dtype="bf16", **kw)
        assert out.passed, (docs, out)
