"""Attention against a K/V cache (decoding), on torch tensors: `attention_with_kvcache`.

Also reachable as `flashgen.torch.attention_with_kvcache`. The layouts are the ones serving
stacks use (FlashAttention's `flash_attn_with_kvcache`): tokens before heads.

- q: (B, Tq, H, d), the new query rows (Tq of them per sequence, usually 1 to 16)
- k_cache, v_cache: (B, Tk, H_kv, d) contiguous, or, with `block_table`, pages
  (n_pages, page_size, H_kv, d) of any page size (1 and up)
- block_table: int32 (B, pages per sequence): sequence b's key j is row j % page_size of page
  block_table[b, j // page_size]
- cache_seqlens: int32 (B,) on q's device, the keys each sequence holds (its new tokens are
  the last Tq of them), or one Python int for all, or None for the whole cache

The kernel is family mma's decode (runtime/decode.py): the query heads of a GQA group share one
pass over K and V, and the keys are split over enough blocks to fill the GPU (chosen from the
shapes: the call never waits for the GPU, and is safe inside CUDA-graph capture once a first
call of its signature compiled and loaded the kernel). A length outside [0, capacity] or a
page index outside [0, n_pages) in the device arrays cannot be checked without a
synchronization: that sequence's rows come back NaN (O and LSE), never silently wrong.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    import torch
except ImportError as _exc:  # one line, says what is missing
    raise ImportError(
        f"flashgen.kvcache needs PyTorch, which cannot be imported ({_exc}); install torch"
    ) from None

from flashgen.generator.features import FeatureKeywords
from flashgen.generator.numerics import LOG2E
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import feature_values, launch, op_args
from flashgen.runtime import gpu as runtime
from flashgen.runtime.decode import (
    DecodeLaunch,
    DecodeShape,
    decode_spec,
    routes_to_decode,
    row_tiles,
    scratch_sizes,
)
from flashgen.runtime.decode_call import choose_launch
from flashgen.runtime.validate import check_scale
from flashgen.torch_support import (
    check_int_array,
    check_tensor,
    device_arch,
    dispatch_stack,
    fail,
    feature_args,
    feature_args_key,
    function_modes,
    raw_stream,
    stream_zeros,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack  # Python 3.10 has no typing.Unpack

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class _Entry:
    """A validated call signature: its launch and what each call allocates."""

    launch: DecodeLaunch
    o_shape: tuple[int, ...]
    lse_shape: tuple[int, int, int]
    scratch: tuple[int, int, int]  # o_part, lse_part, counters (0: none; the merge kernel's)
    device: Any
    dtype: Any


_entries: dict[tuple[Any, ...], _Entry] = {}
_counters: dict[tuple[int, int], Any] = {}  # (device, stream) -> int32 zeros (kernel-restored)
_lock = threading.Lock()


def _array_key(x: Any) -> tuple[Any, ...]:
    """What a remembered signature holds of a tensor: shape, strides, dtype, device."""
    return (tuple(x.shape), x.stride(), x.dtype, x.device)


def _ptr(x: Any) -> int:
    """A tensor's device address, 0 for None (a NULL argument)."""
    return 0 if x is None else int(x.data_ptr())


def _check_operand(name: str, x: Any) -> None:
    """The d axis contiguous; every stride a multiple of 8 elements and the base 16-byte
    aligned (the kernel moves rows in 16-byte copies)."""
    if x.stride(-1) != 1:
        fail(
            f"{name}.stride()={tuple(x.stride())}: the last (d) axis must be contiguous; "
            f"pass {name}.contiguous()"
        )
    if any(s % 8 for s in x.stride()[:-1]) or x.data_ptr() % 16:
        fail(
            f"{name}: strides {tuple(x.stride())} and base address must be multiples of 8 "
            f"elements (16 bytes); pass {name}.contiguous()"
        )


