"""`flashgen.attention_varlen`: attention over packed sequences on NumPy arrays or GPUArrays.

The forward of `flashgen.torch.flash_attn_varlen_func` (layouts and semantics: flashgen/varlen.py)
for the PyCUDA side of the API, as `flashgen.attention` is for dense batches: NumPy inputs are
checked (the sequence boundaries too), copied to the GPU and the output copied back; PyCUDA
GPUArrays and CUDA-array-interface objects are used in place, on the legacy default stream,
with new GPUArrays out. torch tensors go to `flashgen.torch.flash_attn_varlen_func`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flashgen.generator.features import RUNTIME_FEATURES, FeatureKeywords
from flashgen.generator.numerics import LOG2E
from flashgen.generator.select import select
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import array_args, feature_values, launch
from flashgen.runtime import gpu as runtime
from flashgen.runtime.array_args import host_info
from flashgen.runtime.decode_call import INT_MAX, check_int_array
from flashgen.runtime.validate import (
    ArrayInfo,
    check_layout,
    check_scale,
    check_spec,
    check_spec_fits_call,
    describe,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack  # Python 3.10 has no typing.Unpack

__all__ = ["attention_varlen"]

_NAMES = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")


def attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    spec: KernelSpec | None = None,
    **features: Unpack[FeatureKeywords],
) -> Any:
    """softmax(Q·Kᵀ·scale + mask)·V of each packed sequence on its own; O (and LSE).

    q is (total_q, H, d), k and v (total_k, H_kv, d) and (total_k, H_kv, dv), float16 or
    bfloat16 (ml_dtypes.bfloat16 with NumPy), the d axis contiguous; `cu_seqlens_q` and
    `cu_seqlens_k` int32 (n_seqs + 1,), the prefix sums of the lengths: sequence b is rows
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q (and O) and cu_seqlens_k[b] ..
    cu_seqlens_k[b + 1] - 1 of k and v (zero-length sequences allowed). `max_seqlen_q` /
    `max_seqlen_k`: the longest lengths, which size the grid only (NumPy: always read from
    the prefix sums, given ones only checked; device arrays: the totals when None, a coarser
    grid). H a multiple
    of H_kv. `causal` masks key j for query i when j > i + len_k - len_q in each sequence;
    features as in `flashgen.attention` (`window=(left, right)`, `softcap=c`, `alibi_slopes`
    float32 (H,)), each per sequence. Returns O (total_q, H, dv) in q's dtype, or (O, LSE)
    with `return_lse` (LSE float32 (H, total_q), natural log; -inf for a row that sees no
    key). `spec` names the variant (a forward KernelSpec with the `varlen` feature); None
    chooses one. Needs an sm_90 GPU (family wgmma's varlen forward).

    NumPy inputs (every array NumPy): the prefix sums are checked too -- they start at 0 for
    q, never decrease, and end within q's and k's rows (ValueError naming the entry) -- then
    copied to the GPU; O and LSE come back as NumPy arrays. Device inputs (GPUArrays or
    CUDA-array-interface objects, every array) are used in place and not read on the host:
    a sequence whose key rows fall outside k gets NaN rows, one whose query rows are out of
    order gets nothing written, rows after the last sequence get zeros (LSE -inf). The call
    runs on the legacy default stream and does not wait for it.

    Example (needs a Hopper GPU and PyCUDA)::

        import numpy as np
        import flashgen

        rng = np.random.default_rng(0)
        cu = np.array([0, 700, 1900, 4096], np.int32)
        q, k, v = (rng.standard_normal((4096, 16, 128)).astype(np.float16) for _ in "qkv")
        o = flashgen.attention_varlen(q, k, v, cu, cu, causal=True)  # (4096, 16, 128)
    """
    kind = array_args.kind_of(
        _NAMES, (q, k, v, cu_seqlens_q, cu_seqlens_k), "flashgen.torch.flash_attn_varlen_func"
    )  # fmt: skip
    values = feature_values.from_keywords(features, "flashgen.attention_varlen")
    if kind == array_args.TORCH:
        return _torch_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal, scale, return_lse, spec, features)  # fmt: skip
    if causal is not True and causal is not False:
        raise ValueError(f"causal={causal!r}: must be True or False")
    if scale is not None:
        check_scale(scale, 1)  # a bool or a bad value named before a remembered call skips it
    if spec is not None and not isinstance(spec, KernelSpec):
        raise ValueError(f"spec={spec!r}: must be a forward KernelSpec with the varlen feature")
    if kind == array_args.DEVICE:
        call = _Call(_max_or_none("max_seqlen_q", max_seqlen_q),
                     _max_or_none("max_seqlen_k", max_seqlen_k), causal, scale, spec)  # fmt: skip
        o, lse = _on_device(q, k, v, cu_seqlens_q, cu_seqlens_k, call, values)
        return (o, lse) if return_lse else o
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    cu_q, cu_k = (np.ascontiguousarray(x) for x in (cu_seqlens_q, cu_seqlens_k))
    problem = check_layout(
        *(_packed(n, host_info(n, x)) for n, x in zip("qkv", (q, k, v), strict=True))
    )
    _check_dtype(problem.dtype, q.dtype)
    _check_sequences(host_info("cu_seqlens_q", cu_q), host_info("cu_seqlens_k", cu_k))
    longest = _check_host_sequences(cu_q, cu_k, problem.tq, problem.tk)
    _max_or_none("max_seqlen_q", max_seqlen_q)  # checked; the prefix sums give the truth
    _max_or_none("max_seqlen_k", max_seqlen_k)
    check_scale(scale, problem.d)
    hosted = tuple(
        f.host_array(val, problem.h) if f.array and val is not None else val
        for f, val in zip(RUNTIME_FEATURES, values, strict=True)
    )

    # Validation is done; from here on the GPU is needed.
    dq, dk, dv, dcu_q, dcu_k = (runtime.to_device(x) for x in (q, k, v, cu_q, cu_k))
    on_gpu = tuple(
        runtime.to_device(val) if f.array and val is not None else val
        for f, val in zip(RUNTIME_FEATURES, hosted, strict=True)
    )
    call = _Call(longest[0], longest[1], causal, scale, spec)
    o, lse = _on_device(dq, dk, dv, dcu_q, dcu_k, call, on_gpu, remember=False)
    runtime.gpu().drv.Context.synchronize()  # to_host would wait anyway; this names a failure
    o, lse = runtime.to_host(o), runtime.to_host(lse)
    return (o, lse) if return_lse else o


@dataclass(frozen=True)
class _Call:
    """A call's scalar arguments (max lengths None: the packed totals)."""

    max_q: int | None
    max_k: int | None
    causal: bool
    scale: float | None
    spec: KernelSpec | None


@dataclass(frozen=True)
class _Entry:
    """A validated device signature: its bound launch and output shapes."""

    bound: launch.Bound
    o_shape: tuple[int, int, int]
    dtype: np.dtype[Any]


@dataclass(frozen=True)
class _View:
    """A (1, H, total, d) view of a packed (total, H, d) array, as `check_layout` reads one."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype[Any]
    ptr: int | None


_entries: dict[tuple[Any, ...], _Entry] = {}  # GPUArray signatures (launch.remember's bound)


def _check_dtype(name: str, dtype: Any) -> None:
    """The varlen kernels' storage dtypes (family wgmma: 16-bit tensor-core operands)."""
    if name not in ("fp16", "bf16"):
        raise ValueError(
            f"q.dtype={np.dtype(dtype)}: the varlen kernels take float16 or bfloat16 "
            "(ml_dtypes.bfloat16 with NumPy); convert q, k and v"
        )


def _max_or_none(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
        0 <= value <= INT_MAX
    ):  # fmt: skip
        raise ValueError(
            f"{name}={value!r}: must be an int in [0, 2^31) (the longest sequence's length), "
            "or None"
        )
    return int(value)


def _packed(name: str, a: ArrayInfo) -> _View:
    """The (1, H, total, d) view of packed (total, H, d) `a`."""
    if len(a.shape) != 3:
        raise ValueError(f"{name}.shape={a.shape}: must be 3-D (total tokens, heads, head dim)")
    total, h, d = a.shape
    st, sh, sd = a.strides
    return _View((1, h, total, d), (total * st, sh, st, sd), a.dtype, a.ptr)


def _check_sequences(cu_q: ArrayInfo, cu_k: ArrayInfo) -> int:
    """The number of sequences, once both prefix sums are int32 (n_seqs + 1,)."""
    if len(cu_q.shape) != 1 or cu_q.shape[0] < 1:
        raise ValueError(
            f"cu_seqlens_q.shape={cu_q.shape}: must be (n_seqs + 1,), the int32 prefix sums"
        )
    n = cu_q.shape[0]
    check_int_array(cu_q, (n,))
    check_int_array(cu_k, (n,))
    return n - 1


def _check_host_sequences(
    cu_q: np.ndarray, cu_k: np.ndarray, total_q: int, total_k: int
) -> tuple[int, int]:
    """Prefix sums read on the host: q's start at 0, neither decreases, each ends within its
    rows; (the longest query, the longest key sequence)."""
    for name, cu, total in (("cu_seqlens_q", cu_q, total_q), ("cu_seqlens_k", cu_k, total_k)):
        if name == "cu_seqlens_q" and cu[0] != 0:
            raise ValueError(
                f"cu_seqlens_q[0]={int(cu[0])}: must be 0 (rows before it would be left "
                "unwritten); pass the prefix sums starting at 0"
            )
        if cu[0] < 0:
            raise ValueError(f"{name}[0]={int(cu[0])}: must be >= 0")
        drops = np.flatnonzero(np.diff(cu.astype(np.int64)) < 0)
        if drops.size:
            i = int(drops[0])
            raise ValueError(
                f"{name}[{i + 1}]={int(cu[i + 1])} < {name}[{i}]={int(cu[i])}: prefix sums "
                "never decrease; pass the running totals of the lengths"
            )
        if cu[-1] > total:
            raise ValueError(
                f"{name}[-1]={int(cu[-1])}: past the {total} packed rows; the last prefix sum "
                "is at most the total"
            )
    lens_q, lens_k = np.diff(cu_q.astype(np.int64)), np.diff(cu_k.astype(np.int64))
    return (int(lens_q.max(initial=0)), int(lens_k.max(initial=0)))


def _on_device(
    q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, call: _Call, values: feature_values.Values,
    remember: bool = True,
) -> tuple[Any, Any]:  # fmt: skip
    """Launch on device arrays; new GPUArrays O and LSE. A GPUArray signature seen before skips
    validation and selection (`remember` False: a NumPy call's fresh copies, not kept);
    CUDA-array-interface inputs are validated every call, and the launch waits (on the GPU)
    for the streams their interfaces name."""
    arrays = (q, k, v, cu_q, cu_k)
    key = array_args.signature_key(arrays, (call,), values) if remember else None
    e = _entries.get(key) if key is not None else None
    if e is None:
        e = _prepare(q, k, v, cu_q, cu_k, call, values)
        if key is not None:
            launch.remember(_entries, key, e)
    total, h, _ = e.o_shape
    o = runtime.empty(e.o_shape, e.dtype, pooled=True)
    lse = runtime.empty((h, total), np.float32, pooled=True)
    if key is None:  # CUDA-array-interface inputs: after the work of the streams they name
        streams = array_args.producer_streams(list(zip(_NAMES, arrays, strict=True)), values)
        launch.wait_for_streams(streams, 0)
    ptr = array_args.device_ptr
    # the tile scheduler's two counter words: the runtime's kernel-restored zeros (every call
    # here runs on the legacy default stream, which orders them); held through the launch
    counter = runtime.decode_counters(2)
    e.bound(ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse), 0, ptr(cu_q), ptr(cu_k),
            counter=int(counter.gpudata))  # fmt: skip
    return o, lse


