"""New keys and values appended to a K/V cache, then attention over it: FlashAttention's
`flash_attn_with_kvcache` call, on flashgen's decode kernel.

`append_kv` writes each sequence's new K/V rows at its positions cache_seqlens[b] ..
cache_seqlens[b] + T_new - 1, in a contiguous (B, T, H_kv, d) cache or a paged one
(n_pages, page_size, H_kv, d) through `block_table`, with no synchronization, so a decode step
that appends stays CUDA-graph capturable with varying lengths. A sequence whose append does not
fit (a length below 0, past the capacity, or a page index outside [0, n_pages)) cannot be
refused on the host without reading device memory: its rows are not written at all, and its new
length comes back as -1, which the decode kernel answers with NaN rows for that sequence (never
a silently wrong O).

On CUDA tensors the append is one kernel launch (runtime/append_kernel.py: each block decides its
sequence's validity itself and a refused sequence's blocks write nothing), where ~30 torch ops would
cost more host time than the decode kernel itself; its parameters are bound once per signature
(device, dtype, shapes, strides: `_bounds`), a call writing only its pointers. Elsewhere, and where
the kernel does not take the tensors (a head's row not contiguous, a GPU flashgen does not know), it
is `_append_rows`: device-side torch index arithmetic, whose writes of refused rows are redirected
onto a valid row's own write (same target, same value), so they can clobber nothing -- not even
another sequence's new rows in the same call. Both give the same lengths and the same cache
contents. Two valid sequences writing the same page slot (a page shared by sequences being appended
to), or k_cache overlapping v_cache, are caller errors: which write lands is then unspecified, on
either path.

`flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=..., ...)` takes
FlashAttention's arguments (its `window_size`, `softcap`, `alibi_slopes`, `softmax_scale`,
`num_splits`, `return_softmax_lse`), appends k and v when given, and runs
`flashgen.kvcache.attention_with_kvcache` over cache_seqlens + T_new keys. Like
FlashAttention's, it does not update `cache_seqlens`: the caller advances it.

Under torch.compile (and fake tensors, dispatch modes) the write is the custom op
`flashgen::append_kv`, whose schema marks both caches as written in place: a compiled decode
step then mutates the cache instead of copying it functionally.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from flashgen.generator.arch import ARCHS
from flashgen.kvcache import attention_with_values, check_call_args
from flashgen.runtime import append_kernel, feature_values, launch
from flashgen.torch_support import (
    device_arch,
    fa_features,
    fail,
    feature_args,
    no_modes,
    raw_stream,
)


def _check_new(name: str, x: Any, cache: Any, b: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        fail(
            f"{name}: {type(x).__name__} of shape {getattr(x, 'shape', None)}: must be a 4-D "
            f"tensor (B, T_new, H_kv, d) of the new tokens' rows"
        )
    if x.shape[0] != b or x.shape[1] < 1 or tuple(x.shape[2:]) != tuple(cache.shape[2:]):
        fail(
            f"{name}.shape={tuple(x.shape)}: must be (B={b}, T_new >= 1, "
            f"{', '.join(map(str, cache.shape[2:]))}) to match the cache's heads and head dim"
        )
    if x.dtype != cache.dtype or x.device != cache.device:
        fail(
            f"{name}: {x.dtype} on {x.device}, the cache {cache.dtype} on {cache.device}: "
            f"pass {name}.to(cache)"
        )


def append_kv(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_seqlens: Any, block_table: Any = None
) -> Any:
    """Write k, v (B, T_new, H_kv, d) into the cache at each sequence's positions
    cache_seqlens[b] + [0, T_new) (module docstring); returns the new lengths, int32 (B,):
    cache_seqlens + T_new, or -1 for a sequence whose rows were not written because they do
    not fit. `cache_seqlens`: int32 (B,) on the cache's device."""
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(c, torch.Tensor) or c.dim() != 4:
            fail(
                f"{name}: {type(c).__name__} of shape {getattr(c, 'shape', None)}: must be a 4-D "
                "tensor, (B, T, H_kv, d) or pages (n_pages, page_size, H_kv, d)"
            )
    if k_cache.shape[:3] != v_cache.shape[:3]:
        fail(
            f"k_cache.shape={tuple(k_cache.shape)}, v_cache.shape={tuple(v_cache.shape)}: the "
            "two caches must hold the same rows (only the head dims may differ)"
        )
    b = int(k.shape[0]) if isinstance(k, torch.Tensor) and k.dim() == 4 else -1
    _check_new("k", k, k_cache, b)
    _check_new("v", v, v_cache, b)
    if k.shape[1] != v.shape[1]:
        fail(f"k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}: the same T_new for both")
    if (
        not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32
        or tuple(cache_seqlens.shape) != (b,) or cache_seqlens.device != k_cache.device
    ):  # fmt: skip
        fail(
            f"cache_seqlens: {getattr(cache_seqlens, 'dtype', type(cache_seqlens).__name__)} "
            f"{tuple(getattr(cache_seqlens, 'shape', ()))}: appending needs an int32 ({b},) "
            "tensor on the cache's device (where each sequence's new rows start)"
        )
    if block_table is None and k_cache.shape[0] != b:
        fail(f"k_cache.shape={tuple(k_cache.shape)}: a contiguous cache holds B={b} rows")
    if block_table is not None and (
        not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32
        or block_table.dim() != 2 or block_table.shape[0] != b
        or block_table.device != k_cache.device
    ):  # fmt: skip
        fail(
            f"block_table: must be an int32 (B={b}, pages per sequence) tensor on the cache's "
            "device"
        )
    if no_modes():
        return _append(k_cache, v_cache, k, v, cache_seqlens, block_table)
    # torch.compile, fake tensors, dispatch modes: the registered op, which declares that it
    # writes the caches (no functional copy of a whole cache)
    return _OP(k_cache, v_cache, k, v, cache_seqlens, block_table)