def _prepare(
    key: tuple[Any, ...], q: Any, k: Any, v: Any, seqlens: Any, table: Any, causal: bool,
    scale: float | None, splits: int, values: feature_values.Values, chosen: KernelSpec | None,
    o_strides: tuple[int, int, int] | None = None,
) -> _Entry:  # fmt: skip
    """First call of a signature: validate everything, choose and load the variant. O's
    (batch, head, token) strides: `o_strides`, or None for a contiguous (B, Tq, H, dv)."""
    check_tensor("q", q, 4)
    dev = q.device
    check_tensor("k_cache", k, 4, dev)
    check_tensor("v_cache", v, 4, dev)
    dtype = _DTYPES.get(q.dtype)
    if dtype is None:
        fail(f"q.dtype={q.dtype}: the decode kernel takes torch.float16 or torch.bfloat16")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        fail(f"dtypes q {q.dtype}, k_cache {k.dtype}, v_cache {v.dtype}: must be one dtype")
    b, tq, h, d = (int(n) for n in q.shape)
    n0, n1, h_kv, dk = (int(n) for n in k.shape)
    dv = int(v.shape[3])
    if tuple(v.shape[:3]) != (n0, n1, h_kv):
        fail(
            f"v_cache.shape={tuple(v.shape)}: must match k_cache.shape={tuple(k.shape)} "
            "but in the last axis"
        )
    if dk != d:
        fail(f"k_cache.shape[-1]={dk}, q.shape[-1]={d}: the head dims must match")
    if b < 1 or tq < 1 or h < 1 or h_kv < 1:
        fail(
            f"q.shape={tuple(q.shape)}, k_cache.shape={tuple(k.shape)}: every axis must be "
            "at least 1"
        )
    if h % h_kv:
        fail(f"H={h}, H_kv={h_kv}: the query heads must be a multiple of the K/V heads (GQA)")
    for name, x in (("q", q), ("k_cache", k), ("v_cache", v)):
        _check_operand(name, x)
    if table is None:
        if n0 != b:
            fail(
                f"k_cache.shape[0]={n0}, B={b}: a contiguous cache holds one row per sequence; "
                "pass block_table for a paged cache"
            )
        tk, page_size, bt_stride, n_pages = n1, 0, 0, 0
    else:
        check_int_array("block_table", table, (b, -1), dev)
        page_size, n_pages = n1, n0
        tk = int(table.shape[1]) * page_size
        bt_stride = int(table.stride(0))
        if tk > _INT_MAX:
            fail(f"block_table.shape[1] x page_size = {tk}: must be below 2^31 keys per sequence")
    if isinstance(seqlens, torch.Tensor):
        check_int_array("cache_seqlens", seqlens, (b,), dev)
    elif seqlens is not None:
        if isinstance(seqlens, bool) or not isinstance(seqlens, int) or not 0 <= seqlens <= tk:
            fail(
                f"cache_seqlens={seqlens!r}: must be an int in [0, {tk}] (the cache's "
                "capacity), or an int32 (B,) tensor"
            )
        tk = int(seqlens)
    if tq * (h // h_kv) > _INT_MAX or tk > _INT_MAX:
        fail(f"Tq={tq} x group={h // h_kv}, Tk={tk}: must stay below 2^31")
    scale_value = check_scale(scale, d)
    features = feature_args(values, q, h)
    spec = decode_spec(d, dv, dtype, causal, tq * (h // h_kv), features.tokens)
    if chosen is not None:
        want = (d, dv, dtype, causal, tuple(features.tokens))
        if not isinstance(chosen, KernelSpec) or chosen.direction != "decode" or (
            chosen.d, chosen.dv, chosen.dtype, chosen.causal, chosen.features
        ) != want:  # fmt: skip
            fail(
                f"spec={getattr(chosen, 'name', chosen)!r}: must be a decode KernelSpec for "
                f"d={d}, dv={dv}, dtype={dtype}, causal={causal}, features={want[4]}; e.g. "
                f"{spec.name}"
            )
        spec = chosen
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    arch = device_arch(index)
    tiles = row_tiles(spec, tq, h // h_kv)
    spec, plan, n_splits = choose_launch(
        spec, chosen is not None, lambda s: runtime.device_plan(s, arch, index),
        b * h_kv * tiles, tk, splits,
    )  # fmt: skip
    ks, vs = k.stride(), v.stride()
    strides = (
        q.stride(0), q.stride(2), q.stride(1), ks[0], ks[2], ks[1], vs[0], vs[2], vs[1],
        *(o_strides or (tq * h * dv, dv, h * dv)),
    )  # fmt: skip
    shape = DecodeShape(
        b, h, h_kv, tq, tk, page_size, bt_stride, n_pages, strides, scale_value * LOG2E
    )
    call = DecodeLaunch(plan, shape, n_splits, features)
    n_o, n_l, n_c = scratch_sizes(spec, b, h_kv, tiles, n_splits)
    entry = _Entry(
        call, (b, tq, h, dv), (b, h, tq), (n_o, n_l, 0 if call.combine else n_c), dev, q.dtype
    )  # the merge kernel counts nothing: no counters
    launch.remember(_entries, key, entry)
    return entry


class DenseDecode:
    """`flashgen.torch.attention`'s decode route: the decode kernel on (B, H, T, d) tensors,
    called like a forward's bound launch (pointers of q, k, v, O, LSE, and the stream)."""

    def __init__(self, entry: _Entry) -> None:
        self._e = entry

    def __call__(self, qp: int, kp: int, vp: int, op: int, lsep: int, stream: int) -> None:
        _launch(self._e, (qp, kp, vp, op, lsep), 0, 0, stream)


def _launch(e: _Entry, qkvol: tuple[int, ...], lens: int, table: int, stream: int) -> None:
    """Launch an entry: its split scratch allocated (none with one split), the counters of
    (device, stream) when its splits merge in the decode launch (none with the merge kernel);
    `qkvol` the pointers of q, k, v, O and LSE, `lens`/`table` 0 for NULL."""
    n_o, n_l, n_c = e.scratch
    # o_part then lse_part in one allocation (each torch.empty is microseconds of a short
    # call's host time); o_part's float4 rows start at the allocator's aligned base
    part = torch.empty(n_o + n_l, dtype=torch.float32, device=e.device) if n_o else None
    p = _ptr(part)
    # no counters (n_c 0) when the splits merge in a kernel of their own (DecodeLaunch.combine)
    counters = _counter_buffer(e.device.index, stream, n_c) if n_c else None
    scratch = (p, p + 4 * n_o if p else 0, _ptr(counters))
    e.launch((*qkvol, *scratch, lens, table), stream)


def dense_decode(
    q: Any, k: Any, v: Any, causal: bool, scale: float | None,
    values: feature_values.Values, o_stride: tuple[int, ...],
) -> DenseDecode | None:  # fmt: skip
    """The decode kernel for a `flashgen.torch.attention` call of (B, H, T, d) tensors whose
    shapes it serves faster than the forward kernels (`routes_to_decode`), writing O with
    strides `o_stride`; None for any other call (the forward kernels take it). The call was
    validated by the forward's rules already; one the decode kernel's stricter layout rules
    refuse (16-byte rows) stays with the forward too."""
    tq, tk = int(q.shape[2]), int(k.shape[2])
    if q.dtype not in _DTYPES or not routes_to_decode(tq, tk):
        return None
    try:
        entry = _prepare(
            (), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None, causal,
            scale, 0, values, None, (o_stride[0], o_stride[1], o_stride[2]),
        )  # fmt: skip
    except ValueError:
        return None
    return DenseDecode(entry)


def _counter_buffer(dev: int, stream: int, n: int) -> Any:
    """At least n int32 zeros for the decode merge's counters on (device, stream), which the
    kernel leaves zeroed: one buffer per (device, stream) for eager calls, fresh ones under
    graph capture (`stream_zeros`)."""
    return stream_zeros(_counters, _lock, dev, stream, n, minimum=1024)


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

    Layouts (module docstring): q (B, Tq, H, d); k_cache, v_cache (B, Tk, H_kv, d) or pages
    (n_pages, page_size, H_kv, d) with `block_table` int32 (B, pages per sequence);
    `cache_seqlens` int32 (B,) on q's device (or an int, or None: the whole cache). H a
    multiple of H_kv; float16 or bfloat16; d a multiple of 8 up to 256 (v's own head dim
    too). `causal` aligns the Tq new rows with the last Tq keys of each sequence: row i sees
    keys j <= i + L - Tq. `num_splits` > 0 forces the split count (0: chosen from the shapes).
    Features as in `flashgen.torch.attention`: `window=(left, right)`, `softcap=c`,
    `alibi_slopes` float32 (H,). Returns O (B, Tq, H, dv) in q's dtype, or (O, LSE) with
    `return_lse` (LSE float32 (B, H, Tq), natural log; -inf for a row that sees no key).
    `spec` picks the decode variant (a KernelSpec with direction="decode" matching the call's
    d, dv, dtype, causal and features); None chooses one from the shapes.

    Runs on the current stream, never synchronizes, allocates through torch's caching
    allocator. Example::

        import torch
        from flashgen.torch import attention_with_kvcache

        B, H, H_kv, d, pages, page = 8, 32, 8, 128, 1024, 64
        q = torch.randn(B, 1, H, d, device="cuda", dtype=torch.bfloat16)
        k_cache = torch.randn(pages, page, H_kv, d, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        table = torch.randperm(pages, device="cuda", dtype=torch.int32).view(B, -1)
        lens = torch.full((B,), 5000, device="cuda", dtype=torch.int32)
        o = attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table)
    """
    values = feature_values.from_keywords(features, "attention_with_kvcache")
    return attention_with_values(
        q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, num_splits, return_lse,
        spec, values,
    )  # fmt: skip


def check_call_args(causal: Any, scale: Any, num_splits: Any) -> None:
    """The scalar arguments' rules (ValueError naming value, rule and fix), checked on every
    call: a remembered signature's key would take True for 1 and 1.0."""
    if causal is not True and causal is not False:
        raise ValueError(f"causal={causal!r}: must be True or False")
    if scale is not None:
        check_scale(scale, 1)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(
            f"num_splits={num_splits!r}: must be an int >= 0 (0: chosen from the shapes)"
        )


def attention_with_values(
    q: Any, k_cache: Any, v_cache: Any, cache_seqlens: Any, block_table: Any, causal: bool,
    scale: float | None, num_splits: int, return_lse: bool, spec: KernelSpec | None,
    values: feature_values.Values,
) -> Any:  # fmt: skip
    """`attention_with_kvcache` with its features already read into `values`
    (`feature_values.from_keywords`): for a front door that checked them itself."""
    check_call_args(causal, scale, num_splits)
    if spec is not None and not isinstance(spec, KernelSpec):
        fail(f"spec={spec!r}: must be a decode KernelSpec or None")
    variant = spec.name if spec is not None else None
    lens = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
    if lens is None and cache_seqlens is not None and (
        isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, int)
    ):  # fmt: skip
        fail(f"cache_seqlens={cache_seqlens!r}: must be an int32 (B,) tensor, an int or None")
    seqlen = None if lens is not None else cache_seqlens
    args = (q, k_cache, v_cache, lens, seqlen, block_table, causal, scale, num_splits, variant)
    if _direct(q):
        o, lse = _run(*args, *op_args.op_args(values))
    else:  # torch.compile, fake tensors, dispatch modes: through the registered op
        o, lse = _OP(*args, *op_args.op_args(values))
    return (o, lse) if return_lse else o


def _direct(q: Any) -> bool:
    """True when the dispatcher would add nothing: eager, a plain tensor, no dispatch modes."""
    return (
        not torch.compiler.is_compiling()
        and type(q) is torch.Tensor
        and q.is_cuda
        and not dispatch_stack()
        and not function_modes()
    )


def _run(
    q: Any, k_cache: Any, v_cache: Any, lens: Any, seqlen: int | None, block_table: Any,
    causal: bool = False, scale: float | None = None, num_splits: int = 0,
    variant: str | None = None, *feature_args: Any,
) -> tuple[Any, Any]:  # fmt: skip
    # (the dispatcher leaves out trailing arguments that equal the schema's defaults)
    """The CUDA implementation: signature lookup, allocate, launch on the current stream."""
    seqs: Any = lens if lens is not None else seqlen
    seq_key: Any = _array_key(lens) if lens is not None else seqlen
    tab_key: Any = (
        _array_key(block_table) if isinstance(block_table, torch.Tensor) else block_table
    )  # fmt: skip
    try:
        key = (
            *((*_array_key(x), x.data_ptr() & 15) for x in (q, k_cache, v_cache)),
            seq_key, tab_key, causal, scale, num_splits, variant, feature_args_key(feature_args),
        )  # fmt: skip
        e = _entries.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable: validation names it
        key, e = (), None
    if e is None:
        values = op_args.values_of(feature_args)  # decoded and checked on a first call only
        spec = KernelSpec.from_name(variant) if variant is not None else None
        e = _prepare(
            key, q, k_cache, v_cache, seqs, block_table, causal, scale, num_splits, values, spec
        )
    dev = e.device.index
    stream = raw_stream(dev)
    o = torch.empty(e.o_shape, dtype=e.dtype, device=e.device)
    lse = torch.empty(e.lse_shape, dtype=torch.float32, device=e.device)
    qkvol = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), lse.data_ptr())
    _launch(e, qkvol, _ptr(lens), _ptr(block_table), stream)
    return o, lse


def _fake(
    q: Any, k_cache: Any, v_cache: Any, lens: Any, seqlen: int | None, block_table: Any,
    causal: bool = False, scale: float | None = None, num_splits: int = 0,
    variant: str | None = None, *feature_args: Any,
) -> tuple[Any, Any]:  # fmt: skip
    # (the dispatcher leaves out trailing arguments that equal the schema's defaults)
    """Shapes only (torch.compile, fake tensors): O (B, Tq, H, dv) like q, LSE (B, H, Tq)."""
    op_args.values_of(feature_args)  # the scalar features' checks
    if q.dim() != 4 or v_cache.dim() != 4:
        fail(f"q.shape={tuple(q.shape)}, v_cache.shape={tuple(v_cache.shape)}: must be 4-D")
    b, tq, h, _ = q.shape
    o = q.new_empty((b, tq, h, v_cache.shape[3]))
    lse = q.new_empty((b, h, tq), dtype=torch.float32)
    return o, lse


SCHEMA = (
    "attention_with_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, "
    "int? seqlen, Tensor? block_table, bool causal=False, float? scale=None, int num_splits=0, "
    f"str? variant=None, {op_args.FEATURE_SCHEMA}) -> (Tensor, Tensor)"
)
"""The custom op `torch.ops.flashgen.attention_with_kvcache` (cache_seqlens as a tensor, or
`seqlen` one int for all)."""

_library: Any = torch.library  # partly untyped: keep mypy --strict quiet with torch installed
_LIB: Any = _library.Library("flashgen", "FRAGMENT")
_LIB.define(SCHEMA)
_LIB.impl("attention_with_kvcache", _run, "CUDA")
_LIB.impl("attention_with_kvcache", _run, "CPU")  # validation refuses CPU tensors by name
_library.register_fake("flashgen::attention_with_kvcache", _fake, lib=_LIB)
_OP = torch.ops.flashgen.attention_with_kvcache.default


def clear_cache() -> None:
    """Forget every validated signature (the loaded kernels stay cached)."""
    with _lock:
        _entries.clear()
