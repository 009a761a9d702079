"""`flashgen.attention` on a machine without PyCUDA: inputs are validated first, then one
clear GpuUnavailable (never an ImportError)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import flashgen
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.runtime.gpu import GpuUnavailable

pytestmark = pytest.mark.usefixtures("no_pycuda")


def qkv(d=64, dtype=np.float16, tq=10, tk=12):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((2, 3, t, d)).astype(dtype) for t in (tq, tk, tk))


def test_the_api_imports_and_is_exported_lazily():
    import flashgen.api

    assert flashgen.attention is flashgen.api.attention
    assert flashgen.api.GpuUnavailable is GpuUnavailable


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_valid_inputs_reach_gpu_unavailable(dtype):
    with pytest.raises(GpuUnavailable, match="PyCUDA cannot be imported"):
        flashgen.attention(*qkv(dtype=dtype), causal=True)


def test_a_matching_spec_reaches_gpu_unavailable():
    spec = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp16", causal=True)
    with pytest.raises(GpuUnavailable):
        flashgen.attention(*qkv(), causal=True, spec=spec, return_lse=True)


def test_strided_numpy_views_are_accepted_since_they_are_copied():
    q, k, v = (x[:, :, ::2] for x in qkv(tq=20, tk=24))  # token stride 2*d
    with pytest.raises(GpuUnavailable):
        flashgen.attention(q, k, v)
    q, k, v = qkv(d=128)
    with pytest.raises(GpuUnavailable):  # even a non-contiguous d axis
        flashgen.attention(q[..., ::2], k[..., ::2], v[..., ::2])


def test_invalid_inputs_fail_validation_before_the_gpu_is_needed():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q.shape=\(3, 10, 64\): must have 4 dimensions"):
        flashgen.attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"dtype=float64: unsupported"):
        flashgen.attention(*qkv(dtype=np.float64))
    with pytest.raises(ValueError, match=r"scale=inf: must be finite"):
        flashgen.attention(q, k, v, scale=float("inf"))
    with pytest.raises(ValueError, match=r"causal=1: must be True or False"):
        flashgen.attention(q, k, v, causal=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec,message",
    [
        (
            KernelSpec(family="simt", d=128, dtype="fp16"),
            r"d=64: variant .*d128.* compiled for d=128",
        ),
        (
            KernelSpec(family="simt", d=64, dtype="bf16"),
            r"dtype=fp16: variant .* compiled for bf16",
        ),
        (
            KernelSpec(family="simt", d=64, dtype="fp16", causal=True),
            r"causal=False: spec .* compiled with causal=True",
        ),
    ],
)
def test_a_spec_that_does_not_fit_the_call_is_rejected(spec, message):
    with pytest.raises(ValueError, match=message):
        flashgen.attention(*qkv(), spec=spec)


def test_a_spec_must_be_a_kernel_spec():
    with pytest.raises(ValueError, match=r"spec='flash_fwd_simt.*': must be a KernelSpec"):
        flashgen.attention(*qkv(), spec="flash_fwd_simt_d64")  # type: ignore[arg-type]


def test_mixed_host_and_device_arrays_are_rejected():
    q, k, v = qkv()

    class Dev:
        shape, strides, dtype, ptr = v.shape, v.strides, v.dtype, 4096

    with pytest.raises(ValueError, match=r"q=ndarray, k=ndarray, v=Dev: mixed host and device"):
        flashgen.attention(q, k, Dev())


# ---- with a (fake) GPU: the signature cache of the device-array path -------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    from _fakecuda import install_libcuda, install_pycuda

    from flashgen import api

    calls = install_pycuda(monkeypatch, cc=(8, 0))  # an A100: no tensor maps (wgmma) to encode
    cuda = install_libcuda(monkeypatch)
    monkeypatch.setattr(api, "_entries", {})
    selected: list[tuple] = []
    real_select = api.select

    def counting_select(*args, **kw):
        selected.append((args, kw))
        return real_select(*args, **kw)

    monkeypatch.setattr(api, "select", counting_select)
    return calls, cuda, selected


def gpuarrays(dtype=np.float16, tq=70, tk=45, base=0x1000_0000, step=0x100_0000):
    from _fakecuda import FakeGPUArray

    shapes = ((2, 3, tq, 64), (2, 3, tk, 64), (2, 3, tk, 64))
    return tuple(FakeGPUArray(s, dtype, gpudata=base + i * step) for i, s in enumerate(shapes))


def test_a_repeated_gpuarray_signature_is_not_validated_or_selected_again(fake_gpu, monkeypatch):
    from flashgen import api

    calls, cuda, selected = fake_gpu
    o1, lse1 = flashgen.attention(*gpuarrays(), causal=True, return_lse=True)
    layouts: list[int] = []
    monkeypatch.setattr(api, "check_layout", lambda *a, **k: layouts.append(1))
    o2 = flashgen.attention(*gpuarrays(base=0x2000_0000), causal=True)
    assert len(selected) == 1 and layouts == []
    first, second = cuda.launches
    assert first.ptrs[:3] == (0x1000_0000, 0x1100_0000, 0x1200_0000)
    assert second.ptrs[:3] == (0x2000_0000, 0x2100_0000, 0x2200_0000)
    assert first.ptrs[3:] == (o1.gpudata, lse1.gpudata) and second.ptrs[3] == o2.gpudata
    assert o1.shape == (2, 3, 70, 64) and lse1.shape == (2, 3, 70) and o1.pooled
    assert first.strides == second.strides and (second.tq, second.tk) == (70, 45)
    assert kinds_of(calls, "synchronize") == []  # stream-ordered, nothing waits


def kinds_of(calls, name):
    return [c for c in calls.log if c[0] == name]


def test_a_changed_argument_or_pointer_alignment_is_validated_and_selected_again(fake_gpu):
    calls, cuda, selected = fake_gpu
    flashgen.attention(*gpuarrays(), causal=True)
    flashgen.attention(*gpuarrays(), causal=False)
    flashgen.attention(*gpuarrays(), causal=False, scale=0.5)
    assert len(selected) == 3
    assert cuda.launches[-1].scale_log2 == pytest.approx(0.5 * runtime.LOG2E)
    flashgen.attention(*gpuarrays(base=0x1000_0002), causal=False, scale=0.5)  # 2-byte aligned
    assert len(selected) == 4 and selected[-1][1]["alignment"] == 1
    with pytest.raises(ValueError, match=r"causal=1: must be True or False"):
        flashgen.attention(*gpuarrays(), causal=1)  # type: ignore[arg-type]  # 1 == True


def test_the_numpy_path_copies_in_launches_waits_and_copies_out(fake_gpu):
    calls, cuda, _ = fake_gpu
    o, lse = flashgen.attention(*qkv(), causal=True, return_lse=True)
    assert isinstance(o, np.ndarray) and o.shape == (2, 3, 10, 64) and lse.shape == (2, 3, 10)
    names = [c[0] for c in calls.log]
    assert names.count("htod") == 3 and names.count("dtoh") == 2
    assert names.index("synchronize") < names.index("dtoh") and len(cuda.launches) == 1


# ---- bad head dims are named before the GPU is looked for ------------------------------------
@pytest.mark.parametrize(
    "shapes,name",
    [
        (((2, 3, 10, 65), (2, 3, 12, 65), (2, 3, 12, 65)), "d=65"),
        (((2, 3, 10, 264), (2, 3, 12, 264), (2, 3, 12, 264)), "d=264"),
        (((2, 3, 10, 64), (2, 3, 12, 64), (2, 3, 12, 60)), "dv=60"),
    ],
)
def test_a_head_dim_no_family_takes_is_a_value_error_without_a_gpu(shapes, name):
    host = [np.zeros(s, np.float16) for s in shapes]
    with pytest.raises(ValueError, match=rf"{name}: must be a multiple of 8 in \[8, 256\]"):
        flashgen.attention(*host)
    from _fakecuda import FakeGPUArray  # device arrays: no PyCUDA here, still a ValueError

    with pytest.raises(ValueError, match=rf"{name}: must be a multiple of 8 in \[8, 256\]"):
        flashgen.attention(*(FakeGPUArray(s, np.float16, gpudata=1 << 30) for s in shapes))


def test_a_device_array_with_a_strided_d_axis_is_a_value_error_without_a_gpu():
    from _fakecuda import FakeGPUArray

    q = FakeGPUArray((2, 3, 10, 64), np.float16, gpudata=1 << 30, strides=(7680, 2560, 256, 4))
    k = FakeGPUArray((2, 3, 12, 64), np.float16, gpudata=2 << 30)
    with pytest.raises(ValueError, match=r"q.strides\[3\]=4 bytes: the d axis must be contiguous"):
        flashgen.attention(q, k, k)


# ---- the device-array signature cache is bounded ---------------------------------------------
def test_a_decode_loop_with_growing_tk_keeps_a_bounded_number_of_signatures(fake_gpu, monkeypatch):
    from flashgen import api
    from flashgen.runtime import launch

    monkeypatch.setattr(launch, "MAX_SIGNATURES", 8)
    for tk in range(1, 30):  # a new signature every step (20,001 steps kept 20,001 entries)
        flashgen.attention(*gpuarrays(tq=1, tk=tk))
    assert 1 <= len(api._entries) <= 8
    assert len(fake_gpu[1].launches) == 29


# ---- CUDA-array-interface inputs: the launch waits for the producer's stream (v3) ------------
class CaiArray:
    """A CuPy-like device array: everything through __cuda_array_interface__ (v3), with the
    stream its producer names (None: nothing to wait for)."""

    def __init__(self, shape, ptr, stream=None, dtype=np.float16):
        self.shape, self.dtype, self.ptr_, self.stream = tuple(shape), np.dtype(dtype), ptr, stream

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr_, False),
            "strides": None, "version": 3, "stream": self.stream,
        }  # fmt: skip


def cai_qkv(*streams):
    shapes = ((2, 3, 70, 64), (2, 3, 45, 64), (2, 3, 45, 64))
    return tuple(
        CaiArray(s, 0x1000_0000 * (i + 1), stream)
        for i, (s, stream) in enumerate(zip(shapes, streams, strict=True))
    )


def waits(cuda):
    """(producer stream, consumer stream) of each event wait issued, from the fake driver's log."""
    recorded = {c[1]: c[2] for c in cuda.log if c[0] == "event_record"}
    return [(recorded[c[2]], c[1]) for c in cuda.log if c[0] == "stream_wait_event"]


def test_the_launch_waits_for_the_stream_a_cai_producer_names(fake_gpu):
    _, cuda, _ = fake_gpu
    flashgen.attention(*cai_qkv(0xABC0, 0xABC0, 0xDEF0))
    assert waits(cuda) == [(0xABC0, 0), (0xDEF0, 0)]  # each producer stream once
    names = [c[0] for c in cuda.log]
    assert names.index("stream_wait_event") < names.index("launch")  # before the kernel
    assert names.count("event_create") == names.count("event_destroy") == 2


def test_default_and_absent_streams_need_no_event_and_zero_is_refused(fake_gpu):
    _, cuda, _ = fake_gpu
    flashgen.attention(*cai_qkv(None, 1, None))  # 1: the legacy default stream, the launch's
    assert waits(cuda) == [] and len(cuda.launches) == 1
    flashgen.attention(*cai_qkv(2, None, None))  # 2: the per-thread default stream
    assert waits(cuda) == [(2, 0)]
    with pytest.raises(ValueError, match=r"k.__cuda_array_interface__\['stream'\]=0: .*0 is"):
        flashgen.attention(*cai_qkv(None, 0, None))
    assert len(cuda.launches) == 2
