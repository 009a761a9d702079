"""`flashgen.attention_varlen` (NumPy / GPUArray): its checks before the GPU, and on a fake
Hopper GPU (tests/_fakecuda.py) the varlen forward launch it makes, read back argument by
argument as `cuLaunchKernel` would receive them."""

from __future__ import annotations

import ctypes
import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import flashgen
from flashgen.runtime.gpu import GpuUnavailable

RNG = np.random.default_rng(0)


def packed(total_q=300, total_k=None, h=4, h_kv=2, d=64, dtype: Any = np.float16):
    total_k = total_q if total_k is None else total_k
    q = RNG.standard_normal((total_q, h, d)).astype(dtype)
    k, v = (RNG.standard_normal((total_k, h_kv, d)).astype(dtype) for _ in "kv")
    return q, k, v


CU = np.array([0, 100, 100, 300], np.int32)  # three sequences, the middle one empty


# ---- without PyCUDA: checked first, then one GpuUnavailable ------------------------------------
@pytest.mark.usefixtures("no_pycuda")
class TestBeforeTheGpu:
    def test_it_is_exported_lazily(self) -> None:
        import flashgen.api_varlen

        assert flashgen.attention_varlen is flashgen.api_varlen.attention_varlen

    @pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
    def test_valid_calls_reach_gpu_unavailable(self, dtype: Any) -> None:
        q, k, v = packed(dtype=dtype)
        for kwargs in ({}, {"causal": True, "window": (32, 0)}, {"softcap": 20.0},
                       {"alibi_slopes": np.linspace(0.1, 1, 4, dtype=np.float32)},
                       {"max_seqlen_q": 200, "max_seqlen_k": 200}):  # fmt: skip
            with pytest.raises(GpuUnavailable):
                flashgen.attention_varlen(q, k, v, CU, CU, **kwargs)
        q2, k2, v2 = packed(total_q=5, total_k=900, dtype=dtype)
        with pytest.raises(GpuUnavailable):  # fewer query rows than keys, padding rows after
            cu_q, cu_k = np.array([0, 2, 4], np.int32), np.array([0, 450, 900], np.int32)
            flashgen.attention_varlen(q2, k2, v2, cu_q, cu_k, return_lse=True)

    @pytest.mark.parametrize(
        "cu_q, cu_k, match",
        [
            ([1, 100, 100, 300], None, r"cu_seqlens_q\[0\]=1: must be 0"),
            ([0, 200, 100, 300], None, r"cu_seqlens_q\[2\]=100 < cu_seqlens_q\[1\]=200: prefix "
                                       r"sums never decrease"),
            ([0, 100, 100, 301], None, r"cu_seqlens_q\[-1\]=301: past the 300 packed rows"),
            (None, [0, 100, 100, 301], r"cu_seqlens_k\[-1\]=301: past the 300 packed rows"),
            (None, [-1, 100, 100, 300], r"cu_seqlens_k\[0\]=-1: must be >= 0"),
            (None, [0, 100, 300], r"cu_seqlens_k.shape=\(3,\): must be \(4\)"),
            ([[0, 300]], None, r"cu_seqlens_q.shape=\(1, 2\): must be \(n_seqs \+ 1,\)"),
        ],
    )  # fmt: skip
    def test_bad_prefix_sums_are_one_value_error(self, cu_q: Any, cu_k: Any, match: str) -> None:
        q, k, v = packed()
        cq = CU if cu_q is None else np.array(cu_q, np.int32)
        ck = CU if cu_k is None else np.array(cu_k, np.int32)
        with pytest.raises(ValueError, match=match):
            flashgen.attention_varlen(q, k, v, cq, ck)

    def test_other_bad_input_is_one_value_error(self) -> None:
        q, k, v = packed()
        with pytest.raises(ValueError, match=r"cu_seqlens_q.dtype=int64: must be int32"):
            flashgen.attention_varlen(q, k, v, CU.astype(np.int64), CU)
        with pytest.raises(ValueError, match=r"q.shape=\(1, 300, 4, 64\): must be 3-D"):
            flashgen.attention_varlen(q[None], k, v, CU, CU)
        with pytest.raises(ValueError, match=r"max_seqlen_q=-1: must be an int in \[0, 2\^31\)"):
            flashgen.attention_varlen(q, k, v, CU, CU, max_seqlen_q=-1)
        with pytest.raises(ValueError, match=r"causal='yes': must be True or False"):
            flashgen.attention_varlen(q, k, v, CU, CU, causal="yes")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"spec='x': must be a forward KernelSpec"):
            flashgen.attention_varlen(q, k, v, CU, CU, spec="x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"dtype"):
            flashgen.attention_varlen(*packed(dtype=np.float64), CU, CU)
        with pytest.raises(ValueError, match=r"cu_seqlens_k=list: not an array"):
            flashgen.attention_varlen(q, k, v, CU, [0, 300])
        with pytest.raises(TypeError, match="unexpected keyword argument 'windw'"):
            flashgen.attention_varlen(q, k, v, CU, CU, windw=(1, 1))  # type: ignore[call-arg]


# ---- on a fake Hopper GPU: the launch ----------------------------------------------------------
class Blob(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 128)]


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    """sm_90 through the fake driver; wgmma's tensor-map prefix replaced by three blobs that
    record the problem's pointers (the fake driver encodes no tensor maps)."""
    from _fakecuda import install_libcuda, install_pycuda

    from flashgen import api_varlen
    from flashgen.runtime import launch
    from flashgen.runtime.prefix import PrefixRegistry

    calls = install_pycuda(monkeypatch, cc=(9, 0))
    cuda = install_libcuda(monkeypatch)
    cuda.prefix_sizes = [128, 128, 128]
    cuda.calls, cuda.maps = calls, []
    monkeypatch.setattr(api_varlen, "_entries", {})
    monkeypatch.setattr(
        launch, "_prefixes", PrefixRegistry(launch.POINTERS, launch.PREFIX_PROVIDERS, "kernels")
    )

    def maps(spec: Any, problem: Any) -> list[Any]:
        cuda.maps.append((problem.q_ptr, problem.k_ptr, problem.v_ptr, problem.tq, problem.tk))
        return [Blob(), Blob(), Blob()]

    launch.register_prefix_args("wgmma", maps, uses=("q", "k", "v"))
    return cuda


