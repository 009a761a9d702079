"""`flashgen.attention_with_kvcache`: decode against a K/V cache on NumPy arrays or GPUArrays.

The same call as `flashgen.torch.attention_with_kvcache` (layouts, features, lengths, pages:
`runtime/decode_call.py`) for the PyCUDA side of the API, as `flashgen.attention` is for the
forward: NumPy inputs are checked (their lengths and page indices too), copied to the GPU and
the output copied back; PyCUDA GPUArrays and CUDA-array-interface objects (CuPy, Numba) are
used in place, on the legacy default stream, with new GPUArrays out. torch tensors go to
`flashgen.torch.attention_with_kvcache`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flashgen.generator.features import RUNTIME_FEATURES, FeatureKeywords
from flashgen.generator.numerics import LOG2E
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import array_args, feature_values, launch
from flashgen.runtime import gpu as runtime
from flashgen.runtime.array_args import host_info
from flashgen.runtime.decode import DecodeLaunch, decode_spec, row_tiles, scratch_sizes
from flashgen.runtime.decode_call import DecodeOperands, check_operands, choose_launch
from flashgen.runtime.validate import check_scale, describe

if TYPE_CHECKING:
    from typing_extensions import Unpack  # Python 3.10 has no typing.Unpack

__all__ = ["attention_with_kvcache"]


def attention_with_kvcache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    cache_seqlens: Any = None,
    *,
    block_table: Any = None,
    causal: bool = False,
    scale: float | None = None,
    num_splits: int = 0,
    return_lse: bool = False,
    spec: KernelSpec | None = None,
    **features: Unpack[FeatureKeywords],
) -> Any:
    """softmax(Q·Kᵀ·scale + mask)·V of new query rows against a K/V cache; O (and LSE).

    q is (B, Tq, H, d); k_cache, v_cache are (B, Tk, H_kv, d), or, with `block_table` (int32
    (B, pages per sequence)), pages (n_pages, page_size, H_kv, d) of any page size: key j of
    sequence b is row j % page_size of page block_table[b, j // page_size]. `cache_seqlens`:
    int32 (B,) (the keys each sequence holds, its Tq new tokens the last of them), one int
    for all, or None for the whole cache. H a multiple of H_kv; float16 or bfloat16
    (ml_dtypes.bfloat16 with NumPy); d a multiple of 8 up to 256, v's own head dim too.
    `causal` aligns the new rows with the last keys (row i sees keys j <= i + L - Tq);
    `num_splits` > 0 forces the split count (0: chosen from the shapes); features as in
    `flashgen.attention` (`window=(left, right)`, `softcap=c`, `alibi_slopes` float32 (H,)).
    Returns O (B, Tq, H, dv) in q's dtype, or (O, LSE) with `return_lse` (LSE float32
    (B, H, Tq), natural log; -inf for a row that sees no key).

    NumPy inputs: every array NumPy (lengths and block table too), each length checked
    against the capacity and each page index against the pages (ValueError), copied to the
    GPU; O and LSE come back as NumPy arrays. Device inputs (GPUArrays, or CUDA-array-interface
    objects): the lengths and block table as device arrays too, used in place; a length
    outside [0, capacity] or a page index outside [0, n_pages) cannot be checked without
    waiting for the GPU, so that sequence's rows come back NaN (O and LSE), never silently
    wrong. The call runs on the legacy default stream and does not wait for it.

    Example (needs an NVIDIA GPU and PyCUDA)::

        import numpy as np
        import flashgen

        rng = np.random.default_rng(0)
        q = rng.standard_normal((4, 1, 8, 128)).astype(np.float16)
        k_cache, v_cache = (rng.standard_normal((4, 1024, 2, 128)).astype(np.float16)
                            for _ in range(2))
        lens = np.array([1024, 7, 0, 300], np.int32)
        o = flashgen.attention_with_kvcache(q, k_cache, v_cache, lens)
        print(o.shape)  # (4, 1, 8, 128)
    """
    if isinstance(cache_seqlens, (bool, np.bool_)):
        raise ValueError(
            f"cache_seqlens={cache_seqlens!r}: must be an int32 (B,) array, an int or None"
        )
    if isinstance(cache_seqlens, np.integer):
        cache_seqlens = int(cache_seqlens)
    lens = None if cache_seqlens is None or isinstance(cache_seqlens, int) else cache_seqlens
    kind = array_args.kind_of(
        _NAMES, (q, k_cache, v_cache, lens, block_table), "flashgen.torch.attention_with_kvcache"
    )  # fmt: skip
    if kind == array_args.TORCH:
        from flashgen import torch as fg_torch

        return fg_torch.attention_with_kvcache(
            q, k_cache, v_cache, cache_seqlens, block_table=block_table, causal=causal,
            scale=scale, num_splits=num_splits, return_lse=return_lse, spec=spec, **features,
        )  # fmt: skip
    if causal is not True and causal is not False:
        raise ValueError(f"causal={causal!r}: must be True or False")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(
            f"num_splits={num_splits!r}: must be an int >= 0 (0: chosen from the shapes)"
        )
    if spec is not None and not isinstance(spec, KernelSpec):
        raise ValueError(f"spec={spec!r}: must be a decode KernelSpec or None")
    values = feature_values.from_keywords(features, "flashgen.attention_with_kvcache")
    if scale is not None:
        check_scale(scale, 1)  # a bool or a bad value named before a remembered call skips it
    seqlen = None if lens is not None else cache_seqlens
    call = _Call(causal, scale, num_splits, spec)
    if kind == array_args.DEVICE:
        o, lse = _on_device(q, k_cache, v_cache, lens, seqlen, block_table, call, values)
        return (o, lse) if return_lse else o
    q, k_cache, v_cache = (np.ascontiguousarray(x) for x in (q, k_cache, v_cache))
    ops = check_operands(
        host_info("q", q), host_info("k_cache", k_cache), host_info("v_cache", v_cache),
        None if block_table is None else host_info("block_table", block_table),
        None if lens is None else host_info("cache_seqlens", lens), seqlen,
    )  # fmt: skip
    check_scale(scale, ops.d)
    _check_host_values(ops, lens, block_table)
    hosted = tuple(
        f.host_array(v, ops.h) if f.array and v is not None else v
        for f, v in zip(RUNTIME_FEATURES, values, strict=True)
    )

    # Validation is done; from here on the GPU is needed.
    dq, dk, dv = (runtime.to_device(x) for x in (q, k_cache, v_cache))
    dlens = None if lens is None else runtime.to_device(np.ascontiguousarray(lens))
    dtable = None if block_table is None else runtime.to_device(np.ascontiguousarray(block_table))
    on_gpu = tuple(
        runtime.to_device(v) if f.array and v is not None else v
        for f, v in zip(RUNTIME_FEATURES, hosted, strict=True)
    )
    o, lse = _on_device(dq, dk, dv, dlens, seqlen, dtable, call, on_gpu, remember=False)
    runtime.gpu().drv.Context.synchronize()  # to_host would wait anyway; this names a failure
    o, lse = runtime.to_host(o), runtime.to_host(lse)
    return (o, lse) if return_lse else o


@dataclass(frozen=True)
class _Call:
    """A call's scalar arguments."""

    causal: bool
    scale: float | None
    num_splits: int
    spec: KernelSpec | None