@functools.lru_cache(maxsize=16)
def _cuda_arch(index: int) -> str | None:
    arch = device_arch(index)
    return arch if arch in ARCHS else None


def _kernel_arch(device: Any) -> str | None:
    """The arch the append kernel compiles for on `device`: None off CUDA and on a GPU whose
    arch flashgen does not know (both appended by `_append_rows`)."""
    return _cuda_arch(device.index) if device.type == "cuda" else None


_stream = raw_stream  # the current CUstream of a device (tests stand a CPU one in)


def _side(cache: Any, new: Any) -> append_kernel.Side:
    cs, ns = cache.stride(), new.stride()
    return append_kernel.Side(cache.data_ptr(), new.data_ptr(), (cs[0], cs[1], cs[2]),
                              (ns[0], ns[1], ns[2]), int(cache.shape[3]))  # fmt: skip


def _views_taken(k_cache: Any, v_cache: Any, k: Any, v: Any) -> bool:
    """Whether the kernel may take these tensors as they are this call (what the signature does
    not say): not a tensor whose bytes are not its values (a conjugate or negative view), not
    one that autograd records (the torch ops keep such an append differentiable; the kernel's
    raw writes would drop the gradient)."""
    grad = torch.is_grad_enabled()
    return not any(
        t.is_conj() or t.is_neg() or (grad and t.requires_grad) for t in (k_cache, v_cache, k, v)
    )


def _signature(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_seqlens: Any, block_table: Any
) -> tuple[Any, ...]:
    """What an append's kernel launch depends on besides its pointers: device, dtype, shapes and
    strides (validated tensors)."""
    table = None if block_table is None else (block_table.shape, block_table.stride())
    return (
        k_cache.device.index, k_cache.dtype, k_cache.shape, k_cache.stride(), v_cache.shape,
        v_cache.stride(), k.shape, k.stride(), v.shape, v.stride(), cache_seqlens.stride(0), table,
    )  # fmt: skip


_bounds: dict[tuple[Any, ...], append_kernel.Bound | None] = {}
"""Per `_signature`: the kernel launch bound to it, or None where the kernel does not take it."""


def _kernel_args(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_seqlens: Any, block_table: Any,
    new_lens: Any = None,
) -> append_kernel.Append | None:  # fmt: skip
    """The append kernel's arguments for validated tensors writing the lengths into `new_lens`,
    or None where the kernel does not take them: a head's row not contiguous (the kernel reads
    and writes rows of d elements at stride 1), a complex dtype (left to the torch ops, with
    their lazy conjugate and negative views), sizes past its int32 indices; and
    `_views_taken`'s per-call conditions. The pointers are this call's (`new_lens` None: 0; a
    `Bound` rewrites them all at every launch)."""
    if not _views_taken(k_cache, v_cache, k, v):
        return None
    for t in (k_cache, v_cache, k, v):
        if (t.stride(3) != 1 and t.shape[3] > 1) or t.dtype.is_complex:
            return None
    if block_table is None:
        capacity, page_size, n_pages, table, table_strides = int(k_cache.shape[1]), 1, 0, 0, (0, 0)
    else:
        page_size, n_pages = int(k_cache.shape[1]), int(k_cache.shape[0])
        capacity = int(block_table.shape[1]) * page_size
        table = block_table.data_ptr()
        table_strides = (int(block_table.stride(0)), int(block_table.stride(1)))
    args = append_kernel.Append(
        k=_side(k_cache, k), v=_side(v_cache, v), lens=cache_seqlens.data_ptr(),
        lens_stride=int(cache_seqlens.stride(0)), table=table, table_strides=table_strides,
        new_lens=0 if new_lens is None else new_lens.data_ptr(), batch=int(k.shape[0]),
        t_new=int(k.shape[1]), heads=int(k.shape[2]), capacity=capacity, page_size=page_size,
        n_pages=n_pages, element_size=k_cache.element_size(),
    )  # fmt: skip
    return args if args.fits() else None


