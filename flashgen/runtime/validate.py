"""Input checks that run before any launch: shapes, dtypes, layout, alignment, grid limits.

Everything here works from shapes, byte strides, dtypes and pointer integers, so it applies
alike to NumPy arrays, PyCUDA `GPUArray`s and anything exposing `__cuda_array_interface__`;
it imports no PyCUDA. Each failure is a `ValueError` naming the value, the rule and the fix.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashgen.generator.dtypes import DTYPES, dtype_of_array
from flashgen.generator.numerics import LOG2E
from flashgen.generator.spec import KernelSpec

# CUDA launch limits: grid.x may reach 2**31 - 1 blocks, grid.y and grid.z 65535. The grid
# is (query tiles, heads, batch), and the kernel takes Tq and Tk as 32-bit ints.
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
MAX_INT32 = 2**31 - 1
# Tq and Tk reach the kernel as 32-bit ints, and its tile loops step one tile past the last
# row or key (kv0 + BC, q0 + BR - 1, (keys + BC - 1) / BC): lengths stop 1024 short of
# 2**31 so that none of these overflows (an overflowing key loop never ends).
MAX_LENGTH = 2**31 - 1024
# The widest alignment `Problem.alignment` reports, in bytes (one 16-byte vector load).
MAX_ALIGN_BYTES = 16
# The kernels take scale * log2(e) as a float32, and need it positive and normal: they take a
# row's max before scaling (a negative factor makes it the min), and a zero or flushed
# subnormal factor turns a masked -inf score into -inf * 0 = NaN.
SCALE_MIN = float(np.finfo(np.float32).tiny) / LOG2E * (1 + 2**-20)
SCALE_MAX = float(np.finfo(np.float32).max) / LOG2E * (1 - 2**-20)

AXES = ("batch", "head", "token", "d")

# ---- how long K/V may be before docs/design.md's error rule stops holding (issue 9) -------------
# The kernels keep one fp32 accumulator per output element for the whole row. On tensor cores
# (mma.sync m16n8k16, wgmma k16) every KEYS_PER_TC_ADD keys are added into it by a truncating
# add: the accumulator loses on average half an ulp (mean ulp/|x| over a binade is 0.72 * 2**-23)
# of a running value that, growing linearly, averages half its final size, so the expected
# relative drift of O is about 0.36 * n * 2**-24 after n adds; TC_DRIFT_PER_ADD = 2**-25
# rounds that up. The committed largest-T run (bench/results/*-largest-t.json, bf16, Tk = 290M:
# n = 1.8e7 adds) measured O off by 7.4e-3 where max|O| = 0.029, a drift of 0.26 against the
# model's 0.54. The fp16/bf16 rule allows a kernel twice the reference's error, which is at
# least the storage rounding of O (unit roundoff u_s: 2**-11 fp16, 2**-8 bf16); the kernel
# spends about one of those on its own rounding, so the drift must stay below u_s / 2:
#   Tk <= KEYS_PER_TC_ADD * (u_s / 2) / TC_DRIFT_PER_ADD  =  2**17 (fp16), 2**20 (bf16).
# CUDA-core families (simt) round to nearest with fp32 FMAs, one add per key: the errors are
# unbiased and the relative error of O grows like a random walk, C * U32 * sqrt(Tk). The
# first model here (C = 1/sqrt(6), a walk whose steps scale with a partial sum) promised
# 42,221 keys; the H200 measured the rule failing at Tk = 16,411 (V mean 50: error/bound
# 1.84-1.93 for simt fp32 d=64/128, bench/results/*-trust.txt), so C is calibrated on that
# run: 1.93e-5 = C * U32 * sqrt(16411) gives C = 2.5 (SIMT_WALK). fp32's rule is a relative
# 1e-5, so
#   Tk <= (FP32_RTOL_OF_RULE / (SIMT_WALK * U32))**2  =  4,503 keys (fp32);
# with fp16/bf16 storage the walk stays below u_s / 2 (half the storage rounding) until 1e7
# keys and more.
# Beyond the limit a launch still runs (the output is still attention, only less accurate than
# the rule): `check_spec` warns once per call site with AccuracyWarning. Split K/V into chunks
# within the limit and merge the partial outputs with their LSEs for full accuracy.
KEYS_PER_TC_ADD = 16
TC_DRIFT_PER_ADD = 2.0**-25
U32 = 2.0**-24
SIMT_WALK = 2.5  # calibrated on the H200 (see above)
FP32_RTOL_OF_RULE = 1e-5  # oracle.FP32_RTOL (oracle imports nothing from here; kept equal by test)


class AccuracyWarning(UserWarning):
    """A launch whose K/V is longer than the length up to which docs/design.md's rule holds."""