@dataclass(frozen=True)
class _Entry:
    """A validated device signature: its launch, output shapes and split scratch sizes."""

    launch: DecodeLaunch
    o_shape: tuple[int, int, int, int]
    scratch: tuple[int, int, int]
    dtype: np.dtype[Any]


_NAMES = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table")
_entries: dict[tuple[Any, ...], _Entry] = {}  # GPUArray signatures (launch.remember's bound)


def _check_host_values(ops: DecodeOperands, lens: Any, table: Any) -> None:
    """NumPy lengths within the capacity and page indices within the pages: checked here, as
    the device path cannot without waiting."""
    capacity = ops.tk
    if lens is not None:
        bad = np.flatnonzero((lens < 0) | (lens > capacity))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"cache_seqlens[{i}]={int(lens[i])}: must be in [0, {capacity}] (the cache's "
                "capacity); pass each sequence's number of cached keys"
            )
    if table is not None and lens is not None and ops.page_size:
        # only the pages a sequence's keys reach are read: check those
        used = -(-lens.astype(np.int64) // ops.page_size)
        cols = np.arange(table.shape[1])[None, :] < used[:, None]
        bad_pages = cols & ((table < 0) | (table >= ops.n_pages))
    elif table is not None:
        reach = -(-capacity // ops.page_size) if ops.page_size else 0
        bad_pages = np.zeros(table.shape, bool)
        bad_pages[:, :reach] = (table[:, :reach] < 0) | (table[:, :reach] >= ops.n_pages)
    else:
        return
    where = np.argwhere(bad_pages)
    if where.size:
        b, j = (int(n) for n in where[0])
        raise ValueError(
            f"block_table[{b}, {j}]={int(table[b, j])}: must be a page index in "
            f"[0, {ops.n_pages}); pass indices into k_cache's first axis"
        )


def _on_device(
    q: Any, k: Any, v: Any, lens: Any, seqlen: int | None, table: Any, call: _Call,
    values: feature_values.Values, remember: bool = True,
) -> tuple[Any, Any]:  # fmt: skip
    """Launch on device arrays; new GPUArrays O and LSE. A GPUArray signature seen before skips
    validation and selection (`remember` False: a NumPy call's fresh copies, not kept);
    CUDA-array-interface inputs are validated every call, and the launch waits (on the GPU)
    for the streams their interfaces name."""
    arrays = (q, k, v, lens, table)
    key = array_args.signature_key(arrays, (seqlen, call), values) if remember else None
    e = _entries.get(key) if key is not None else None
    if e is None:
        e = _prepare(q, k, v, lens, seqlen, table, call, values)
        if key is not None:
            launch.remember(_entries, key, e)
    b, tq, h, dv = e.o_shape
    o = runtime.empty(e.o_shape, e.dtype, pooled=True)
    lse = runtime.empty((b, h, tq), np.float32, pooled=True)
    n_o, n_l, n_c = e.scratch
    o_part = runtime.empty((n_o,), np.float32, pooled=True) if n_o else None
    lse_part = runtime.empty((n_l,), np.float32, pooled=True) if n_l else None
    if key is None:  # CUDA-array-interface inputs: after the work of the streams they name
        streams = array_args.producer_streams(list(zip(_NAMES, arrays, strict=True)), values)
        launch.wait_for_streams(streams, 0)
    counters = runtime.decode_counters(n_c)  # held through the launch (another thread may swap)
    pointers = (
        *(array_args.device_ptr(x) for x in (q, k, v, o, lse, o_part, lse_part)),
        int(counters.gpudata), array_args.device_ptr(lens), array_args.device_ptr(table),
    )  # fmt: skip
    e.launch(pointers, 0)
    return o, lse


def _prepare(
    q: Any, k: Any, v: Any, lens: Any, seqlen: int | None, table: Any, call: _Call,
    values: feature_values.Values,
) -> _Entry:  # fmt: skip
    """First call of a device signature: validate, choose and load the variant, bind."""
    ops = check_operands(
        describe("q", q), describe("k_cache", k), describe("v_cache", v),
        None if table is None else describe("block_table", table),
        None if lens is None else describe("cache_seqlens", lens), seqlen,
    )  # fmt: skip
    array_args.require_pointers(_NAMES, (q, k, v, lens, table))
    scale_log2 = check_scale(call.scale, ops.d) * LOG2E
    features = feature_values.bind(values, array_args.feature_pointer(ops.h))
    group = ops.h // ops.h_kv
    spec = decode_spec(ops.d, ops.dv, ops.dtype, call.causal, ops.tq * group, features.tokens)
    if call.spec is not None:
        want = (ops.d, ops.dv, ops.dtype, call.causal, tuple(features.tokens))
        got = call.spec
        if got.direction != "decode" or (
            got.d, got.dv, got.dtype, got.causal, got.features
        ) != want:  # fmt: skip
            raise ValueError(
                f"spec={got.name!r}: must be a decode KernelSpec for d={ops.d}, dv={ops.dv}, "
                f"dtype={ops.dtype}, causal={call.causal}, features={want[4]}; e.g. {spec.name}"
            )
        spec = got
    tiles = row_tiles(spec, ops.tq, group)
    spec, plan, n_splits = choose_launch(
        spec, call.spec is not None, runtime.get_function, ops.b * ops.h_kv * tiles, ops.tk,
        call.num_splits,
    )  # fmt: skip
    o_strides = (ops.tq * ops.h * ops.dv, ops.dv, ops.h * ops.dv)  # a fresh (B, Tq, H, dv)
    return _Entry(
        DecodeLaunch(plan, ops.shape(scale_log2, o_strides), n_splits, features),
        (ops.b, ops.tq, ops.h, ops.dv), scratch_sizes(spec, ops.b, ops.h_kv, tiles, n_splits),
        np.dtype(describe("q", q).dtype),
    )  # fmt: skip