def _append(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_seqlens: Any, block_table: Any
) -> Any:
    """The append (validated arguments), and the registered op's implementation: one launch of
    the append kernel on the current stream for CUDA tensors it takes, `_append_rows`'
    torch ops otherwise. No host synchronization either way."""
    b = int(k.shape[0])
    if b == 0:  # nothing to append (and no empty grid to launch)
        return torch.empty(0, dtype=torch.int32, device=k_cache.device)
    dev = k_cache.device
    arch = _kernel_arch(dev)
    if arch is not None and _views_taken(k_cache, v_cache, k, v):
        key = _signature(k_cache, v_cache, k, v, cache_seqlens, block_table)
        if key in _bounds:
            bound = _bounds[key]
        else:  # the first call of a signature: the kernel parameters, built once
            args = _kernel_args(k_cache, v_cache, k, v, cache_seqlens, block_table)
            bound = None if args is None else append_kernel.Bound(args)
            launch.remember(_bounds, key, bound)
        if bound is not None:
            new_lens = torch.empty(b, dtype=torch.int32, device=dev)
            table = 0 if block_table is None else block_table.data_ptr()
            bound.launch(k_cache.data_ptr(), k.data_ptr(), v_cache.data_ptr(), v.data_ptr(),
                         cache_seqlens.data_ptr(), table, new_lens.data_ptr(),
                         _stream(dev.index), dev.index, arch)  # fmt: skip
            return new_lens
    return _append_rows(k_cache, v_cache, k, v, cache_seqlens, block_table)