def unit_roundoff(dtype: str) -> float:
    """Half the machine epsilon of a storage dtype: 2**-24 fp32, 2**-11 fp16, 2**-8 bf16."""
    import ml_dtypes

    return float(ml_dtypes.finfo(np.dtype(DTYPES[dtype].numpy)).eps) / 2  # type: ignore[no-untyped-call]


def accurate_length(spec: KernelSpec) -> int:
    """The longest K/V (keys) for which `spec`'s accumulation keeps docs/design.md's error rule."""
    if spec.fam.tensor_cores:
        keys = KEYS_PER_TC_ADD * (unit_roundoff(spec.dtype) / 2) / TC_DRIFT_PER_ADD
    elif spec.dtype == "fp32":
        keys = (FP32_RTOL_OF_RULE / (SIMT_WALK * U32)) ** 2
    else:
        keys = (unit_roundoff(spec.dtype) / 2 / (SIMT_WALK * U32)) ** 2
    return int(min(keys, MAX_LENGTH))


@dataclass(frozen=True)
class ArrayInfo:
    """What the checks need to know about one array: shape, byte strides, dtype, pointer."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, like NumPy and GPUArray
    dtype: np.dtype[Any]
    ptr: int | None  # device (or host) address of element [0, 0, 0, 0]; None when unknown

    def elem_strides(self) -> tuple[int, ...]:
        """Strides in elements; an axis of extent 1 gets 0 since it is never stepped along."""
        size = self.dtype.itemsize
        out = []
        for axis, (extent, stride) in enumerate(zip(self.shape, self.strides, strict=True)):
            if extent == 1:
                out.append(0)
                continue
            if stride % size:
                raise ValueError(
                    f"{self.name}.strides[{axis}]={stride} bytes: not a multiple of the "
                    f"itemsize {size}; pass an array whose strides step whole elements"
                )
            out.append(stride // size)
        return tuple(out)


def describe(name: str, x: Any) -> ArrayInfo:
    """Read shape, byte strides, dtype and pointer from a NumPy array, GPUArray or CUDA array."""
    if isinstance(x, np.ndarray):
        return ArrayInfo(
            name, tuple(x.shape), tuple(x.strides), x.dtype, int(x.__array_interface__["data"][0])
        )
    if callable(getattr(x, "data_ptr", None)) and callable(getattr(x, "stride", None)):
        return _describe_torch(name, x)
    cai = None if hasattr(x, "gpudata") else getattr(x, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        # CuPy and Numba arrays: the interface is the one reliable source of the pointer
        # (CuPy keeps it in .data.ptr, Numba behind device_ctypes_pointer); PyCUDA's
        # GPUArray is read from its own attributes (gpudata, strides, dtype)
        return _describe_cai(name, x, cai)
    if all(hasattr(x, a) for a in ("shape", "strides", "dtype")):
        try:
            dt = np.dtype(x.dtype)
        except TypeError:
            raise ValueError(
                f"{name}.dtype={x.dtype!r}: not a NumPy dtype; pass a NumPy array or a PyCUDA "
                "GPUArray (wrap other device memory in GPUArray(shape, dtype, gpudata=ptr))"
            ) from None
        return ArrayInfo(name, tuple(x.shape), tuple(x.strides), dt, _pointer(x))
    raise ValueError(
        f"{name}={type(x).__name__}: not an array; pass a NumPy array or a PyCUDA GPUArray"
    )


def cai_stream(name: str, x: Any) -> int | None:
    """The stream a CUDA-array-interface producer (CuPy, Numba) says `x`'s data is ready on,
    which a consumer must wait for (v3): None when there is nothing to wait for (no interface,
    no `stream`, or a PyCUDA GPUArray or torch tensor: their hosts order their own work),
    1 the legacy default stream, 2 the per-thread default stream, else a CUstream handle.
    ValueError for a value the interface disallows (0 is ambiguous there)."""
    if hasattr(x, "gpudata") or callable(getattr(x, "data_ptr", None)):
        return None
    cai = getattr(x, "__cuda_array_interface__", None)
    stream = cai.get("stream") if isinstance(cai, dict) else None
    if stream is None:
        return None
    if isinstance(stream, bool) or not isinstance(stream, int) or stream <= 0:
        raise ValueError(
            f"{name}.__cuda_array_interface__['stream']={stream!r}: must be None or a positive "
            "int (CUDA array interface v3: 1 the legacy default stream, 2 the per-thread "
            "default stream, else a stream handle; 0 is disallowed as ambiguous); fix the "
            "producer's interface, or synchronize and pass the array without a stream"
        )
    return stream


def _describe_cai(name: str, x: Any, cai: dict[str, Any]) -> ArrayInfo:
    """An object exposing `__cuda_array_interface__` (v2/v3): shape, strides, pointer from it.

    The dtype is the object's own `.dtype` when NumPy understands it (a bfloat16 GPUArray
    advertises the opaque typestr '<V2'), else the interface's typestr. A mask is refused.
    """
    if cai.get("mask") is not None:
        raise ValueError(
            f"{name}: a masked CUDA array; pass the data without a mask (masked elements "
            "would be read as values)"
        )
    dt: np.dtype[Any] | None = None
    own = getattr(x, "dtype", None)
    if own is not None:
        try:
            dt = np.dtype(own)
        except TypeError:
            dt = None
    if dt is None:
        dt = np.dtype(cai["typestr"])
    shape = tuple(int(s) for s in cai["shape"])
    raw = cai.get("strides")
    strides = tuple(int(s) for s in raw) if raw is not None else _c_strides(shape, dt.itemsize)
    data = cai.get("data")
    ptr = None if data is None else int(data[0])
    return ArrayInfo(name, shape, strides, dt, ptr)


def _describe_torch(name: str, x: Any) -> ArrayInfo:
    """A torch tensor, read duck-typed (torch is never imported here).

    torch's __cuda_array_interface__ refuses bfloat16, so the tensor's own accessors are used;
    torch.float16 -> 'float16' matches the NumPy dtype names of the DTYPES table.
    """
    if getattr(x, "is_cuda", True) is False:
        raise ValueError(f"{name}: a CPU tensor; move it to the GPU (.cuda()) or pass NumPy")
    dt_name = str(x.dtype).removeprefix("torch.")
    infos = {np.dtype(i.numpy).name: np.dtype(i.numpy) for i in DTYPES.values()}
    if dt_name not in infos:
        raise ValueError(
            f"{name}.dtype={x.dtype}: unsupported; use torch.float32, float16 or bfloat16"
        )
    size = int(x.element_size())
    strides = tuple(int(s) * size for s in x.stride())
    shape = tuple(int(n) for n in x.shape)
    return ArrayInfo(name, shape, strides, infos[dt_name], int(x.data_ptr()))


def _pointer(x: Any) -> int | None:
    ptr = getattr(x, "ptr", None)
    if ptr is not None and not callable(ptr):
        return int(ptr)
    gpudata = getattr(x, "gpudata", None)
    return None if gpudata is None else int(gpudata)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for extent in reversed(shape):
        out.append(step)
        step *= max(extent, 1)
    return tuple(reversed(out))


Strides3 = tuple[int, int, int]


@dataclass(frozen=True)
class Problem:
    """A validated attention problem: sizes, element strides (batch, head, token), pointers."""

    b: int
    h: int
    tq: int
    tk: int
    d: int
    dtype: str
    q_strides: Strides3
    k_strides: Strides3
    v_strides: Strides3
    o_strides: Strides3 | None = None
    q_ptr: int | None = None
    k_ptr: int | None = None
    v_ptr: int | None = None
    o_ptr: int | None = None
    lse_ptr: int | None = None
    h_kv: int = 0  # K/V heads (grouped-query attention); 0 means h (plain multi-head)
    dv: int = 0  # head dim of v and o; 0 means d

    @property
    def value_dim(self) -> int:
        """Head dim of v and o: d unless the problem has its own (DeepSeek's MLA: 128 < 192)."""
        return self.dv or self.d

    @property
    def kv_heads(self) -> int:
        """Heads of K and V: h for multi-head attention, fewer for GQA, 1 for MQA."""
        return self.h_kv or self.h

    @property
    def kv_group(self) -> int:
        """Query heads per K/V head: query head i reads K/V head i // kv_group."""
        return self.h // self.kv_heads

    @property
    def itemsize(self) -> int:
        """Bytes per element of Q, K, V and O."""
        return DTYPES[self.dtype].itemsize

    def alignment(self, *, pointers: bool = True) -> int:
        """The largest power-of-two element count (<= 16 bytes) every stride (and pointer) obeys."""
        strides = [*self.q_strides, *self.k_strides, *self.v_strides, *(self.o_strides or ())]
        ptrs = [p for p in (self.q_ptr, self.k_ptr, self.v_ptr, self.o_ptr) if p is not None]
        align = MAX_ALIGN_BYTES // self.itemsize
        while align > 1:
            ok = all(s % align == 0 for s in strides)
            if ok and pointers:
                ok = all(p % (align * self.itemsize) == 0 for p in ptrs)
            if ok:
                break
            align //= 2
        return max(align, 1)

    def kernel_strides(self) -> tuple[int, ...]:
        """The twelve stride arguments of the kernel ABI (q, k, v, o; batch, head, token)."""
        if self.o_strides is None:
            raise ValueError("o: no output given; validate with o= before launching")
        return (*self.q_strides, *self.k_strides, *self.v_strides, *self.o_strides)


HEAD_DIM_STEP = 8  # every family takes head dims (d and dv) in multiples of this ...
HEAD_DIM_MAX = 256  # ... up to this


def check_head_dims(problem: Problem) -> None:
    """ValueError unless d and dv are multiples of 8 in [8, 256], every family's rule.

    Variant selection says so too, but it needs the GPU: hosts call this first, so a call
    without a GPU names the bad head dim instead of raising GpuUnavailable.
    """
    for label, value in (("d", problem.d), ("dv", problem.value_dim)):
        if value % HEAD_DIM_STEP or not HEAD_DIM_STEP <= value <= HEAD_DIM_MAX:
            raise ValueError(
                f"{label}={value}: must be a multiple of {HEAD_DIM_STEP} in [{HEAD_DIM_STEP}, "
                f"{HEAD_DIM_MAX}] (every kernel family's rule); pad the head dim with zero "
                "columns to a multiple of 8 (zeros in q and k leave q.k unchanged; pass "
                "scale=1/sqrt(d) of the real d), or split it"
            )


def check_scale(scale: float | None, d: int) -> float:
    """The softmax scale to use: 1/sqrt(d) when None, else `scale`, finite and in
    [SCALE_MIN, SCALE_MAX] (positive, with scale * log2(e) a normal float32)."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool):  # float(True) is 1.0: a flag passed by mistake, not a scale
        raise ValueError(f"scale={scale!r}: must be a real number, not a bool; e.g. scale=0.125")
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"scale={scale!r}: must be a real number; e.g. scale=0.125") from None
    if not math.isfinite(value):
        raise ValueError(f"scale={scale!r}: must be finite; pass None for 1/sqrt(d)")
    if not SCALE_MIN <= value <= SCALE_MAX:
        raise ValueError(
            f"scale={scale!r}: must be in [{SCALE_MIN:.3g}, {SCALE_MAX:.3g}] (positive, with "
            "scale*log2(e) a normal float32, as the kernels take it); e.g. scale=0.125, or "
            "None for 1/sqrt(d)"
        )
    return value


def check_layout(
    q: Any, k: Any, v: Any, *, o: Any = None, lse: Any = None, outputs: bool = True
) -> Problem:
    """Every check that needs no kernel spec; return the Problem (raise ValueError otherwise).

    With `outputs` (a forward launch writes o and lse), o and lse must not overlap q, k, v,
    each other, or (o) themselves; the backward passes False: there they are its inputs.
    """
    qi, ki, vi = describe("q", q), describe("k", k), describe("v", v)
    for a in (qi, ki, vi):
        if len(a.shape) != 4:
            raise ValueError(
                f"{a.name}.shape={a.shape}: must have 4 dimensions (B, H, T, d); "
                f"reshape, e.g. {a.name}[None] for a single batch"
            )
    b, h, tq, d = qi.shape
    tk = ki.shape[2]
    h_kv = ki.shape[1]
    for a in (ki, vi):
        if a.shape[0] != b:
            raise ValueError(
                f"{a.name}.shape={a.shape}: batch must equal q's B={b}; "
                f"pass {a.name} with shape ({b}, H_kv, Tk, {d})"
            )
        if h >= 1 and (a.shape[1] < 1 or h % a.shape[1] or a.shape[1] != h_kv):
            raise ValueError(
                f"{a.name}.shape[1]={a.shape[1]}: k and v must have the same number of heads, "
                f"and q's H={h} must be a multiple of it (grouped-query attention: each K/V "
                f"head serves H / H_kv query heads); use H_kv in "
                f"{[n for n in range(1, h + 1) if h % n == 0]}"
            )
    if ki.shape[3] != d:
        raise ValueError(
            f"k.shape[3]={ki.shape[3]}: head dim must equal q's d={d}; "
            "q and k share one head dimension (v may have its own)"
        )
    dv = vi.shape[3]
    if vi.shape[2] != tk:
        raise ValueError(
            f"v.shape[2]={vi.shape[2]}: v must have as many tokens as k (Tk={tk}); "
            "pass k and v of the same length"
        )
    dtype = _check_dtypes(qi, ki, vi)
    _check_sizes(b, h, tq, tk, d)
    if dv != d:
        _check_sizes(b, h, tq, tk, dv)
    strides = [_check_operand(a) for a in (qi, ki, vi)]
    o_strides, o_ptr, taken = None, None, [qi, ki, vi]  # what a later output must not overlap
    if o is not None:
        oi = describe("o", o)
        o_shape = (b, h, tq, dv)
        if oi.shape != o_shape or oi.dtype != qi.dtype:
            raise ValueError(
                f"o: shape {oi.shape} dtype {oi.dtype}: must be {o_shape} {qi.dtype} (q's "
                "batch, heads and length, v's head dim); allocate o like that"
            )
        o_strides = _check_operand(oi)
        _check_no_overlap(oi)
        o_ptr = oi.ptr
        if outputs:
            _check_apart(oi, taken)
            taken.append(oi)
    lse_ptr = None
    if lse is not None:
        li = describe("lse", lse)
        lse_ptr = _check_lse(li, (b, h, tq))
        if outputs:
            _check_apart(li, taken)
    return Problem(
        b, h, tq, tk, d, dtype, strides[0], strides[1], strides[2],
        o_strides=o_strides, q_ptr=qi.ptr, k_ptr=ki.ptr, v_ptr=vi.ptr, o_ptr=o_ptr,
        lse_ptr=lse_ptr, h_kv=0 if h_kv == h else h_kv, dv=0 if dv == d else dv,
    )  # fmt: skip


def _check_dtypes(qi: ArrayInfo, ki: ArrayInfo, vi: ArrayInfo) -> str:
    if not qi.dtype == ki.dtype == vi.dtype:
        raise ValueError(
            f"q/k/v dtypes {qi.dtype}/{ki.dtype}/{vi.dtype}: must be equal; cast all three to "
            "one of " + ", ".join(f"{n} ({np.dtype(i.numpy)})" for n, i in DTYPES.items())
        )
    name = dtype_of_array(qi.dtype)
    if name is None:
        raise ValueError(
            f"dtype={qi.dtype}: unsupported; use float32, float16 or ml_dtypes.bfloat16"
        )
    return name


def _check_sizes(b: int, h: int, tq: int, tk: int, d: int) -> None:
    for label, value in (("B", b), ("H", h), ("Tq", tq), ("Tk", tk), ("d", d)):
        if value < 1:
            raise ValueError(
                f"{label}={value}: must be >= 1; attention over an empty axis is undefined"
            )
    if b > MAX_GRID_YZ:
        raise ValueError(
            f"B={b}: exceeds the CUDA grid.z limit {MAX_GRID_YZ}; split the batch into chunks"
        )
    if h > MAX_GRID_YZ:
        raise ValueError(
            f"H={h}: exceeds the CUDA grid.y limit {MAX_GRID_YZ}; split the heads into chunks"
        )
    for label, value in (("Tq", tq), ("Tk", tk)):
        if value > MAX_LENGTH:
            raise ValueError(
                f"{label}={value}: exceeds the 32-bit length the kernel takes ({MAX_LENGTH}: "
                "2**31 less room for its tile loops); split the sequence"
            )


def _check_operand(a: ArrayInfo) -> Strides3:
    if a.shape[3] > 1 and a.strides[3] != a.dtype.itemsize:
        raise ValueError(
            f"{a.name}.strides[3]={a.strides[3]} bytes: the d axis must be contiguous "
            f"(stride = itemsize {a.dtype.itemsize}); pass a view whose last axis is "
            "contiguous, or a copy"
        )
    sb, sh, st, _ = a.elem_strides()
    return (sb, sh, st)


def _check_no_overlap(a: ArrayInfo) -> None:
    """ValueError unless no two elements of output `a` share an address (several blocks
    would write one row)."""
    for axis, (extent, stride) in enumerate(zip(a.shape, a.strides, strict=True)):
        if extent > 1 and stride == 0:
            raise ValueError(
                f"{a.name}.strides[{axis}]=0 on the {AXES[axis]} axis of extent {extent}: "
                "output rows would overlap; allocate a fresh output array"
            )
    # The axes longer than 1 by increasing |stride|: each must step past everything the axes
    # inside it span. Sufficient, not necessary (a rare interleaving that does not overlap is
    # refused too); the bundle's launcher applies the same rule (elements_apart).
    span = a.dtype.itemsize
    axes = sorted((abs(s), n, i) for i, (n, s) in enumerate(zip(a.shape, a.strides, strict=True)))
    for stride, extent, axis in axes:
        if extent <= 1:
            continue
        if stride < span:
            raise ValueError(
                f"{a.name}.strides={a.strides} bytes (shape {a.shape}): the {AXES[axis]} axis "
                f"steps {stride} bytes, less than the {span} bytes the axes inside it span, so "
                "output elements overlap; allocate a fresh (dense) output array"
            )
        span += stride * (extent - 1)


def byte_span(a: ArrayInfo) -> tuple[int, int] | None:
    """The bytes [lo, hi) array `a` can touch, from its pointer, shape and byte strides (any
    sign); None without a pointer (a host array that is copied anyway)."""
    if a.ptr is None:
        return None
    lo = hi = 0
    for extent, stride in zip(a.shape, a.strides, strict=True):
        step = stride * (extent - 1)
        if step < 0:
            lo += step
        else:
            hi += step
    return a.ptr + lo, a.ptr + hi + a.dtype.itemsize


def check_slopes_apart(o: Any, lse: Any, slopes_ptr: int, heads: int) -> None:
    """ValueError when output o or lse overlaps the `heads` fp32 ALiBi slopes at `slopes_ptr`
    (read by every block while others write the outputs); the bundle refuses the same."""
    slopes = ArrayInfo("alibi_slopes", (heads,), (4,), np.dtype(np.float32), slopes_ptr)
    for name, x in (("o", o), ("lse", lse)):
        _check_apart(describe(name, x), [slopes])


def _check_apart(out: ArrayInfo, others: list[ArrayInfo]) -> None:
    """ValueError when output `out` overlaps one of `others` (the inputs, or an output checked
    before): the kernels read the inputs while other blocks write the outputs."""
    mine = byte_span(out)
    if mine is None:
        return
    for other in others:
        theirs = byte_span(other)
        if theirs is not None and mine[0] < theirs[1] and theirs[0] < mine[1]:
            raise ValueError(
                f"{out.name} (bytes {mine[0]:#x}..{mine[1]:#x}) overlaps {other.name} (bytes "
                f"{theirs[0]:#x}..{theirs[1]:#x}): an output must not share memory with an "
                f"input or another output; allocate a fresh {out.name}"
            )


def _check_lse(a: ArrayInfo, shape: tuple[int, int, int]) -> int | None:
    if a.shape != shape or a.dtype != np.float32:
        raise ValueError(
            f"lse: shape {a.shape} dtype {a.dtype}: must be float32 of shape {shape} (B, H, Tq); "
            "allocate it with that shape and dtype"
        )
    if a.strides != _c_strides(a.shape, 4):
        raise ValueError(
            f"lse.strides={a.strides}: must be C-contiguous {_c_strides(a.shape, 4)}; "
            "allocate a fresh contiguous lse"
        )
    if a.ptr is not None and a.ptr % 4:
        raise ValueError(f"lse pointer {a.ptr:#x}: must be 4-byte aligned; allocate a fresh lse")
    return a.ptr


def check_spec(spec: KernelSpec, problem: Problem, *, check_pointers: bool = True) -> None:
    """The checks that depend on the variant: d, dtype and the alignment it needs."""
    if problem.d != spec.d:
        raise ValueError(
            f"d={problem.d}: variant {spec.name} is compiled for d={spec.d}; "
            f"pass inputs with head dim {spec.d}, or a spec with d={problem.d}"
        )
    if problem.value_dim != spec.dv:
        raise ValueError(
            f"dv={problem.value_dim}: variant {spec.name} is compiled for a value head dim of "
            f"{spec.dv}; pass v with head dim {spec.dv}, or a spec with dv={problem.value_dim}"
        )
    if problem.dtype != spec.dtype:
        raise ValueError(
            f"dtype={problem.dtype}: variant {spec.name} is compiled for {spec.dtype}; "
            f"cast the inputs to {spec.dtype}, or pass a spec with dtype={problem.dtype!r}"
        )
    limit = accurate_length(spec)
    if problem.tk > limit:
        warnings.warn(
            f"Tk={problem.tk}: beyond {limit} keys the fp32 accumulation of {spec.family} "
            f"{spec.dtype} variants drifts past docs/design.md's error rule (issue 9: O off by "
            f"7.4e-3 at Tk=290M, bf16); for full accuracy split K/V into chunks of at most "
            f"{limit} keys and merge the outputs with their LSEs",
            AccuracyWarning,
            stacklevel=3,
        )
    align = spec.align_elems
    size = problem.itemsize
    ops = [("q", problem.q_strides, problem.q_ptr), ("k", problem.k_strides, problem.k_ptr)]
    ops += [("v", problem.v_strides, problem.v_ptr)]
    if problem.o_strides is not None:
        ops.append(("o", problem.o_strides, problem.o_ptr))
    for name, strides, ptr in ops:
        for axis, stride in zip(AXES, strides, strict=False):
            if stride % align:
                raise ValueError(
                    f"{name} {axis} stride={stride} elements: family {spec.family} needs "
                    f"multiples of {align} ({align * size} bytes); pass a contiguous copy "
                    "or pad the layout"
                )
        if check_pointers and ptr is not None and ptr % (align * size):
            raise ValueError(
                f"{name} pointer {ptr:#x}: family {spec.family} needs {align * size}-byte "
                "alignment; slice at a multiple of that offset or pass a copy"
            )


def validate_inputs(
    spec: KernelSpec,
    q: Any,
    k: Any,
    v: Any,
    *,
    o: Any = None,
    lse: Any = None,
    check_pointers: bool = True,
) -> Problem:
    """All checks for launching `spec` on (q, k, v[, o, lse]); return the Problem.

    `check_pointers=False` skips pointer alignment: for host arrays that are copied into fresh
    (256-byte aligned) device buffers, their host addresses do not matter.
    """
    problem = check_layout(q, k, v, o=o, lse=lse)
    check_spec(spec, problem, check_pointers=check_pointers)
    return problem


def check_spec_type(spec: Any) -> None:
    """ValueError unless `spec` is a forward KernelSpec (the forward entry points run those)."""
    if not isinstance(spec, KernelSpec):
        raise ValueError(
            f"spec={spec!r}: must be a KernelSpec; e.g. KernelSpec(d=64, dtype='fp16')"
        )
    if spec.direction != "fwd":
        raise ValueError(
            f"spec={spec.name}: a direction={spec.direction!r} variant; the forward runs "
            "direction='fwd' variants (backward ones run through the backward pass, decode ones "
            "through flashgen.torch.attention_with_kvcache)"
        )


def check_spec_fits_call(spec: KernelSpec, problem: Problem, causal: bool) -> None:
    """ValueError unless `spec` was compiled for this call's causal flag (d, dtype: check_spec)."""
    check_spec_type(spec)
    if spec.causal != causal:
        raise ValueError(
            f"causal={causal}: spec {spec.name} is compiled with causal={spec.causal}; "
            f"pass causal={spec.causal} or a spec with causal={causal}"
        )
    # d and dtype: check_spec names them with the same value/rule/fix shape
