"""`flashgen.attention_with_kvcache` (NumPy / GPUArray): its checks before the GPU, and on a fake
GPU (tests/_fakecuda.py) the decode launch it makes -- pointers, sizes, strides, splits and
scratch -- read back argument by argument as `cuLaunchKernel` would receive them."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import flashgen
from flashgen.generator.spec import KernelSpec
from flashgen.runtime.decode import decode_spec
from flashgen.runtime.gpu import GpuUnavailable

RNG = np.random.default_rng(0)


def cache(b=3, tq=1, h=8, h_kv=2, tk=64, d=64, dtype: Any = np.float16):
    q = RNG.standard_normal((b, tq, h, d)).astype(dtype)
    k, v = (RNG.standard_normal((b, tk, h_kv, d)).astype(dtype) for _ in "kv")
    return q, k, v


def pages(b=3, n_pages=10, page=16, per_seq=4, h_kv=2, d=64):
    k, v = (RNG.standard_normal((n_pages, page, h_kv, d)).astype(np.float16) for _ in "kv")
    table = RNG.permutation(n_pages)[: b * per_seq % n_pages or n_pages]
    table = np.resize(table, (b, per_seq)).astype(np.int32)
    return k, v, table


# ---- without PyCUDA: checked first, then one GpuUnavailable ------------------------------------
@pytest.mark.usefixtures("no_pycuda")
class TestBeforeTheGpu:
    def test_it_is_exported_lazily(self) -> None:
        import flashgen.api_kvcache

        assert flashgen.attention_with_kvcache is flashgen.api_kvcache.attention_with_kvcache
        assert "attention_with_kvcache" in dir(flashgen)

    @pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
    def test_valid_calls_reach_gpu_unavailable(self, dtype: Any) -> None:
        q, k, v = cache(dtype=dtype)
        lens = np.array([64, 0, 17], np.int32)
        for kwargs in ({}, {"causal": True, "window": (8, 0)}, {"softcap": 20.0},
                       {"alibi_slopes": np.linspace(0.1, 1, 8, dtype=np.float32)}):  # fmt: skip
            with pytest.raises(GpuUnavailable):
                flashgen.attention_with_kvcache(q, k, v, lens, **kwargs)
        with pytest.raises(GpuUnavailable):
            flashgen.attention_with_kvcache(q, k, v, 30, return_lse=True)
        kp, vp, table = pages()
        kp, vp = kp.astype(dtype), vp.astype(dtype)
        with pytest.raises(GpuUnavailable):
            flashgen.attention_with_kvcache(q, kp, vp, np.array([64, 1, 33], np.int32),
                                            block_table=table)  # fmt: skip

    @pytest.mark.parametrize(
        "change, match",
        [
            ({"lens": np.array([64, 65, 0], np.int32)},
             r"cache_seqlens\[1\]=65: must be in \[0, 64\] \(the cache's capacity\)"),
            ({"lens": np.array([-1, 3, 0], np.int32)}, r"cache_seqlens\[0\]=-1"),
            ({"lens": np.array([1, 2], np.int32)}, r"cache_seqlens.shape=\(2,\): must be \(3\)"),
            ({"lens": np.array([1, 2, 3], np.int64)}, r"cache_seqlens.dtype=int64: must be int32"),
            ({"lens": 65}, r"cache_seqlens=65: must be an int in \[0, 64\]"),
            ({"q_dtype": np.float32}, r"q.dtype=float32: the decode kernel takes float16"),
            ({"h": 6}, r"H=6, H_kv=4: the query heads must be a multiple of the K/V heads"),
            ({"d_q": 32}, r"k_cache.shape\[-1\]=64, q.shape\[-1\]=32: the head dims must match"),
            ({"b_cache": 2}, r"k_cache.shape\[0\]=2, B=3: a contiguous cache holds one row"),
            ({"scale": float("nan")}, r"scale=nan"),
            ({"causal": 1}, r"causal=1: must be True or False"),
            ({"num_splits": -1}, r"num_splits=-1: must be an int >= 0"),
            ({"spec": "flash_decode"}, r"spec='flash_decode': must be a decode KernelSpec"),
            ({"window": (-5, 0)}, r"window="),
        ],
    )  # fmt: skip
    def test_bad_input_is_one_value_error_before_the_gpu(
        self, change: dict[str, Any], match: str
    ) -> None:
        b = 2 if "b_cache" in change else 3
        h_kv = 4 if "h" in change else 2
        q, k, v = cache(h=change.get("h", 8), h_kv=h_kv, d=change.get("d_q", 64),
                        dtype=change.get("q_dtype", np.float16))  # fmt: skip
        k, v = cache(b=b, h_kv=h_kv)[1:]
        if "q_dtype" in change:
            k, v = k.astype(np.float32), v.astype(np.float32)
        lens = change.get("lens", np.array([64, 3, 0], np.int32))
        kwargs = {n: change[n] for n in ("scale", "causal", "num_splits", "spec", "window")
                  if n in change}  # fmt: skip
        with pytest.raises(ValueError, match=match):
            flashgen.attention_with_kvcache(q, k, v, lens, **kwargs)

    def test_a_page_index_a_sequence_reaches_must_be_a_page(self) -> None:
        q = cache()[0]
        k, v, table = pages()
        table[2, 1] = 10  # n_pages = 10
        lens = np.array([64, 64, 17], np.int32)
        with pytest.raises(ValueError, match=r"block_table\[2, 1\]=10: must be a page index in "
                                             r"\[0, 10\)"):  # fmt: skip
            flashgen.attention_with_kvcache(q, k, v, lens, block_table=table)
        lens[2] = 16  # the bad page is past sequence 2's keys: never read, so accepted
        with pytest.raises(GpuUnavailable):
            flashgen.attention_with_kvcache(q, k, v, lens, block_table=table)
        with pytest.raises(ValueError, match=r"block_table\[2, 1\]=10"):  # whole cache: read
            flashgen.attention_with_kvcache(q, k, v, block_table=table)
        with pytest.raises(GpuUnavailable):  # one int length: pages past it are not read
            flashgen.attention_with_kvcache(q, k, v, 16, block_table=table)

    def test_arrays_of_mixed_kinds_are_refused_by_name(self) -> None:
        from _fakecuda import FakeGPUArray

        q, k, v = cache()
        lens = FakeGPUArray((3,), np.int32, gpudata=0x5000_0000)
        with pytest.raises(ValueError, match=r"cache_seqlens=FakeGPUArray: mixed kinds of arrays"):
            flashgen.attention_with_kvcache(q, k, v, lens)
        with pytest.raises(ValueError, match=r"block_table=list: not an array; pass a NumPy"):
            flashgen.attention_with_kvcache(q, k, v, block_table=[[0]])

    def test_an_unknown_keyword_is_a_type_error(self) -> None:
        with pytest.raises(TypeError, match="unexpected keyword argument 'windw'"):
            flashgen.attention_with_kvcache(*cache(), windw=(1, 1))  # type: ignore[call-arg]


# ---- on a fake GPU: the launch ------------------------------------------------------------------
@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    from _fakecuda import install_libcuda, install_pycuda

    import flashgen.api
    from flashgen import api_kvcache

    calls = install_pycuda(monkeypatch, cc=(9, 0))
    cuda = install_libcuda(monkeypatch)
    cuda.decode_params = True
    monkeypatch.setattr(api_kvcache, "_entries", {})
    monkeypatch.setattr(flashgen.api, "_entries", {})  # the decode route's entries too
    cuda.calls = calls
    return cuda


def device(
    shape: tuple[int, ...], dtype: Any = np.float16, at: int = 0,
    strides: tuple[int, ...] | None = None,
) -> Any:  # fmt: skip
    from _fakecuda import FakeGPUArray

    return FakeGPUArray(shape, dtype, gpudata=at or None, strides=strides)


def test_a_contiguous_call_passes_its_pointers_sizes_and_strides(fake_gpu: Any) -> None:
    b, tq, h, h_kv, tk, d = 2, 3, 8, 2, 4096, 128
    q = device((b, tq, h, d), at=0x1000_0000)
    k = device((b, tk, h_kv, d), at=0x2000_0000)
    v = device((b, tk, h_kv, d), at=0x3000_0000)
    lens = device((b,), np.int32, at=0x4000_0000)
    o, lse = flashgen.attention_with_kvcache(q, k, v, lens, causal=True, return_lse=True)
    (a,) = fake_gpu.decode_launches
    assert (a["q"], a["k"], a["v"], a["cache_seqlens"], a["block_table"]) == (
        0x1000_0000, 0x2000_0000, 0x3000_0000, 0x4000_0000, 0)
    assert (a["o"], a["lse"]) == (o.gpudata, lse.gpudata)
    assert o.shape == (b, tq, h, d) and o.dtype == np.float16 and lse.shape == (b, h, tq)
    assert (a["tq"], a["tk"], a["page_size"], a["n_pages"], a["kv_group"]) == (tq, tk, 1, 0, 4)
    # (batch, head, token) element strides: q and o (B, Tq, H, d), k and v (B, Tk, H_kv, d)
    assert (a["q_sb"], a["q_sh"], a["q_st"]) == (tq * h * d, d, h * d)
    assert (a["k_sb"], a["k_sh"], a["k_st"]) == (tk * h_kv * d, d, h_kv * d)
    assert (a["v_sb"], a["v_sh"], a["v_st"]) == (tk * h_kv * d, d, h_kv * d)
    assert (a["o_sb"], a["o_sh"], a["o_st"]) == (tq * h * d, d, h * d)
    assert math.isclose(a["scale_log2"], 1 / math.sqrt(d) * math.log2(math.e), rel_tol=1e-6)
    spec = decode_spec(d, d, "fp16", True, tq * h // h_kv)
    splits, rows, _ = a["grid"]
    assert rows == h_kv * -(-(tq * h // h_kv) // spec.br) and a["grid"][2] == b
    assert splits > 1  # 2 x 2 row tiles on a 132-SM GPU: the keys are split
    # sm_90: no in-kernel merge (counters NULL); the variant's merge kernel follows on the stream
    assert a["o_part"] and a["lse_part"] and a["counters"] == 0
    assert a["stream"] == 0  # the legacy default stream, in order with PyCUDA's work
    (m,) = fake_gpu.combine_launches
    assert (m["o"], m["lse"], m["o_part"], m["lse_part"]) == (
        a["o"], a["lse"], a["o_part"], a["lse_part"])  # fmt: skip
    assert (m["tq"], m["n_splits"], m["kv_group"]) == (tq, splits, 4)
    assert (m["o_sb"], m["o_sh"], m["o_st"]) == (a["o_sb"], a["o_sh"], a["o_st"])
    assert m["grid"] == (tq * h // h_kv, h_kv, b) and m["block"] == (128, 1, 1)
    assert (m["smem"], m["stream"]) == (0, 0) and m["function"] != a["function"]
    found = [e[1] for e in fake_gpu.log if e[0] == "function"]  # the variant, then its merge
    assert found[-1] == found[-2] + "_combine"
    zeroed = [c for c in fake_gpu.calls.log if c[0] == "memset_d32"]  # still allocated once
    assert len(zeroed) == 1 and zeroed[0][2] == 0


def test_on_sm_90_decode_launches_as_a_programmatic_dependent(fake_gpu: Any) -> None:
    # the kernel waits at griddepcontrol.wait (templates/mma_decode.cu.j2), so the host launches
    # it with PROGRAMMATIC_STREAM_SERIALIZATION (id 6) allowed (1) through cuLaunchKernelEx
    q, k, v = device((1, 1, 8, 128)), device((1, 4096, 1, 128)), device((1, 4096, 1, 128))
    flashgen.attention_with_kvcache(q, k, v, 4096)
    attributes = [e[1] for e in fake_gpu.log if e[0] == "launch_attributes"]
    assert attributes == [((6, 1),), ((6, 1),)]  # the decode kernel, then its merge kernel
    (a,) = fake_gpu.decode_launches  # the same arguments as a plain launch
    assert a["grid"][0] > 1 and a["tk"] == 4096 and a["counters"] == 0
    (m,) = fake_gpu.combine_launches
    assert m["n_splits"] == a["grid"][0] and m["grid"] == (8, 1, 1)


def test_on_sm_90_the_in_kernel_merge_stays_one_switch_away(
    fake_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FLASHGEN_DECODE_COMBINE=0: one launch that merges its splits itself (counters passed);
    # one split: nothing to merge, one launch either way
    monkeypatch.setenv("FLASHGEN_DECODE_COMBINE", "0")
    q, k, v = device((1, 1, 8, 128)), device((1, 4096, 1, 128)), device((1, 4096, 1, 128))
    flashgen.attention_with_kvcache(q, k, v, 4096)
    (a,) = fake_gpu.decode_launches
    assert a["grid"][0] > 1 and a["counters"] and not fake_gpu.combine_launches
    monkeypatch.delenv("FLASHGEN_DECODE_COMBINE")
    flashgen.attention_with_kvcache(q, k, v, 4096, num_splits=1)
    assert fake_gpu.decode_launches[-1]["grid"][0] == 1 and not fake_gpu.combine_launches
    flashgen.attention_with_kvcache(q, k, v, 4096, num_splits=3)
    (m,) = fake_gpu.combine_launches
    assert fake_gpu.decode_launches[-1]["counters"] == 0 and m["n_splits"] == 3


def test_the_decode_kernel_and_its_merge_share_one_context_push(fake_gpu: Any) -> None:
    # another context current on the thread: the plan's is pushed once for both launches and
    # popped after them, so the caller's stays current
    q, k, v = device((1, 1, 8, 128)), device((1, 4096, 1, 128)), device((1, 4096, 1, 128))
    flashgen.attention_with_kvcache(q, k, v, 4096)  # prepared (loads, lookups) first
    fake_gpu.stack.append(0xF00)
    start = len(fake_gpu.log)
    flashgen.attention_with_kvcache(q, k, v, 4096)
    seen = [e[0] for e in fake_gpu.log[start:] if e[0] in ("push", "pop", "launch")]
    assert seen == ["push", "launch", "launch", "pop"] and fake_gpu.stack == [0xF00]
    assert len(fake_gpu.decode_launches) == len(fake_gpu.combine_launches) == 2


def test_a_refused_decode_launch_names_the_kernel_and_skips_its_merge(fake_gpu: Any) -> None:
    q, k, v = device((1, 1, 8, 128)), device((1, 4096, 1, 128)), device((1, 4096, 1, 128))
    fake_gpu.launch_rc = 1  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match=r"kernel \S+ failed \(grid \(\d+, 1, 1\), block \d+"):
        flashgen.attention_with_kvcache(q, k, v, 4096)
    assert len(fake_gpu.decode_launches) == 1 and not fake_gpu.combine_launches
    assert not fake_gpu.stack  # nothing left pushed


def test_with_the_merge_kernel_short_caches_split_finer_in_four_warp_blocks(
    fake_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # B 1, Tk 4096, one K/V head of 8: 256 key tiles. With the merge kernel: the 4-warp variant
    # at 2 tiles a warp (32 splits: 32 blocks, each alone on one of 132 SMs); 32/8 heads (8
    # row tiles) would need 256 blocks at that rate, so they keep 4 tiles a warp (16 splits)
    q, k, v = device((1, 1, 8, 128)), device((1, 4096, 1, 128)), device((1, 4096, 1, 128))
    flashgen.attention_with_kvcache(q, k, v, 4096)
    (a,) = fake_gpu.decode_launches
    assert a["grid"] == (32, 1, 1) and a["block"] == (128, 1, 1)
    q8, k8 = device((1, 1, 32, 128)), device((1, 4096, 8, 128))
    flashgen.attention_with_kvcache(q8, k8, k8, 4096)
    assert fake_gpu.decode_launches[-1]["grid"] == (16, 8, 1)
    # the in-kernel merge: the 8-warp few-blocks variant at 4 tiles per 4 warps (16 splits)
    monkeypatch.setenv("FLASHGEN_DECODE_COMBINE", "0")
    flashgen.attention_with_kvcache(q, k, v, 2048)  # a fresh signature (the env is read once)
    b = fake_gpu.decode_launches[-1]
    assert b["grid"] == (8, 1, 1) and b["block"] == (256, 1, 1)


def test_before_sm_90_decode_launches_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    from _fakecuda import install_libcuda, install_pycuda

    import flashgen.api
    from flashgen import api_kvcache

    install_pycuda(monkeypatch, cc=(8, 0))
    cuda = install_libcuda(monkeypatch)
    cuda.decode_params = True
    monkeypatch.setattr(api_kvcache, "_entries", {})
    monkeypatch.setattr(flashgen.api, "_entries", {})
    q, k, v = device((1, 1, 8, 128)), device((1, 4096, 1, 128)), device((1, 4096, 1, 128))
    flashgen.attention_with_kvcache(q, k, v, 4096)
    assert len(cuda.decode_launches) == 1 and not cuda.combine_launches  # merged in-kernel
    assert cuda.decode_launches[0]["counters"] and cuda.decode_launches[0]["grid"][0] > 1
    assert not [e for e in cuda.log if e[0] == "launch_attributes" and e[1]]  # no PDL


def test_a_paged_call_passes_the_table_and_page_geometry(fake_gpu: Any) -> None:
    b, n_pages, page, per_seq = 3, 40, 16, 8
    q = device((b, 1, 4, 64))
    k, v = device((n_pages, page, 1, 64)), device((n_pages, page, 1, 64))
    table = device((b, per_seq), np.int32, at=0x6000_0000)
    flashgen.attention_with_kvcache(q, k, v, 100, block_table=table, softcap=30.0)
    (a,) = fake_gpu.decode_launches
    assert (a["block_table"], a["cache_seqlens"]) == (0x6000_0000, 0)
    assert (a["tk"], a["page_size"], a["bt_stride"], a["n_pages"]) == (100, page, per_seq,
                                                                       n_pages)  # fmt: skip
    assert (a["k_sb"], a["k_sh"], a["k_st"]) == (page * 64, 0, 64)  # one K/V head: never stepped
    assert math.isclose(a["softcap"], 30.0)


def test_a_signature_is_prepared_once_and_each_call_brings_its_pointers(
    fake_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flashgen import api_kvcache

    prepared = []
    real = api_kvcache._prepare
    monkeypatch.setattr(api_kvcache, "_prepare", lambda *a: prepared.append(1) or real(*a))
    shapes = ((1, 1, 8, 64), (1, 2048, 8, 64), (1, 2048, 8, 64))
    for i in range(3):
        q, k, v = (device(s, at=0x1000_0000 * (j + 1) + 0x100 * i) for j, s in enumerate(shapes))
        flashgen.attention_with_kvcache(q, k, v)
    assert len(prepared) == 1
    assert [a["q"] for a in fake_gpu.decode_launches] == [0x1000_0000, 0x1000_0100, 0x1000_0200]
    flashgen.attention_with_kvcache(q, k, v, num_splits=2)  # another signature
    assert len(prepared) == 2 and fake_gpu.decode_launches[-1]["grid"][0] == 2


def test_numpy_inputs_are_copied_and_run_the_same_launch(fake_gpu: Any) -> None:
    q, k, v = cache(b=2, tq=4, h=8, h_kv=8, tk=256, d=64)
    lens = np.array([256, 100], np.int32)
    o = flashgen.attention_with_kvcache(q, k, v, lens, causal=True)
    assert isinstance(o, np.ndarray) and o.shape == (2, 4, 8, 64) and o.dtype == np.float16
    (a,) = fake_gpu.decode_launches
    assert a["cache_seqlens"] != 0 and (a["tq"], a["tk"], a["kv_group"]) == (4, 256, 1)
    copies = [c for c in fake_gpu.calls.log if c[0] == "htod"]
    assert len(copies) == 4  # q, k, v and the lengths
    assert ("synchronize",) in fake_gpu.calls.log


def test_a_chosen_spec_must_be_a_matching_decode_variant(fake_gpu: Any) -> None:
    q, k, v = device((1, 1, 8, 64)), device((1, 512, 8, 64)), device((1, 512, 8, 64))
    want = decode_spec(64, 64, "fp16", False, 1)
    flashgen.attention_with_kvcache(q, k, v, spec=want)
    other = KernelSpec(family="mma", direction="decode", d=64, dv=64, dtype="bf16", br=16, bc=16)
    with pytest.raises(ValueError, match=r"must be a decode KernelSpec for d=64, dv=64, "
                                         r"dtype=fp16, causal=False"):  # fmt: skip
        flashgen.attention_with_kvcache(q, k, v, spec=other)


def test_device_slopes_must_be_a_device_array(fake_gpu: Any) -> None:
    q, k, v = device((1, 1, 8, 64)), device((1, 512, 8, 64)), device((1, 512, 8, 64))
    with pytest.raises(ValueError, match=r"alibi_slopes=ndarray: with device inputs pass it as"):
        flashgen.attention_with_kvcache(q, k, v, alibi_slopes=np.ones(8, np.float32))
    slopes = device((8,), np.float32, at=0x7000_0000)
    flashgen.attention_with_kvcache(q, k, v, alibi_slopes=slopes)
    assert fake_gpu.decode_launches[-1]["alibi_slopes"] == 0x7000_0000


class CaiSlopes:
    """(H,) float32 slopes seen only through the CUDA array interface (CuPy-like: no gpudata)."""

    def __init__(self, heads: int, ptr: int, stream: int | None = None) -> None:
        self.__cuda_array_interface__ = {
            "shape": (heads,), "strides": None, "typestr": "<f4", "data": (ptr, False),
            "version": 3, "stream": stream,
        }  # fmt: skip


def small_call() -> tuple[Any, Any, Any]:
    return device((1, 1, 8, 64)), device((1, 512, 8, 64)), device((1, 512, 8, 64))


def test_a_cuda_array_slopes_pointer_is_read_every_call_and_its_stream_waited_for(
    fake_gpu: Any,
) -> None:
    q, k, v = small_call()
    flashgen.attention_with_kvcache(q, k, v, alibi_slopes=CaiSlopes(8, 0x7000_0000))
    flashgen.attention_with_kvcache(q, k, v, alibi_slopes=CaiSlopes(8, 0x7100_0000, stream=77))
    assert [a["alibi_slopes"] for a in fake_gpu.decode_launches] == [0x7000_0000, 0x7100_0000]
    records = [c for c in fake_gpu.log if c[0] == "event_record"]
    assert len(records) == 1 and records[0][2] == 77  # the producer's stream, then waited on


def test_slopes_that_are_not_an_array_are_a_value_error_not_a_crash(fake_gpu: Any) -> None:
    with pytest.raises(ValueError, match=r"alibi_slopes"):
        flashgen.attention_with_kvcache(*small_call(), alibi_slopes=[0.1] * 8)


def test_bools_are_refused_even_after_an_equal_int_was_remembered(fake_gpu: Any) -> None:
    q, k, v = small_call()
    flashgen.attention_with_kvcache(q, k, v, 1, scale=1.0)
    with pytest.raises(ValueError, match=r"cache_seqlens=True: must be an int32"):
        flashgen.attention_with_kvcache(q, k, v, True, scale=1.0)
    with pytest.raises(ValueError, match=r"scale=True: must be a real number, not a bool"):
        flashgen.attention_with_kvcache(q, k, v, 1, scale=True)


def test_an_empty_cache_runs_with_a_null_pointer(fake_gpu: Any) -> None:
    q, k, v = device((2, 1, 8, 64)), device((2, 0, 8, 64)), device((2, 0, 8, 64))
    k.gpudata = v.gpudata = None  # PyCUDA's zero-size arrays own no memory
    flashgen.attention_with_kvcache(q, k, v)
    (a,) = fake_gpu.decode_launches
    assert (a["k"], a["v"], a["tk"]) == (0, 0, 0)


# ---- flashgen.attention's decode route (runtime/dense_decode.py) -------------------------------
def test_a_dense_call_with_few_query_rows_runs_the_decode_kernel(fake_gpu: Any) -> None:
    b, h, h_kv, tq, tk, d = 2, 8, 2, 1, 4096, 64
    q = device((b, h, tq, d), at=0x1000_0000)
    k, v = device((b, h_kv, tk, d), at=0x2000_0000), device((b, h_kv, tk, d), at=0x3000_0000)
    o, lse = flashgen.attention(q, k, v, return_lse=True, softcap=20.0)
    (a,) = fake_gpu.decode_launches
    assert (a["q"], a["k"], a["v"], a["o"], a["lse"]) == (
        0x1000_0000, 0x2000_0000, 0x3000_0000, o.gpudata, lse.gpudata)  # fmt: skip
    assert (a["cache_seqlens"], a["block_table"], a["tk"], a["tq"], a["kv_group"]) == (
        0, 0, tk, tq, h // h_kv)  # fmt: skip
    # (batch, head, token) element strides of the (B, H, T, d) arrays, O contiguous like them
    assert (a["q_sb"], a["q_sh"]) == (h * tq * d, tq * d)
    assert (a["k_sb"], a["k_sh"], a["k_st"]) == (h_kv * tk * d, tk * d, d)
    assert (a["o_sb"], a["o_sh"]) == (h * tq * d, tq * d)
    assert o.shape == (b, h, tq, d) and lse.shape == (b, h, tq)
    assert math.isclose(a["softcap"], 20.0)


def test_calls_the_decode_kernel_does_not_serve_stay_on_the_forward(fake_gpu: Any) -> None:
    from flashgen.generator.features import NO_FEATURES
    from flashgen.runtime.dense_decode import dense_decode

    def route(tq: int, tk: int, dtype: Any = np.float16, d: int = 64) -> Any:
        q, k = device((1, 4, tq, d), dtype), device((1, 4, tk, d), dtype)
        return dense_decode(q, k, k, False, 1.0, NO_FEATURES)

    assert route(1, 4096) is not None
    assert route(17, 4096) is None  # enough query rows for the forward's tiles
    assert route(1, 255) is None  # too few keys to split
    assert route(1, 4096, np.float32) is None  # no fp32 decode variant
    q = device((1, 4, 1, 64), strides=(4 * 72 * 2, 72 * 2, 72 * 2, 2))  # rows 144 B apart
    assert dense_decode(q, device((1, 4, 4096, 64)), device((1, 4, 4096, 64)), False, 1.0,
                        NO_FEATURES) is not None  # fmt: skip
    k = device((1, 4, 4096, 64), strides=(4 * 4096 * 68 * 2, 4096 * 68 * 2, 68 * 2, 2))
    assert dense_decode(device((1, 4, 1, 64)), k, k, False, 1.0, NO_FEATURES) is None  # 136 B


def test_a_remembered_dense_call_still_refuses_a_bool_scale(fake_gpu: Any) -> None:
    q, k = device((1, 8, 1, 64)), device((1, 8, 512, 64))
    flashgen.attention(q, k, k, scale=1.0)
    with pytest.raises(ValueError, match=r"scale=True: must be a real number, not a bool"):
        flashgen.attention(q, k, k, scale=True)