def _append_rows(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_seqlens: Any, block_table: Any
) -> Any:
    """The write with torch ops (validated arguments, B >= 1): device-side index arithmetic
    only, ~30 small ops. CPU tensors and what the kernel does not take; the reference the
    kernel is tested against."""
    b = int(k.shape[0])
    t_new = int(k.shape[1])
    dev = k_cache.device
    lens = cache_seqlens.long()
    pos = lens[:, None] + torch.arange(t_new, device=dev)[None, :]  # (B, T_new)
    if block_table is None:
        cap = int(k_cache.shape[1])
        ok = (lens >= 0) & (lens + t_new <= cap)
        i0 = torch.arange(b, device=dev)[:, None].expand(b, t_new)
        i1 = pos.clamp(0, cap - 1)
    else:
        page_size, n_pages, per_seq = int(k_cache.shape[1]), int(k_cache.shape[0]), int(
            block_table.shape[1]
        )
        cap = per_seq * page_size
        ok = (lens >= 0) & (lens + t_new <= cap)
        slot = pos.clamp(0, cap - 1)
        page = block_table.long().gather(1, slot // page_size)
        ok &= ((page >= 0) & (page < n_pages)).all(1)
        i0 = page.clamp(0, n_pages - 1)
        i1 = slot % page_size
    valid = ok[:, None].expand(b, t_new).reshape(-1)
    i0, i1 = i0.reshape(-1), i1.reshape(-1)
    first = torch.argmax(valid.to(torch.int32))  # the first valid row (0 when none is)
    any_ok = valid.any()
    # refused rows write onto the first valid row's target, with its value: no clobbering
    i0 = torch.where(valid, i0, i0[first])
    i1 = torch.where(valid, i1, i1[first])
    for cache, new in ((k_cache, k), (v_cache, v)):
        rows = new.reshape(b * t_new, *new.shape[2:])
        # with no valid row at all, every write puts that target's own old value back
        fill = torch.where(any_ok, rows[first], cache[i0[0], i1[0]])
        cache.index_put_((i0, i1), torch.where(valid[:, None, None], rows, fill))
    return torch.where(ok, lens + t_new, -1).to(torch.int32)


# The op (torch.compile, export, fake tensors): it declares the two caches written in place
SCHEMA = (
    "append_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, "
    "Tensor cache_seqlens, Tensor? block_table) -> Tensor"
)
_library: Any = torch.library  # partly untyped: keep mypy --strict quiet with torch installed
_LIB: Any = _library.Library("flashgen", "FRAGMENT")
_LIB.define(SCHEMA)
_LIB.impl("append_kv", _append, "CompositeExplicitAutograd")  # compiled steps: one launch too


def _fake(
    k_cache: Any, v_cache: Any, k: Any, v: Any, cache_seqlens: Any, block_table: Any
) -> Any:
    return torch.empty_like(cache_seqlens)


_library.register_fake("flashgen::append_kv", _fake, lib=_LIB)
_OP = torch.ops.flashgen.append_kv.default


def flash_attn_with_kvcache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    k: Any = None,
    v: Any = None,
    rotary_cos: Any = None,
    rotary_sin: Any = None,
    cache_seqlens: Any = None,
    cache_batch_idx: Any = None,
    cache_leftpad: Any = None,
    block_table: Any = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Any = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> Any:
    """FlashAttention's `flash_attn_with_kvcache` on flashgen's decode kernel: q (B, Tq, H, d)
    against k_cache/v_cache ((B, T, H_kv, d), or pages (n_pages, page_size, H_kv, d) with
    `block_table` int32 (B, pages per sequence)); with k, v (B, T_new, H_kv, d) given, they are
    first written into the cache at cache_seqlens (`append_kv`) and attention covers
    cache_seqlens + T_new keys. `cache_seqlens`: int32 (B,) on q's device or an int (None:
    the whole cache; not with k, v). `window_size` (left, right), -1 unbounded; `softcap` 0.0
    off; `alibi_slopes` float32 (H,). Returns O (B, Tq, H, dv), or (O, LSE) with
    `return_softmax_lse`. Not supported (a ValueError when given): rotary embeddings
    (rotate q and k before the call), `cache_batch_idx`, `cache_leftpad`."""
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if value is not None:
            fail(f"{name}: rotary embeddings are not applied here; rotate q and k before the call")
    if cache_batch_idx is not None or cache_leftpad is not None:
        name = "cache_batch_idx" if cache_batch_idx is not None else "cache_leftpad"
        fail(f"{name}: not supported; pass the cache rows of this batch, in order, from offset 0")
    del rotary_interleaved  # only meaningful with rotary_cos/sin
    values = feature_values.from_keywords(
        fa_features(window_size, softcap, alibi_slopes), "flash_attn_with_kvcache"
    )
    if (k is None) != (v is None):
        fail("k and v: pass both (the new tokens' keys and values) or neither")
    lens = cache_seqlens
    if k is not None:
        # what the decode call would refuse, refused before anything is written into the cache
        if not isinstance(q, torch.Tensor) or q.dim() != 4 or not isinstance(k_cache, torch.Tensor):
            fail("q: must be a 4-D (B, Tq, H, d) tensor, and the caches tensors")
        if q.dtype != k_cache.dtype or q.device != k_cache.device:
            fail(
                f"q: {q.dtype} on {q.device}, k_cache {k_cache.dtype} on {k_cache.device}: q and "
                "the caches must share one dtype and device"
            )
        if q.dtype not in (torch.float16, torch.bfloat16):
            fail(f"q.dtype={q.dtype}: must be torch.float16 or torch.bfloat16")
        if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
            lens = torch.full((k.shape[0],), cache_seqlens, dtype=torch.int32,
                              device=k_cache.device)  # fmt: skip
        elif cache_seqlens is None:
            fail(
                "cache_seqlens=None with k, v: appending needs each sequence's length (where "
                "its new rows go); pass cache_seqlens"
            )
        # the attention call's own rules, so a call it refuses writes nothing: its scalar
        # arguments, q's head dims against the cache's, an array feature's layout and device
        # (the scalar features were read above)
        check_call_args(causal, softmax_scale, num_splits)
        if q.shape[3] != k_cache.shape[3] or q.shape[2] % max(int(k_cache.shape[2]), 1):
            fail(
                f"q.shape={tuple(q.shape)}, k_cache.shape={tuple(k_cache.shape)}: q's head dim "
                "must be the cache's, and its heads a multiple of the cache's (GQA)"
            )
        if feature_values.arrays(values):
            feature_args(values, q, int(q.shape[2]))
        lens = append_kv(k_cache, v_cache, k, v, lens, block_table)
    return attention_with_values(
        q, k_cache, v_cache, lens, block_table, causal, softmax_scale, num_splits,
        return_softmax_lse, None, values,
    )  # fmt: skip
