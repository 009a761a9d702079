"""Tensor maps for the `wgmma` family's TMA loads (its kernels' leading launch arguments).

A `wgmma` kernel takes three `CUtensorMap`s by value (`__grid_constant__`), then the problem's
heads and batch (its grid of persistent blocks is one-dimensional), before the C ABI every
family shares. The maps: Q with boxes of BR rows, K and V with boxes of BC rows, each box 64
columns (128 bytes) wide and 128-byte swizzled. They are encoded on the host with the driver's
`cuTensorMapEncodeTiled` (ctypes on libcuda, which PyCUDA has loaded already) and cached by
everything they depend on, so a repeated call re-encodes nothing.

The maps go ahead of the common arguments through launch.py's prefix-args hook (launch.py
calls `cuLaunchKernel` with an array of pointers to each argument; PyCUDA's `prepared_call`
cannot pass them: its packed parameter buffer gave "illegal instruction" on the H200).

A forward that stores O with the TMA (`WgmmaFamily.o_tma_store`: the unhooked forwards whose
staging fits) takes a fourth map after V's, O's, with boxes of 64 rows (one consumer
warpgroup's) and the same 64-column, 128-byte-swizzled layout; its row extent is Tq, so the
store clips a last partial tile's rows. A varlen problem is the packed tensors as one batch
(B = 1, Tq the total query rows, O's own strides), so O's map is over the packed rows as Q's
is; the kernel stores with it only the 64-row blocks wholly inside their sequence.

The `wgmma` backward's three kernels take four maps, tm_q, tm_k, tm_v, tm_do (Q and dO with
boxes of BR rows, K and V of BC rows, over the K/V heads), ahead of the backward's C ABI
(`backward_tensor_maps`, through backward.py's prefix-args hook); nothing else.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from functools import cache
from typing import Any, TypeVar

from flashgen.generator.families.wgmma import WGMMA
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import backward
from flashgen.runtime.launch import register_prefix_args
from flashgen.runtime.validate import Problem

# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion (cuda.h)
TMA_DTYPE = {"fp16": 6, "bf16": 9}
SWIZZLE_128B = 3
L2_PROMOTION_128B = 2
BOX_COLS = 64  # 64 16-bit elements = 128 bytes, the widest box a 128-byte swizzle allows
TMA_STRIDE_LIMIT = 1 << 40  # global strides must stay below 2^40 bytes

_CACHE_SIZE = 256
_T = TypeVar("_T")
# Guards both LRU caches: a lookup is get() then move_to_end(), and an insert may evict, so two
# threads launching wgmma kernels at once could evict the key between another's get() and
# move_to_end() (KeyError out of a launch) or corrupt the OrderedDict's order. Encoding runs
# outside the lock: it calls the driver and may raise.
_maps_lock = threading.Lock()


class TensorMap(ctypes.Structure):
    """The driver's opaque CUtensorMap: 128 bytes, 64-byte aligned on the device."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