def _prepare(
    q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, call: _Call, values: feature_values.Values
) -> _Entry:
    """First call of a device signature: validate, select and load the variant, bind."""
    n_seqs = _check_sequences(describe("cu_seqlens_q", cu_q), describe("cu_seqlens_k", cu_k))
    array_args.require_pointers(_NAMES, (q, k, v, cu_q, cu_k))
    qv, kv, vv = (_packed(n, describe(n, x)) for n, x in zip("qkv", (q, k, v), strict=True))
    total_q, total_k, h, dv = qv.shape[2], kv.shape[2], qv.shape[1], vv.shape[3]
    for name, value, total in (("max_seqlen_q", call.max_q, total_q),
                               ("max_seqlen_k", call.max_k, total_k)):  # fmt: skip
        if value is not None and value > total:
            raise ValueError(
                f"{name}={value}: longer than the {total} packed tokens; pass the longest "
                "sequence's length"
            )
    dtype = np.dtype(qv.dtype)
    size = dtype.itemsize
    o_view = _View((1, h, total_q, dv), (total_q * h * dv * size, dv * size, h * dv * size, size),
                   dtype, None)  # fmt: skip
    lse_view = _View(
        (1, h, total_q), (h * total_q * 4, total_q * 4, 4), np.dtype(np.float32), None
    )
    problem = check_layout(qv, kv, vv, o=o_view, lse=lse_view)
    _check_dtype(problem.dtype, dtype)
    scale_log2 = check_scale(call.scale, problem.d) * LOG2E
    features = feature_values.bind(values, array_args.feature_pointer(h))
    if call.spec is not None:
        if "varlen" not in call.spec.features:
            raise ValueError(
                f"spec {call.spec.name}: not a varlen variant; add 'varlen' to its features"
            )
        check_spec_fits_call(call.spec, problem, call.causal)
        spec = call.spec
    else:
        spec = select(
            problem.d, problem.dtype, call.causal, runtime.device_arch(),
            alignment=problem.alignment(pointers=True), gpu_name=runtime.device_name(),
            features=(*features.tokens, "varlen"), dv=problem.value_dim,
        )  # fmt: skip
    check_spec(spec, problem, check_pointers=True)
    plan = runtime.get_function(spec)
    sizes = launch.Varlen(
        n_seqs=n_seqs,
        max_q=total_q if call.max_q is None else call.max_q,
        max_k=total_k if call.max_k is None else call.max_k,
    )
    pointer_free = dataclasses.replace(
        problem, q_ptr=None, k_ptr=None, v_ptr=None, o_ptr=None, lse_ptr=None
    )
    bound = plan.bind(pointer_free, scale_log2, features, varlen=sizes)
    return _Entry(bound, (total_q, h, dv), dtype)


def _torch_call(
    q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: Any, max_k: Any, causal: bool,
    scale: float | None, return_lse: bool, spec: KernelSpec | None, features: Mapping[str, Any],
) -> Any:  # fmt: skip
    """torch tensors: `flashgen.torch.flash_attn_varlen_func`, the max lengths the totals when
    None (they size the grid only; reading them from the device would wait for the GPU)."""
    from flashgen import torch as fg_torch

    max_q, max_k = _max_or_none("max_seqlen_q", max_q), _max_or_none("max_seqlen_k", max_k)
    return fg_torch.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, int(q.shape[0]) if max_q is None else max_q,
        int(k.shape[0]) if max_k is None else max_k, softmax_scale=scale, causal=causal,
        window_size=features.get("window") or (-1, -1), softcap=features.get("softcap") or 0.0,
        alibi_slopes=features.get("alibi_slopes"), return_lse=return_lse, spec=spec,
    )  # fmt: skip