def device(shape: tuple[int, ...], dtype: Any = np.float16, at: int = 0) -> Any:
    from _fakecuda import FakeGPUArray

    return FakeGPUArray(shape, dtype, gpudata=at or None)


def test_a_gpuarray_call_launches_the_varlen_forward_with_its_sequences(fake_gpu: Any) -> None:
    tq, tk, h, h_kv, d = 1000, 3000, 8, 2, 128
    q = device((tq, h, d), at=0x1000_0000)
    k, v = device((tk, h_kv, d), at=0x2000_0000), device((tk, h_kv, d), at=0x3000_0000)
    cu_q = device((4,), np.int32, at=0x4000_0000)
    cu_k = device((4,), np.int32, at=0x5000_0000)
    o, lse = flashgen.attention_varlen(q, k, v, cu_q, cu_k, 600, 2000, causal=True,
                                       return_lse=True)  # fmt: skip
    (a,) = fake_gpu.launches
    assert a.ptrs == (0x1000_0000, 0x2000_0000, 0x3000_0000, o.gpudata, lse.gpudata)
    from flashgen.runtime import gpu as runtime

    counter = int(runtime.decode_counters(2).gpudata)  # the tile scheduler's zeroed words
    assert a.varlen == (0x4000_0000, 0x5000_0000, 3, counter)
    assert (a.tq, a.tk, a.kv_group, a.stream) == (tq, tk, 4, 0)
    # (batch, head, token) element strides of the (1, H, total, d) views; batch never stepped
    q_st, k_st = h * d, h_kv * d
    assert a.strides[1:3] == (d, q_st) and a.strides[4:6] == (d, k_st)
    assert a.strides[7:9] == (d, k_st) and a.strides[10:12] == (d, q_st)
    assert math.isclose(a.scale_log2, d**-0.5 * math.log2(math.e), rel_tol=1e-6)
    assert o.shape == (tq, h, d) and lse.shape == (h, tq) and lse.dtype == np.float32
    assert fake_gpu.maps == [(0x1000_0000, 0x2000_0000, 0x3000_0000, tq, tk)]
    (name,) = [c[1] for c in fake_gpu.calls.log if c[0] == "compile"]
    assert name.startswith("flash_fwd_wgmma_d128_") and "_causal_varlen_" in name