@cache
def _libcuda() -> Any:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
    lib.cuTensorMapEncodeTiled.argtypes = [
        ctypes.POINTER(TensorMap), ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    lib.cuGetErrorString.restype = ctypes.c_int
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def _error_text(code: int) -> str:
    text = ctypes.c_char_p()
    _libcuda().cuGetErrorString(code, ctypes.byref(text))
    return f"CUDA error {code}" + (f" ({text.value.decode()})" if text.value else "")


def tma_strides(t: int, h: int, b: int, d: int, strides: tuple[int, int, int]) -> list[int]:
    """Element strides (token, head, batch) a tensor map accepts for a (B, H, T, d) tensor.

    A dimension of extent 1 is never stepped, so its stride is free; the problem reports 0 for
    it, which the driver refuses: use the packed stride instead.
    """
    sb, sh, st = strides
    st = st if t > 1 else d
    sh = sh if h > 1 else st * t
    sb = sb if b > 1 else sh * h
    return [st, sh, sb]


def encode(
    ptr: int, dtype: str, b: int, h: int, t: int, d: int, strides: tuple[int, int, int], rows: int
) -> TensorMap:
    """Encode one 4-d tensor map (d, t, head, batch) with (64, rows, 1, 1) boxes."""
    item = 2
    steps = tma_strides(t, h, b, d, strides)
    for name, s in zip(("token", "head", "batch"), steps, strict=True):
        if s <= 0 or (s * item) % 16 or s * item >= TMA_STRIDE_LIMIT:
            raise ValueError(
                f"{name} stride={s} elements: family wgmma loads with TMA, which needs strides "
                "that are positive multiples of 16 bytes below 2^40; copy the tensor "
                "(.contiguous()) or use family mma"
            )
    tmap = TensorMap()
    dims = (ctypes.c_uint64 * 4)(d, t, h, b)
    gstrides = (ctypes.c_uint64 * 3)(*(s * item for s in steps))
    box = (ctypes.c_uint32 * 4)(BOX_COLS, rows, 1, 1)
    unit = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    rc = _libcuda().cuTensorMapEncodeTiled(
        ctypes.byref(tmap), TMA_DTYPE[dtype], 4, ctypes.c_void_p(ptr), dims, gstrides, box,
        unit, 0, SWIZZLE_128B, L2_PROMOTION_128B, 0,
    )  # fmt: skip
    if rc != 0:
        raise ValueError(
            f"tensor map for a ({b}, {h}, {t}, {d}) {dtype} tensor at 0x{ptr:x} with strides "
            f"{steps}: cuTensorMapEncodeTiled failed with {_error_text(rc)}; pass a contiguous "
            "tensor or use family mma"
        )
    return tmap


_maps: OrderedDict[tuple[Any, ...], tuple[TensorMap, TensorMap, TensorMap]] = OrderedDict()


def tensor_maps(spec: KernelSpec, p: Problem) -> tuple[TensorMap, TensorMap, TensorMap]:
    """Q, K and V tensor maps for `spec` on `p`, from a small LRU cache keyed by all inputs."""
    key = (spec.dtype, spec.br, spec.bc, p.b, p.h, p.kv_heads, p.tq, p.tk, p.d, p.value_dim,
           p.q_ptr, p.k_ptr, p.v_ptr, p.q_strides, p.k_strides, p.v_strides)  # fmt: skip
    hit = _lru_get(_maps, key)
    if hit is not None:
        return hit
    assert p.q_ptr is not None and p.k_ptr is not None and p.v_ptr is not None
    maps = (
        encode(p.q_ptr, spec.dtype, p.b, p.h, p.tq, p.d, p.q_strides, spec.br),
        encode(p.k_ptr, spec.dtype, p.b, p.kv_heads, p.tk, p.d, p.k_strides, spec.bc),
        encode(p.v_ptr, spec.dtype, p.b, p.kv_heads, p.tk, p.value_dim, p.v_strides, spec.bc),
    )
    _lru_put(_maps, key, maps)
    return maps


def _lru_get(cache: OrderedDict[tuple[Any, ...], _T], key: tuple[Any, ...]) -> _T | None:
    """`cache[key]` marked most recently used, or None; one locked step (see _maps_lock)."""
    with _maps_lock:
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
        return hit


def _lru_put(cache: OrderedDict[tuple[Any, ...], _T], key: tuple[Any, ...], value: _T) -> None:
    """Insert `value` as most recently used, evicting the least recently used past
    _CACHE_SIZE entries; one locked step (see _maps_lock)."""
    with _maps_lock:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)


O_STORE_ROWS = 64  # O map's box rows: one consumer warpgroup's (templates/wgmma.cu.j2)
_o_maps: OrderedDict[tuple[Any, ...], TensorMap] = OrderedDict()


