"""Input validation: one test per rule; each message names the value, the rule and the fix."""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flashgen.generator.spec import KernelSpec
from flashgen.runtime.validate import (
    MAX_GRID_YZ,
    MAX_INT32,
    MAX_LENGTH,
    Problem,
    check_layout,
    check_scale,
    describe,
    validate_inputs,
)

SIMT = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp16")
MMA = KernelSpec(family="mma", d=64, br=128, bc=64, dtype="fp16", warps=4, stages=2)


@dataclass
class Dev:
    """A device array as GPUArray presents it: shape, byte strides, dtype, pointer."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: Any
    ptr: int = 0x7F0000000000


def dev(
    shape: tuple[int, ...],
    dtype: Any = np.float16,
    strides: tuple[int, ...] | None = None,
    ptr: int = 0x7F0000000000,
) -> Dev:
    size = np.dtype(dtype).itemsize
    if strides is None:
        out, step = [], size
        for n in reversed(shape):
            out.append(step)
            step *= n
        strides = tuple(reversed(out))
    return Dev(shape, strides, np.dtype(dtype), ptr)


def qkv(b=2, h=3, tq=10, tk=12, d=64, dtype: Any = np.float16):
    return (
        np.zeros((b, h, tq, d), dtype),
        np.zeros((b, h, tk, d), dtype),
        np.zeros((b, h, tk, d), dtype),
    )


def test_valid_inputs_give_the_problem_with_element_strides():
    q, k, v = qkv()
    p = validate_inputs(SIMT, q, k, v)
    assert (p.b, p.h, p.tq, p.tk, p.d, p.dtype) == (2, 3, 10, 12, 64, "fp16")
    assert p.q_strides == (3 * 10 * 64, 10 * 64, 64)
    assert p.k_strides == (3 * 12 * 64, 12 * 64, 64)


def test_axes_of_extent_one_get_stride_zero_and_never_fail_alignment():
    # a (1, 1, 1, d) view may carry any strides on its unit axes
    q = dev((1, 1, 1, 64), strides=(6, 10, 14, 2))
    k = v = dev((1, 1, 5, 64))
    p = validate_inputs(MMA, q, k, v)
    assert p.q_strides == (0, 0, 0)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_rank_must_be_four(which):
    q, k, v = qkv()
    arrays = {"q": q, "k": k, "v": v}
    arrays[which] = arrays[which][0]
    with pytest.raises(ValueError, match=rf"{which}.shape=.*4 dimensions.*reshape"):
        check_layout(arrays["q"], arrays["k"], arrays["v"])


def test_batch_must_match():
    q, _, v = qkv()
    k = np.zeros((3, 3, 12, 64), np.float16)
    with pytest.raises(ValueError, match=r"k.shape=\(3, 3, 12, 64\): batch must equal q's B=2"):
        check_layout(q, k, v)


@pytest.mark.parametrize("h_kv", [2, 4])
def test_query_heads_must_be_a_multiple_of_kv_heads(h_kv):
    q, _, _ = qkv()  # 3 query heads
    k = v = np.zeros((2, h_kv, 12, 64), np.float16)
    with pytest.raises(ValueError, match=rf"k.shape\[1\]={h_kv}: .* use H_kv in \[1, 3\]"):
        check_layout(q, k, v)


def test_k_and_v_must_have_the_same_heads():
    q = np.zeros((1, 4, 5, 64), np.float16)
    k, v = np.zeros((1, 2, 7, 64), np.float16), np.zeros((1, 4, 7, 64), np.float16)
    with pytest.raises(ValueError, match=r"v.shape\[1\]=4: k and v must have the same number"):
        check_layout(q, k, v)


@pytest.mark.parametrize(("h", "h_kv", "group"), [(8, 8, 1), (8, 2, 4), (16, 1, 16)])
def test_grouped_query_attention_is_a_problem_with_fewer_kv_heads(h, h_kv, group):
    q = np.zeros((1, h, 5, 64), np.float16)
    k = v = np.zeros((1, h_kv, 7, 64), np.float16)
    p = check_layout(q, k, v)
    assert (p.h, p.kv_heads, p.kv_group) == (h, h_kv, group)


def test_k_head_dim_must_match_and_v_may_have_its_own():
    q, _, v = qkv()
    k = np.zeros((2, 3, 12, 32), np.float16)
    with pytest.raises(ValueError, match=r"k.shape\[3\]=32: head dim must equal q's d=64"):
        check_layout(q, k, v)
    q, k, _ = qkv()
    p = check_layout(q, k, np.zeros((2, 3, 12, 32), np.float16))
    assert (p.d, p.value_dim) == (64, 32)


def test_k_and_v_must_have_the_same_length():
    q, k, _ = qkv()
    v = np.zeros((2, 3, 11, 64), np.float16)
    with pytest.raises(ValueError, match=r"v.shape\[2\]=11: .*Tk=12.*same length"):
        check_layout(q, k, v)


def test_dtypes_must_be_equal():
    q, k, _ = qkv()
    v = np.zeros((2, 3, 12, 64), np.float32)
    with pytest.raises(ValueError, match=r"float16/float16/float32: must be equal; cast"):
        check_layout(q, k, v)


def test_unsupported_dtype_is_named():
    with pytest.raises(ValueError, match=r"dtype=float64: unsupported; use float32, float16"):
        check_layout(*qkv(dtype=np.float64))


def test_bfloat16_is_supported():
    assert check_layout(*qkv(dtype=ml_dtypes.bfloat16)).dtype == "bf16"


def test_d_axis_must_be_contiguous():
    q, k, v = qkv(d=128)
    with pytest.raises(ValueError, match=r"q.strides\[3\]=4 bytes: the d axis must be contiguous"):
        check_layout(q[..., ::2], k[..., ::2], v[..., ::2])


def test_strides_must_step_whole_elements():
    q = dev((2, 3, 10, 64), strides=(3 * 10 * 130 + 1, 10 * 130, 130, 2))
    k = v = dev((2, 3, 12, 64))
    with pytest.raises(
        ValueError, match=r"q.strides\[0\]=3901 bytes: not a multiple of the itemsize 2"
    ):
        check_layout(q, k, v)


@pytest.mark.parametrize(
    "shape_q,shape_kv,label",
    [
        ((2, 3, 0, 64), (2, 3, 5, 64), "Tq=0"),
        ((2, 3, 4, 64), (2, 3, 0, 64), "Tk=0"),
        ((0, 3, 4, 64), (0, 3, 5, 64), "B=0"),
        ((2, 0, 4, 64), (2, 0, 5, 64), "H=0"),
    ],
)
def test_every_size_must_be_at_least_one(shape_q, shape_kv, label):
    q, k = np.zeros(shape_q, np.float16), np.zeros(shape_kv, np.float16)
    with pytest.raises(ValueError, match=rf"{label}: must be >= 1"):
        check_layout(q, k, k)


def test_batch_is_limited_by_grid_z():
    b = MAX_GRID_YZ + 1
    with pytest.raises(ValueError, match=rf"B={b}: exceeds the CUDA grid.z limit 65535; split"):
        check_layout(dev((b, 1, 4, 64)), dev((b, 1, 4, 64)), dev((b, 1, 4, 64)))


def test_heads_are_limited_by_grid_y():
    h = MAX_GRID_YZ + 1
    with pytest.raises(ValueError, match=rf"H={h}: exceeds the CUDA grid.y limit 65535; split"):
        check_layout(dev((1, h, 4, 64)), dev((1, h, 4, 64)), dev((1, h, 4, 64)))


def test_grid_limits_themselves_are_accepted():
    x = dev((MAX_GRID_YZ, MAX_GRID_YZ, 4, 64))
    assert check_layout(x, x, x).b == MAX_GRID_YZ


def test_lengths_must_fit_32_bits():
    t = MAX_INT32 + 1
    with pytest.raises(ValueError, match=rf"Tk={t}: exceeds the 32-bit length"):
        check_layout(dev((1, 1, 4, 64)), dev((1, 1, t, 64)), dev((1, 1, t, 64)))


@pytest.mark.parametrize("axis", ["Tq", "Tk"])
def test_lengths_leave_room_for_the_kernels_tile_loops(axis):
    # kv0 + BC and q0 + BR stay below 2**31 for every tile up to 1024
    assert MAX_LENGTH + 1024 == 2**31
    for t, ok in ((MAX_LENGTH, True), (MAX_LENGTH + 1, False)):
        tq, tk = (t, 4) if axis == "Tq" else (4, t)
        args = (dev((1, 1, tq, 64)), dev((1, 1, tk, 64)), dev((1, 1, tk, 64)))
        if ok:
            assert check_layout(*args).tq == tq
        else:
            with pytest.raises(
                ValueError, match=rf"{axis}={t}: exceeds .* \({MAX_LENGTH}: 2\*\*31"
            ):
                check_layout(*args)


def test_output_must_match_q():
    q, k, v = qkv()
    with pytest.raises(
        ValueError, match=r"o: shape \(2, 3, 9, 64\).*must be \(2, 3, 10, 64\).*allocate o"
    ):
        check_layout(q, k, v, o=np.zeros((2, 3, 9, 64), np.float16))
    with pytest.raises(ValueError, match=r"o: .*dtype float32: must be \(2, 3, 10, 64\) float16"):
        check_layout(q, k, v, o=np.zeros((2, 3, 10, 64), np.float32))


def test_output_rows_must_not_overlap():
    q, k, v = qkv()
    o = dev((2, 3, 10, 64), strides=(3 * 10 * 128, 10 * 128, 0, 2))
    with pytest.raises(ValueError, match=r"o.strides\[2\]=0 on the token axis.*overlap"):
        check_layout(q, k, v, o=o)


def test_output_rows_that_overlap_without_a_zero_stride_are_refused():
    q, k, v = qkv()
    # token stride 32 elements under rows of 64: row t + 1 starts inside row t
    o = dev((2, 3, 10, 64), strides=(3 * 10 * 128, 10 * 128, 64, 2), ptr=0x7E0000000000)
    with pytest.raises(ValueError, match=r"the token axis steps 64 bytes, less than the 128"):
        check_layout(q, k, v, o=o)
    # heads interleaved with tokens without room: 3 heads 128 bytes apart, tokens 256 apart
    # (head 0 of token 1 is head 2 of token 0)
    o = dev((2, 3, 10, 64), strides=(3 * 10 * 128, 128, 256, 2), ptr=0x7E0000000000)
    with pytest.raises(ValueError, match=r"the token axis steps 256 bytes, less than the 384"):
        check_layout(q, k, v, o=o)
    # a padded, transposed (B, T, H, d) layout is fine
    o = dev((2, 3, 10, 64), strides=(10 * 3 * 144, 144, 3 * 144, 2), ptr=0x7E0000000000)
    check_layout(q, k, v, o=o)


OUT = 0x7E0000000000  # apart from dev()'s default 0x7F0000000000


@pytest.mark.parametrize(
    "where,message",
    [
        ("o=k", r"o \(bytes .*\) overlaps k \(bytes"),
        ("o=q", r"o \(bytes .*\) overlaps q"),
        ("o inside v", r"o \(bytes .*\) overlaps v"),
        ("lse inside k", r"lse \(bytes .*\) overlaps k"),
        ("lse inside o", r"lse \(bytes .*\) overlaps o"),
    ],
)
def test_outputs_must_not_overlap_an_input_or_each_other(where, message):
    """runtime.launch(..., o=k, lse=<inside k>) launched: the kernel wrote O and LSE over the
    K it was still reading (other blocks read it after)."""
    base = {"q": 0x1000_0000, "k": 0x2000_0000, "v": 0x3000_0000, "o": OUT, "lse": OUT + 0x100000}
    target, _, inside = where.partition(" inside ")
    if inside:
        base[target] = base[inside] + 4096  # 4 KiB into it
    else:
        name, other = where.split("=")
        base[name] = base[other]
    q = dev((2, 3, 10, 64), ptr=base["q"])
    k, v = (dev((2, 3, 12, 64), ptr=base[n]) for n in "kv")
    o, lse = dev((2, 3, 10, 64), ptr=base["o"]), dev((2, 3, 10), np.float32, ptr=base["lse"])
    with pytest.raises(ValueError, match=message + r".*must not share memory.*allocate a fresh"):
        validate_inputs(MMA, q, k, v, o=o, lse=lse)


def test_outputs_next_to_the_inputs_and_inputs_that_share_memory_are_fine():
    q = dev((2, 3, 10, 64), ptr=0x1000_0000)
    kv = dev((2, 3, 12, 64), ptr=0x2000_0000)  # k and v may be the same array
    o = dev((2, 3, 10, 64), ptr=0x1000_0000 + 2 * 3 * 10 * 64 * 2)  # right after q ends
    lse = dev((2, 3, 10), np.float32, ptr=0x1000_0000 - 2 * 3 * 10 * 4)  # right before q
    validate_inputs(MMA, q, kv, kv, o=o, lse=lse)
    # the backward reads o and lse: there they are inputs, and may share anything
    check_layout(q, kv, kv, o=q, lse=lse, outputs=False)


def test_lse_must_be_contiguous_float32_b_h_tq():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"lse: shape \(2, 3, 9\).*float32 of shape \(2, 3, 10\)"):
        check_layout(q, k, v, lse=np.zeros((2, 3, 9), np.float32))
    with pytest.raises(ValueError, match=r"lse: .*dtype float64.*float32"):
        check_layout(q, k, v, lse=np.zeros((2, 3, 10), np.float64))
    with pytest.raises(ValueError, match=r"lse.strides=.*C-contiguous"):
        check_layout(q, k, v, lse=np.zeros((2, 3, 20), np.float32)[..., ::2])


def test_d_must_match_the_spec():
    with pytest.raises(ValueError, match=r"d=32: variant flash_fwd_simt_d64.* d=64; .*head dim 64"):
        validate_inputs(SIMT, *qkv(d=32))


def test_dtype_must_match_the_spec():
    with pytest.raises(ValueError, match=r"dtype=fp32: variant .* compiled for fp16; cast"):
        validate_inputs(SIMT, *qkv(dtype=np.float32))


def test_mma_needs_strides_in_16_byte_chunks():
    q = dev((2, 3, 10, 64), strides=(3 * 10 * 72 * 2, 10 * 72 * 2, 72 * 2, 2))  # token: 72 el.
    k = v = dev((2, 3, 12, 64))
    validate_inputs(MMA, q, k, v)  # 72 is a multiple of 8
    bad = dev((2, 3, 10, 64), strides=(3 * 10 * 65 * 2, 10 * 65 * 2, 65 * 2, 2))
    with pytest.raises(
        ValueError,
        match=r"q batch stride=1950 elements: family mma needs multiples of 8 \(16 bytes\)",
    ):
        validate_inputs(MMA, bad, k, v)
    validate_inputs(SIMT, bad, k, v)  # simt takes any element stride


def test_mma_needs_16_byte_aligned_pointers():
    q, k = dev((2, 3, 10, 64)), dev((2, 3, 12, 64))
    v = dev((2, 3, 12, 64), ptr=0x7F0000000002)
    with pytest.raises(ValueError, match=r"v pointer 0x7f0000000002: family mma needs 16-byte"):
        validate_inputs(MMA, q, k, v)
    validate_inputs(SIMT, q, k, v)
    validate_inputs(MMA, q, k, v, check_pointers=False)  # host arrays are copied anyway


def test_output_alignment_is_checked_too():
    q, k, v = dev((2, 3, 10, 64)), dev((2, 3, 12, 64)), dev((2, 3, 12, 64))
    o = dev((2, 3, 10, 64), ptr=0x7E0000000008)  # apart from the inputs, misaligned
    with pytest.raises(ValueError, match=r"o pointer"):
        validate_inputs(MMA, q, k, v, o=o)


def test_problem_alignment_is_the_widest_that_every_stride_and_pointer_allow():
    q, k, v = dev((2, 3, 10, 64)), dev((2, 3, 12, 64)), dev((2, 3, 12, 64))
    assert check_layout(q, k, v).alignment() == 8  # 16 bytes of fp16
    shifted = dev((2, 3, 12, 64), ptr=0x7F0000000004)
    p = check_layout(q, k, shifted)
    assert p.alignment() == 2 and p.alignment(pointers=False) == 8
    f32 = dev((2, 3, 10, 64), np.float32)
    assert check_layout(f32, f32, f32).alignment() == 4


def test_kernel_strides_need_an_output():
    p = check_layout(*qkv())
    with pytest.raises(ValueError, match="validate with o="):
        p.kernel_strides()
    q, k, v = qkv()
    full = check_layout(q, k, v, o=np.zeros_like(q))
    assert full.kernel_strides() == (
        *full.q_strides,
        *full.k_strides,
        *full.v_strides,
        *full.q_strides,
    )


def test_describe_reads_gpuarray_gpudata_when_there_is_no_ptr():
    @dataclass
    class Old:
        shape: tuple[int, ...]
        strides: tuple[int, ...]
        dtype: Any
        gpudata: int

    info = describe("q", Old((1, 1, 2, 8), (32, 32, 16, 2), np.float16, 4096))
    assert info.ptr == 4096 and info.dtype == np.float16


def test_describe_reads_the_cuda_array_interface():
    class Cai:
        __cuda_array_interface__ = {  # noqa: RUF012
            "shape": (1, 2, 3, 8),
            "strides": None,
            "typestr": "<f4",
            "data": (8192, False),
            "version": 3,
        }

    info = describe("k", Cai())
    assert info.strides == (192, 96, 32, 4) and info.ptr == 8192 and info.dtype == np.float32


class CupyLike:
    """What a CuPy (or Numba) device array exposes: shape, byte strides and dtype as
    attributes, the pointer only through `__cuda_array_interface__` (CuPy keeps it in
    `.data.ptr`, an object, not an int)."""

    class _Memory:
        ptr = 0x7F0000002000

    def __init__(self, shape, dtype=np.float16, strides=None, ptr=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.strides = strides or dev(self.shape, dtype).strides
        self.data = self._Memory()
        if ptr is not None:
            self.data.ptr = ptr

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": self.shape,
            "strides": self.strides,
            "typestr": self.dtype.str,
            "data": (self.data.ptr, False),
            "version": 3,
        }


def test_cai_arrays_with_shape_and_strides_keep_their_pointer():
    # a padded-row view: the strides come from the interface, not recomputed as contiguous
    x = CupyLike((1, 2, 3, 8), strides=(192, 96, 32, 2))
    info = describe("q", x)
    assert info.ptr == 0x7F0000002000
    assert info.strides == (192, 96, 32, 2) and info.dtype == np.float16
    problem = validate_inputs(
        MMA, *(CupyLike((1, 2, 3, 64)),) * 3,
        o=CupyLike((1, 2, 3, 64), ptr=0x7F0000004000),
        lse=CupyLike((1, 2, 3), np.float32, ptr=0x7F0000006000),
    )  # fmt: skip
    assert problem.q_ptr == 0x7F0000002000
    assert (problem.o_ptr, problem.lse_ptr) == (0x7F0000004000, 0x7F0000006000)


def test_cai_keeps_an_object_dtype_numpy_knows_bfloat16_included():
    x = CupyLike((1, 1, 2, 8), ml_dtypes.bfloat16)  # its typestr is the opaque '<V2'
    assert x.__cuda_array_interface__["typestr"] == "<V2"
    assert describe("k", x).dtype == np.dtype(ml_dtypes.bfloat16)


def test_masked_cai_arrays_are_refused():
    class Masked(CupyLike):
        @property
        def __cuda_array_interface__(self):
            return {**super().__cuda_array_interface__, "mask": object()}

    with pytest.raises(ValueError, match="masked CUDA array"):
        describe("v", Masked((1, 1, 2, 8)))


class Torchish:
    """What validation reads from a torch tensor (torch itself is not needed)."""

    def __init__(self, shape, dtype="torch.bfloat16", is_cuda=True):
        self.shape, self.dtype, self.is_cuda = shape, dtype, is_cuda

    def stride(self):
        out, step = [], 1
        for n in reversed(self.shape):
            out.append(step)
            step *= n
        return tuple(reversed(out))

    def element_size(self):
        return 4 if self.dtype == "torch.float32" else 2

    def data_ptr(self):
        return 0x7F0000001000


def test_describe_reads_torch_tensors_bfloat16_included():
    info = describe("q", Torchish((1, 2, 3, 8)))
    assert info.dtype == np.dtype(ml_dtypes.bfloat16) and info.strides == (96, 48, 16, 2)


def test_torch_tensors_on_the_cpu_and_odd_dtypes_are_refused():
    with pytest.raises(ValueError, match=r"q: a CPU tensor; move it to the GPU"):
        describe("q", Torchish((1, 2, 3, 8), is_cuda=False))
    with pytest.raises(ValueError, match=r"q.dtype=torch.int8: unsupported"):
        describe("q", Torchish((1, 2, 3, 8), dtype="torch.int8"))


def test_non_arrays_are_refused():
    with pytest.raises(ValueError, match=r"q=list: not an array; pass a NumPy array or a PyCUDA"):
        describe("q", [[1.0]])


def test_scale_defaults_to_rsqrt_d_and_must_be_finite():
    assert check_scale(None, 64) == 0.125
    assert check_scale(0.5, 64) == 0.5
    with pytest.raises(ValueError, match=r"scale=nan: must be finite"):
        check_scale(math.nan, 64)
    with pytest.raises(ValueError, match=r"scale='x': must be a real number"):
        check_scale("x", 64)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.0, -0.0, -0.125, 1e-39, 2.4e38])
def test_scale_must_be_positive_and_fit_float32_after_log2e(bad):
    msg = re.escape(f"scale={bad!r}: must be in [8.1") + r"\de-39, 2\.3\de\+38\] \(positive"
    with pytest.raises(ValueError, match=msg):
        check_scale(bad, 64)
    assert check_scale(1e-38, 64) == 1e-38 and check_scale(2.3e38, 64) == 2.3e38


def test_problem_is_frozen():
    p = check_layout(*qkv())
    assert isinstance(p, Problem)
    with pytest.raises(AttributeError):
        p.b = 3  # type: ignore[misc]


# ---- very long K/V: a warning past the length up to which the error rule holds (issue 9) ----
def _long_kv(tk: int, d: int, dtype: Any):
    """q of one row and k = v of `tk` keys that all alias one row (no memory for tk keys)."""
    q = np.zeros((1, 1, 1, d), dtype)
    kv = np.lib.stride_tricks.as_strided(q, (1, 1, tk, d), (0, 0, 0, q.strides[3]))
    return q, kv


def test_the_accurate_lengths_follow_from_the_accumulation_model():
    from flashgen.runtime.validate import FP32_RTOL_OF_RULE, accurate_length
    from flashgen.verify import oracle

    assert FP32_RTOL_OF_RULE == oracle.FP32_RTOL
    mma_fp16 = KernelSpec(family="mma", d=64, br=128, bc=64, dtype="fp16", warps=4, stages=2)
    assert accurate_length(mma_fp16) == 2**17  # 16 keys/add * 2**-12 / 2**-25
    assert accurate_length(mma_fp16.replace(dtype="bf16")) == 2**20  # 16 * 2**-9 / 2**-25
    simt32 = accurate_length(KernelSpec(family="simt", d=64, dtype="fp32"))
    assert simt32 == 4503  # (1e-5 / (2.5 * 2**-24))**2, calibrated on the H200
    assert simt32 < 16411  # where the H200 measured the fp32 rule failing
    # the committed largest-T run (bf16 mma, Tk = 290M, O off by 7.4e-3) lies far beyond
    largest_t = 290_003_173
    assert largest_t > 200 * accurate_length(mma_fp16.replace(dtype="bf16"))


@pytest.mark.parametrize("spec", [MMA, SIMT.replace(dtype="fp32")], ids=lambda s: s.name)
def test_kv_longer_than_the_accurate_length_warns_and_still_validates(spec):
    from flashgen.runtime.validate import AccuracyWarning, accurate_length

    limit = accurate_length(spec)
    dtype = np.dtype(spec.dtype_info.numpy)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at the limit: silent
        q, kv = _long_kv(limit, spec.d, dtype)
        validate_inputs(spec, q, kv, kv)
    q, kv = _long_kv(limit + 1, spec.d, dtype)
    with pytest.warns(AccuracyWarning, match=rf"Tk={limit + 1}: beyond {limit} keys.*split K/V"):
        problem = validate_inputs(spec, q, kv, kv)
    assert problem.tk == limit + 1