def test_a_signature_is_prepared_once(fake_gpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from flashgen import api_varlen

    prepared = []
    real = api_varlen._prepare
    monkeypatch.setattr(api_varlen, "_prepare", lambda *a: prepared.append(1) or real(*a))
    for i in range(3):
        q, k, v = (device(s, at=0x1000_0000 * (j + 1) + 0x100 * i)
                   for j, s in enumerate(((500, 4, 64), (500, 4, 64), (500, 4, 64))))  # fmt: skip
        cu = device((3,), np.int32, at=0x4000_0000 + 0x100 * i)
        flashgen.attention_varlen(q, k, v, cu, cu, 300, 300)
    assert len(prepared) == 1
    assert [c.varlen[0] for c in fake_gpu.launches] == [0x4000_0000, 0x4000_0100, 0x4000_0200]


def test_the_scheduler_counter_is_zeroed_once_and_reused_without_a_per_call_step(
    fake_gpu: Any,
) -> None:
    """The varlen kernel counts its dynamic items in two words that must be zero at launch: the
    runtime's kernel-restored zeros (memset once, when first allocated), the same words every
    call on the legacy stream, no memset nor synchronization per call."""
    for i in range(3):
        q, k, v = (device((500, 4, 64), at=0x1000_0000 * (j + 1) + 0x100 * i) for j in range(3))
        cu = device((3,), np.int32, at=0x4000_0000 + 0x100 * i)
        flashgen.attention_varlen(q, k, v, cu, cu, 300, 300)
    counters = {a.varlen[3] for a in fake_gpu.launches}
    assert len(counters) == 1 and counters != {0}
    (counter,) = counters
    # zeroed once, where the words lie (1024 of them: the decode kernel shares the buffer)
    memsets = [c for c in fake_gpu.calls.log if c[0] == "memset_d32"]
    assert memsets == [("memset_d32", counter, 0, 1024)]
    assert ("synchronize",) not in fake_gpu.calls.log


def test_a_varlen_bound_launch_refuses_to_run_without_its_counter(fake_gpu: Any) -> None:
    from flashgen import api_varlen

    q, k, v = (device((500, 4, 64)) for _ in "qkv")
    cu = device((3,), np.int32)
    flashgen.attention_varlen(q, k, v, cu, cu, 300, 300)
    (entry,) = api_varlen._entries.values()
    words = r"two zeroed int32 words for its scheduler \(counter=; got 0x0\)"
    with pytest.raises(ValueError, match=words):
        entry.bound(1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 0, 1 << 20, 1 << 20)
    with pytest.raises(ValueError, match=r"counter=; got 0x100002"):
        entry.bound(1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 0, 1 << 20, 1 << 20,
                    counter=0x100002)  # fmt: skip
    assert len(fake_gpu.launches) == 1  # neither reached the driver


def test_numpy_inputs_are_copied_and_run_the_same_launch(fake_gpu: Any) -> None:
    q, k, v = packed(total_q=300, h=4, h_kv=4, d=64)
    o, lse = flashgen.attention_varlen(q, k, v, CU, CU, return_lse=True, softcap=10.0)
    assert isinstance(o, np.ndarray) and o.shape == (300, 4, 64) and lse.shape == (4, 300)
    (a,) = fake_gpu.launches
    assert a.varlen is not None and a.varlen[2] == 3 and a.softcap == pytest.approx(10.0)
    assert len([c for c in fake_gpu.calls.log if c[0] == "htod"]) == 5  # q, k, v, 2 prefix sums
    assert ("synchronize",) in fake_gpu.calls.log


def test_a_chosen_spec_must_be_a_varlen_variant(fake_gpu: Any) -> None:
    from flashgen.generator.spec import KernelSpec

    q, k, v = (device((500, 4, 64)) for _ in "qkv")
    cu = device((3,), np.int32)
    plain = KernelSpec(family="wgmma", d=64, br=128, bc=128, dtype="fp16", stages=2)
    with pytest.raises(ValueError, match=r"not a varlen variant; add 'varlen' to its features"):
        flashgen.attention_varlen(q, k, v, cu, cu, spec=plain)
    with pytest.raises(ValueError, match=r"max_seqlen_q=501: longer than the 500 packed tokens"):
        flashgen.attention_varlen(q, k, v, cu, cu, 501, 10)


# ---- the real tensor-map prefix: O's map over the packed rows (O_TMA_STORE) --------------------
class RecordingEncoder:
    """libcuda's cuTensorMapEncodeTiled as tma.encode calls it: it writes what it was given into
    the map's opaque words (0: base, 1-4: dims, 5-7: byte strides, 8-11: box, 12: data type),
    so a launch's tensor-map arguments read back as the maps encoded."""

    @staticmethod
    def cuTensorMapEncodeTiled(tmap: Any, dtype: int, rank: int, ptr: Any, dims: Any,
                               strides: Any, box: Any, *rest: Any) -> int:  # fmt: skip
        words = tmap._obj.opaque
        words[0] = ptr.value
        for i in range(4):
            words[1 + i], words[8 + i] = dims[i], box[i]
        for i in range(3):
            words[5 + i] = strides[i]
        words[12] = dtype
        return 0


def test_a_varlen_o_tma_launch_passes_o_map_over_the_packed_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from collections import OrderedDict

    from _fakecuda import install_libcuda, install_pycuda

    from flashgen import api_varlen
    from flashgen.generator.families.wgmma import WGMMA
    from flashgen.generator.spec import KernelSpec
    from flashgen.runtime import launch, tma
    from flashgen.runtime.prefix import PrefixRegistry

    calls = install_pycuda(monkeypatch, cc=(9, 0))
    cuda = install_libcuda(monkeypatch)
    cuda.prefix_sizes = [128, 128, 128, 128, 4, 4]  # tm_q, tm_k, tm_v, tm_o, heads, batch
    monkeypatch.setattr(api_varlen, "_entries", {})
    monkeypatch.setattr(tma, "_libcuda", lambda: RecordingEncoder)
    monkeypatch.setattr(tma, "_maps", OrderedDict())
    monkeypatch.setattr(tma, "_o_maps", OrderedDict())
    monkeypatch.setattr(
        launch, "_prefixes", PrefixRegistry(launch.POINTERS, launch.PREFIX_PROVIDERS, "kernels")
    )
    launch.register_prefix_args("wgmma", tma.prefix_args, uses=("q", "k", "v", "o"))
    tq, tk, h, h_kv, d = 1000, 3000, 8, 2, 128
    q = device((tq, h, d), at=0x1000_0000)
    k, v = device((tk, h_kv, d), at=0x2000_0000), device((tk, h_kv, d), at=0x3000_0000)
    cu_q = device((4,), np.int32, at=0x4000_0000)
    cu_k = device((4,), np.int32, at=0x5000_0000)
    o = flashgen.attention_varlen(q, k, v, cu_q, cu_k, 600, 2000, causal=True)
    (name,) = [c[1] for c in calls.log if c[0] == "compile"]
    assert "_varlen_" in name and WGMMA.o_tma_store(KernelSpec.from_name(name))
    (a,) = cuda.launches
    q_map, _, _, o_map = (np.frombuffer(blob, np.uint64).tolist() for blob in a.prefix[:4])
    heads, batch = (int.from_bytes(blob, "little", signed=True) for blob in a.prefix[4:])
    assert (heads, batch) == (h, 1)  # the packed tensors are one batch
    # O's map: the output's base, (d, total_q, H, 1) as Q's, O's own byte strides (token H*d,
    # head d; the batch axis of extent 1 takes the packed stride), boxes of 64 rows by 64
    itemsize = 2
    assert o_map[0] == o.gpudata == a.ptrs[3]
    assert o_map[1:5] == q_map[1:5] == [d, tq, h, 1]
    assert o_map[5:8] == [h * d * itemsize, d * itemsize, h * d * itemsize]
    assert o_map[8:12] == [64, 64, 1, 1] and q_map[8:12] == [64, 128, 1, 1]
    assert o_map[12] == q_map[12] == tma.TMA_DTYPE["fp16"]
    # the kernel's own o strides are the same (batch, head, token) view
    assert a.strides[10:12] == (d, h * d)