def o_tensor_map(spec: KernelSpec, p: Problem) -> TensorMap:
    """O's tensor map (O_TMA_STORE: 64-row boxes, 64 columns, 128-byte swizzle), from a small
    LRU cache keyed by all inputs."""
    key = (spec.dtype, p.b, p.h, p.tq, p.value_dim, p.o_ptr, p.o_strides)
    hit = _lru_get(_o_maps, key)
    if hit is not None:
        return hit
    assert p.o_ptr is not None and p.o_strides is not None
    tmap = encode(p.o_ptr, spec.dtype, p.b, p.h, p.tq, p.value_dim, p.o_strides, O_STORE_ROWS)
    _lru_put(_o_maps, key, tmap)
    return tmap


@cache
def _stores_o(spec: KernelSpec) -> bool:
    """`WgmmaFamily.o_tma_store`, once per variant: it reads the environment and sizes shared
    memory (~2.5 us), and the prefix is rebuilt whenever O moves, so on the per-call path. The
    variant's plan was rendered with the same answer (FLASHGEN_WGMMA_O_TMA is set before a
    process's first call)."""
    return WGMMA.o_tma_store(spec)


def prefix_args(spec: KernelSpec, problem: Problem) -> list[Any]:
    """The `wgmma` kernels' leading arguments (launch.py's prefix-args hook): the Q, K and V
    tensor maps (and O's, for a forward that stores O with the TMA), then the heads and batch
    (its persistent grid is one-dimensional)."""
    maps: list[Any] = list(tensor_maps(spec, problem))
    if _stores_o(spec):
        maps.append(o_tensor_map(spec, problem))
    return [*maps, ctypes.c_int(problem.h), ctypes.c_int(problem.b)]


# o: O's map (O_TMA_STORE) moves with the output buffer; the others stay cached across it
register_prefix_args(WGMMA.name, prefix_args, uses=("q", "k", "v", "o"))


_bwd_maps: OrderedDict[tuple[Any, ...], tuple[TensorMap, TensorMap, TensorMap, TensorMap]] = (
    OrderedDict()
)


def backward_tensor_maps(
    spec: KernelSpec, bp: backward.BackwardProblem, q: int, k: int, v: int, do: int
) -> tuple[TensorMap, TensorMap, TensorMap, TensorMap]:
    """Q, K, V and dO tensor maps of the `wgmma` backward (Q and dO boxes of BR rows, K and V
    of BC rows, K and V over the K/V heads), from a small LRU cache keyed by all inputs."""
    p = bp.fwd
    key = (spec.dtype, spec.br, spec.bc, p.b, p.h, p.kv_heads, p.tq, p.tk, p.d, p.value_dim,
           q, k, v, do, p.q_strides, p.k_strides, p.v_strides, bp.do_strides)  # fmt: skip
    hit = _lru_get(_bwd_maps, key)
    if hit is not None:
        return hit
    maps = (
        encode(q, spec.dtype, p.b, p.h, p.tq, p.d, p.q_strides, spec.br),
        encode(k, spec.dtype, p.b, p.kv_heads, p.tk, p.d, p.k_strides, spec.bc),
        encode(v, spec.dtype, p.b, p.kv_heads, p.tk, p.value_dim, p.v_strides, spec.bc),
        encode(do, spec.dtype, p.b, p.h, p.tq, p.value_dim, bp.do_strides, spec.br),
    )
    _lru_put(_bwd_maps, key, maps)
    return maps


def backward_prefix_args(
    spec: KernelSpec, bp: backward.BackwardProblem, pointers: tuple[int, ...]
) -> list[Any]:
    """The `wgmma` backward kernels' leading arguments (backward.py's prefix-args hook):
    tm_q, tm_k, tm_v, tm_do, from the call's pointers (backward.POINTERS order)."""
    at = dict(zip(backward.POINTERS, pointers, strict=True))
    return list(backward_tensor_maps(spec, bp, at["q"], at["k"], at["v"], at["dout"]))


backward.register_prefix_args(
    WGMMA.name, backward_prefix_args, uses=("q", "k", "v", "dout")
)
