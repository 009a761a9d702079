"""Attention over packed sequences of different lengths, on torch tensors: `flash_attn_varlen_func`.

Also reachable as `flashgen.torch.flash_attn_varlen_func`. The layout is the one training and
serving stacks use for ragged batches (FlashAttention's `flash_attn_varlen_func`): no padding,
the sequences' tokens one after another.

- q: (total_q, H, d); k, v: (total_k, H_kv, d) and (total_k, H_kv, dv)
- cu_seqlens_q, cu_seqlens_k: int32 (n_seqs + 1,) on q's device, the prefix sums of the
  sequences' lengths: sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q (and
  O) and rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of k and v. Zero-length sequences
  are allowed.
- max_seqlen_q, max_seqlen_k: Python ints, the longest sequences (they size the grid only).

Each sequence is attended on its own, every mask per sequence: causal is aligned to its
bottom-right corner (query i sees keys j <= i + len_k - len_q), and the window and ALiBi
positions are its own. The kernel is family wgmma's forward compiled with `varlen` (Hopper;
runtime.launch binds its sequences): the persistent blocks take each sequence's own query
tiles from a global counter, reading the lengths on the GPU, so a call never waits for the GPU
and is safe inside CUDA-graph capture once a first call of its signature compiled and loaded
the kernel (the counter's two words: one kernel-restored pair per stream, fresh zeroed words
per call under capture; `_work_counter`).

cu_seqlens cannot be checked without a synchronization. A sequence whose key rows fall outside
k gets NaN rows (O and LSE); one whose query rows are out of order or outside q gets nothing
written; rows after the last sequence get zeros (LSE -inf).

Gradients (autograd, or the custom op `flashgen::varlen_attention_backward`) run family wgmma's
backward compiled with `varlen` (d a multiple of 8 up to 128, dv = d; runtime.backward launches
it): dq, dk, dv packed like q, k, v (GQA: dk, dv per K/V head), every feature of the forward
passed on. Its fp32 scratch is padded per sequence to whole query tiles (about total_q + n_seqs
* 96 rows per head). Like the forward it never synchronizes. Rows of q that no sequence covers
get zero dq, rows of k before cu_seqlens_k[0] or from cu_seqlens_k[n_seqs] on zero dk, dv; a
sequence whose key rows fall outside k gets NaN dq rows (as its O), and its key range nothing;
one whose query rows are out of order or outside q gets zero dq and zero dk, dv.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

try:
    import torch
except ImportError as _exc:  # one line, says what is missing
    raise ImportError(
        f"flashgen.varlen needs PyTorch, which cannot be imported ({_exc}); install torch"
    ) from None

from flashgen.generator.backward import scratch_shapes
from flashgen.generator.families.wgmma.bwd import MAX_HEAD_DIM, takes_head_dim
from flashgen.generator.numerics import LOG2E
from flashgen.generator.select import select
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import backward as bwd_runtime
from flashgen.runtime import feature_values, launch, op_args
from flashgen.runtime import gpu as runtime
from flashgen.runtime.validate import check_layout, check_scale, check_spec
from flashgen.torch_support import (
    check_int_array,
    check_tensor,
    device_arch,
    dispatch_stack,
    fa_features,
    fail,
    feature_args,
    feature_args_key,
    function_modes,
    raw_stream,
    stream_zeros,
)

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class _Entry:
    """A validated call signature: its bound launch and what each call allocates."""

    bound: launch.Bound
    o_shape: tuple[int, int, int]
    lse_shape: tuple[int, int]
    device: Any
    dtype: Any


_entries: dict[tuple[Any, ...], _Entry] = {}
_plans: dict[tuple[Any, ...], launch.LaunchPlan] = {}
_counters: dict[tuple[int, int], Any] = {}  # (device, stream) -> 2 int32 zeros (kernel-restored)
_lock = threading.Lock()


def _work_counter(dev: int, stream: int) -> Any:
    """The two int32 words a varlen forward's tile scheduler counts in (abi.VARLEN_FWD): zero
    when the launch starts, and used by no launch that may run at the same time -- one pair
    per (device, stream) for eager calls, fresh ones under graph capture (`stream_zeros`)."""
    return stream_zeros(_counters, _lock, dev, stream, 2)


def _as_batch(x: Any) -> Any:
    """A packed (total, H, d) tensor as the (1, H, total, d) view the kernels take."""
    return x.unsqueeze(0).transpose(1, 2)


def _check_max(name: str, value: Any, total: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT_MAX:
        fail(f"{name}={value!r}: must be an int in [0, 2^31) (the longest sequence's length)")
    if value > total:
        fail(
            f"{name}={value}: longer than the {total} packed tokens; pass the longest "
            "sequence's length"
        )
    return int(value)


def _prepare(
    key: tuple[Any, ...], q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: Any,
    max_k: Any, causal: Any, scale: Any, variant: str | None,
    values: feature_values.Values,
) -> _Entry:  # fmt: skip
    """First call of a signature: validate, select, compile, load, bind (then cached)."""
    if causal is not True and causal is not False:
        fail(f"causal={causal!r}: must be True or False")
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, 3, q.device if name != "q" else None)
        if x.dtype not in _DTYPES:
            fail(
                f"{name}.dtype={x.dtype}: the varlen kernels take torch.float16 or "
                "torch.bfloat16; convert with .to(torch.bfloat16)"
            )
    n_seqs = _check_sequences(cu_q, cu_k, q)
    if n_seqs > _INT_MAX:
        fail(f"cu_seqlens_q: {n_seqs} sequences; at most 2^31 - 1")
    total_q, total_k = int(q.shape[0]), int(k.shape[0])
    mq = _check_max("max_seqlen_q", max_q, total_q)
    mk = _check_max("max_seqlen_k", max_k, total_k)
    scale_value = check_scale(scale, int(q.shape[2]))
    h, dv = int(q.shape[1]), int(v.shape[2])
    o = torch.empty((total_q, h, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((h, total_q), dtype=torch.float32, device=q.device)
    problem = check_layout(
        _as_batch(q), _as_batch(k), _as_batch(v), o=_as_batch(o), lse=lse.unsqueeze(0)
    )  # shapes, dtypes, strides, GQA, head dims: ValueError
    features = feature_args(values, q, h)
    dev = int(q.get_device())
    arch = device_arch(dev)
    align = problem.alignment(pointers=True)
    pkey = (dev, problem.d, problem.value_dim, problem.dtype, causal, align, variant,
            features.tokens)  # fmt: skip
    made = _plans.get(pkey)
    if made is None:
        if variant is not None:
            spec = KernelSpec.from_name(variant)
            if "varlen" not in spec.features:
                fail(f"spec {spec.name}: not a varlen variant; add 'varlen' to its features")
        else:
            spec = select(
                problem.d, problem.dtype, bool(causal), arch, alignment=align,
                gpu_name=torch.cuda.get_device_name(dev),
                features=(*features.tokens, "varlen"), dv=problem.value_dim,
            )  # fmt: skip
        made = runtime.device_plan(spec, arch, dev)
        _plans[pkey] = made
    check_spec(made.spec, problem, check_pointers=True)
    sizes = launch.Varlen(n_seqs=n_seqs, max_q=mq, max_k=mk)
    bound = made.bind(_without_pointers(problem), scale_value * LOG2E, features, varlen=sizes)
    entry = _Entry(bound, (total_q, h, dv), (h, total_q), q.device, q.dtype)
    launch.remember(_entries, key, entry)
    return entry


def _without_pointers(p: Any) -> Any:
    return dataclasses.replace(p, q_ptr=None, k_ptr=None, v_ptr=None, o_ptr=None, lse_ptr=None)


def _check_sequences(cu_q: Any, cu_k: Any, q: Any) -> int:
    """The number of sequences, once cu_seqlens_q and cu_seqlens_k are int32 (n_seqs + 1,)
    tensors on q's device (one clear error otherwise)."""
    n_seqs = int(cu_q.shape[0]) - 1 if isinstance(cu_q, torch.Tensor) and cu_q.dim() == 1 else -1
    if n_seqs < 0:
        fail(
            f"cu_seqlens_q: must be an int32 (n_seqs + 1,) tensor of prefix sums on q's "
            f"device, got {getattr(cu_q, 'shape', type(cu_q).__name__)}"
        )
    check_int_array("cu_seqlens_q", cu_q, (n_seqs + 1,), q.device)
    check_int_array("cu_seqlens_k", cu_k, (n_seqs + 1,), q.device)
    return n_seqs


def _key_of(x: Any) -> tuple[Any, ...]:
    return (tuple(x.shape), x.stride(), x.dtype, x.device, x.data_ptr() & 15)


def _remembered(
    entries: dict[tuple[Any, ...], Any], tensors: tuple[Any, ...], scalars: tuple[Any, ...],
    feature_arguments: tuple[Any, ...],
) -> tuple[tuple[Any, ...], Any]:  # fmt: skip
    """(the call's signature key, its remembered entry or None). The key holds the tensors'
    layouts, the scalars and the feature op arguments (`feature_args_key`: array ones by
    address, layout and device); an argument that is not a tensor or not hashable gives
    ((), None), and validation then names it."""
    try:
        key = (
            *(_key_of(x) for x in tensors), *scalars, feature_args_key(feature_arguments)
        )  # fmt: skip
        return key, entries.get(key)
    except (AttributeError, TypeError):
        return (), None


def _run(
    q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: int, max_k: int,
    causal: bool = False, scale: float | None = None, variant: str | None = None,
    *feature_arguments: Any,
) -> tuple[Any, Any]:  # fmt: skip
    """The CUDA implementation: signature lookup, allocate, launch on the current stream."""
    key, e = _remembered(
        _entries, (q, k, v, cu_q, cu_k), (max_q, max_k, causal, scale, variant),
        feature_arguments,
    )  # fmt: skip
    if e is None:
        values = op_args.values_of(feature_arguments)  # decoded and checked on a first call
        e = _prepare(key, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, variant, values)
    o = torch.empty(e.o_shape, dtype=e.dtype, device=e.device)
    lse = torch.empty(e.lse_shape, dtype=torch.float32, device=e.device)
    dev = e.device.index
    stream = raw_stream(dev)
    counter = _work_counter(dev, stream)  # held through the launch
    e.bound(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), stream,
        cu_q.data_ptr(), cu_k.data_ptr(), counter=counter.data_ptr(),
    )  # fmt: skip
    return o, lse


def _fake(
    q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: int, max_k: int,
    causal: bool = False, scale: float | None = None, variant: str | None = None,
    *feature_arguments: Any,
) -> tuple[Any, Any]:  # fmt: skip
    """Shapes only (torch.compile, fake tensors): O (total_q, H, dv) like q, LSE (H, total_q)."""
    op_args.values_of(feature_arguments)  # the scalar features' checks
    if q.dim() != 3 or v.dim() != 3:
        fail(f"q.shape={tuple(q.shape)}, v.shape={tuple(v.shape)}: must be 3-D")
    o = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return o, lse


# ---- the backward pass: dQ, dK, dV of packed sequences (family wgmma, `varlen`) -------------


@dataclass(frozen=True)
class _BwdEntry:
    """A validated backward signature: its prepared launches and the scratch a call allocates."""

    prepared: Any  # runtime.backward.Prepared
    d_shape: tuple[int, ...]
    dq_shape: tuple[int, ...]
    device: Any


_bwd_entries: dict[tuple[Any, ...], _BwdEntry] = {}
_bwd_plans: dict[tuple[Any, ...], launch.LaunchPlan] = {}


def _bwd_prepare(
    key: tuple[Any, ...], tensors: tuple[Any, ...], cu_q: Any, cu_k: Any, causal: Any,
    scale: Any, values: feature_values.Values,
) -> _BwdEntry:  # fmt: skip
    """First backward call of a signature: validate, choose, compile, load, prepare (cached)."""
    q, k, v, o, lse, do, dq, dk, dv = tensors
    if causal is not True and causal is not False:
        fail(f"causal={causal!r}: must be True or False")
    for name, x in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)):
        check_tensor(name, x, 3, q.device if name != "q" else None)
    check_tensor("lse", lse, 2, q.device)
    n_seqs = _check_sequences(cu_q, cu_k, q)
    problem = check_layout(_as_batch(q), _as_batch(k), _as_batch(v))
    if problem.dtype not in ("fp16", "bf16") or not takes_head_dim(problem.d):
        fail(
            f"d={problem.d}, dtype={problem.dtype}: the varlen backward (family wgmma) takes "
            f"d a multiple of 8 up to {MAX_HEAD_DIM} and fp16/bf16"
        )
    features = feature_args(values, q, problem.h)
    dev = int(q.get_device())
    arch = device_arch(dev)
    pkey = (dev, problem.d, problem.dtype, causal, features.tokens)
    made = _bwd_plans.get(pkey)
    if made is None:
        spec = KernelSpec(
            family="wgmma", d=problem.d, dtype=problem.dtype, causal=causal, direction="bwd",
            features=(*features.tokens, "varlen"),
        )  # fmt: skip
        made = runtime.device_plan(spec, arch, dev)
        _bwd_plans[pkey] = made
    spec = made.spec
    b = _as_batch
    bp = bwd_runtime.validate_backward(
        spec, b(q), b(k), b(v), b(o), lse.unsqueeze(0), b(do), b(dq), b(dk), b(dv),
        n_seqs=n_seqs,
    )  # fmt: skip
    value = check_scale(scale, problem.d)
    prepared = bwd_runtime.Prepared(made, spec, bp, value * LOG2E, features)
    d_shape, dq_shape = scratch_shapes(spec, 1, problem.h, problem.tq, problem.d, n_seqs)
    assert dq_shape is not None  # wgmma: always the fp32 dQ accumulator
    entry = _BwdEntry(prepared, d_shape, dq_shape, q.device)
    launch.remember(_bwd_entries, key, entry)
    return entry


def _run_backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, cu_q: Any, cu_k: Any,
    causal: bool = False, scale: float | None = None, *feature_arguments: Any,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """The CUDA backward: dq, dk, dv like q, k, v; the fp32 scratch from torch's allocator;
    three kernels on the current stream, nothing synchronized (CUDA-graph safe)."""
    # dO arrives in whatever layout autograd made; the kernels want O's kind of strides (and
    # TMA's positive ones: an expanded dO, stride 0, is copied too)
    do = do if tuple(do.stride()) == tuple(o.stride()) else do.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    key, e = _remembered(
        _bwd_entries, (q, k, v, o, lse, do, dq, dk, dv, cu_q, cu_k), (causal, scale),
        feature_arguments,
    )  # fmt: skip
    if e is None:
        values = op_args.values_of(feature_arguments)  # decoded and checked on a first call
        e = _bwd_prepare(key, (q, k, v, o, lse, do, dq, dk, dv), cu_q, cu_k, causal, scale, values)
    d_buf = torch.empty(e.d_shape, dtype=torch.float32, device=e.device)
    dq_accum = torch.empty(e.dq_shape, dtype=torch.float32, device=e.device)
    pointers = (
        q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), do.data_ptr(), lse.data_ptr(),
        d_buf.data_ptr(), dq_accum.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
    )  # fmt: skip
    e.prepared(pointers, raw_stream(e.device.index), cu_q.data_ptr(), cu_k.data_ptr())
    return dq, dk, dv


def _fake_backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, cu_q: Any, cu_k: Any,
    causal: bool = False, scale: float | None = None, *feature_arguments: Any,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """Shapes only (torch.compile, fake tensors): dq, dk, dv like q, k, v."""
    op_args.values_of(feature_arguments)  # the scalar features' checks
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# the varlen_attention op's inputs after q, k, v: cu_q, cu_k, max_q, max_k, causal, scale,
# variant, then the features
_N_OTHER_INPUTS = 7 + op_args.N_FEATURE_ARGS


def _setup_context(ctx: Any, inputs: Any, output: Any) -> None:
    q, k, v, cu_q, cu_k, _max_q, _max_k, causal, scale, _variant, *rest = inputs
    feature_args = op_args.full(tuple(rest))
    o, lse = output
    ctx.mark_non_differentiable(lse)  # gradients flow through O only
    ctx.causal, ctx.scale = causal, scale
    # the features are passed on: scalars in ctx, tensors (ALiBi's slopes) saved
    tensors = [a if isinstance(a, torch.Tensor) else None for a in feature_args]
    ctx.feature_args = tuple(None if isinstance(a, torch.Tensor) else a for a in feature_args)
    ctx.unsupported = [] if v.shape[-1] == q.shape[-1] else ["dv != d"]
    if not takes_head_dim(int(q.shape[-1])):
        ctx.unsupported.append(
            f"head dim {q.shape[-1]} (the varlen backward takes a multiple of 8 up to "
            f"{MAX_HEAD_DIM})"
        )
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, *tensors)


def _backward(ctx: Any, grad_o: Any, grad_lse: Any) -> Any:
    if ctx.unsupported:
        raise NotImplementedError(
            f"flash_attn_varlen_func: no backward pass over packed sequences with "
            f"{', '.join(ctx.unsupported)}; call it under torch.no_grad() for inference"
        )
    q, k, v, o, lse, cu_q, cu_k, *tensors = ctx.saved_tensors
    none = (None,) * _N_OTHER_INPUTS
    if grad_o is None:
        return (None, None, None, *none)
    feature_args = tuple(
        t if a is None else a for a, t in zip(ctx.feature_args, tensors, strict=True)
    )
    dq, dk, dv = _BWD_OP(q, k, v, o, lse, grad_o, cu_q, cu_k, ctx.causal, ctx.scale,
                         *feature_args)  # fmt: skip
    return (dq, dk, dv, *none)


SCHEMA = (
    "varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "int max_seqlen_q, int max_seqlen_k, bool causal=False, float? scale=None, "
    f"str? variant=None, {op_args.FEATURE_SCHEMA}) -> (Tensor, Tensor)"
)
"""The custom op `torch.ops.flashgen.varlen_attention`."""
BWD_SCHEMA = (
    "varlen_attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, "
    "Tensor cu_seqlens_q, Tensor cu_seqlens_k, bool causal=False, float? scale=None, "
    f"{op_args.FEATURE_SCHEMA}) -> (Tensor, Tensor, Tensor)"
)
"""The custom op `torch.ops.flashgen.varlen_attention_backward`: dq, dk, dv packed like q, k, v
from the forward's q, k, v, o, lse (H, total_q) and dO."""

_library: Any = torch.library  # partly untyped: keep mypy --strict quiet with torch installed
_LIB: Any = _library.Library("flashgen", "FRAGMENT")
_LIB.define(SCHEMA)
_LIB.define(BWD_SCHEMA)
_LIB.impl("varlen_attention", _run, "CUDA")
_LIB.impl("varlen_attention", _run, "CPU")  # validation refuses CPU tensors by name
_library.register_fake("flashgen::varlen_attention", _fake, lib=_LIB)
_LIB.impl("varlen_attention_backward", _run_backward, "CUDA")
_library.register_fake("flashgen::varlen_attention_backward", _fake_backward, lib=_LIB)
_library.register_autograd(
    "flashgen::varlen_attention", _backward, setup_context=_setup_context, lib=_LIB
)
_OP = torch.ops.flashgen.varlen_attention.default
_BWD_OP = torch.ops.flashgen.varlen_attention_backward.default


def _direct(q: Any, k: Any, v: Any) -> bool:
    """True when the dispatcher would add nothing: eager, plain tensors, no autograd, no modes."""
    return (
        not torch.compiler.is_compiling()
        and type(q) is torch.Tensor and q.is_cuda
        and not (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)))
        and not dispatch_stack()
        and not function_modes()
    )  # fmt: skip


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Any = None,
    *,
    return_lse: bool = False,
    spec: KernelSpec | None = None,
) -> Any:
    """softmax(Q·Kᵀ·scale + mask)·V of each packed sequence on its own; O (and LSE).

    Layouts (module docstring): q (total_q, H, d), k and v (total_k, H_kv, d | dv), float16
    or bfloat16 on one CUDA device, the d axis contiguous; `cu_seqlens_q`/`cu_seqlens_k`
    int32 (n_seqs + 1,) prefix sums on q's device; `max_seqlen_q`/`max_seqlen_k` the longest
    lengths (ints). H a multiple of H_kv (GQA/MQA). `softmax_scale` defaults to 1/sqrt(d);
    `causal` masks key j for query i when j > i + len_k - len_q in each sequence;
    `window_size=(left, right)` (-1: unbounded), `softcap` (0: off) and `alibi_slopes`
    (float32 (H,)) as in FlashAttention. Returns O (total_q, H, dv) in q's dtype, or (O, LSE)
    with `return_lse` (LSE float32 (H, total_q), natural log; -inf for a row that sees no
    key). `spec` names the variant (a forward KernelSpec with the `varlen` feature); None
    chooses one. FlashAttention's arguments in its order: `dropout_p` must be 0.0 (no
    attention dropout), `deterministic=True` is refused (the varlen backward has no
    deterministic mode), `return_attn_probs=True` returns (O, LSE, None), `block_table`
    (paged K/V) is refused: decode against paged caches with `flash_attn_with_kvcache`.

    Runs on the current stream, never synchronizes, allocates through torch's caching
    allocator (CUDA-graph capturable after a first call). Differentiable (d a multiple of 8 up
    to 128, dv = d): autograd runs the varlen backward (module docstring). Example::

        import torch
        from flashgen.torch import flash_attn_varlen_func

        lens = torch.tensor([0, 700, 1900, 4096], dtype=torch.int32, device="cuda")
        q = torch.randn(4096, 16, 128, device="cuda", dtype=torch.bfloat16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        o = flash_attn_varlen_func(q, k, v, lens, lens, 2196, 2196, causal=True)
    """
    if causal is not True and causal is not False:
        fail(f"causal={causal!r}: must be True or False")
    if softmax_scale is not None:
        softmax_scale = check_scale(softmax_scale, 1)
    keywords = fa_features(window_size, softcap, alibi_slopes, dropout_p)
    if deterministic is not False:
        fail(
            f"deterministic={deterministic!r}: the varlen backward has no deterministic mode; "
            "pass False (the forward is deterministic either way)"
        )
    if block_table is not None:
        fail(
            "block_table: paged K/V is not supported for packed sequences; decode against a "
            "paged cache with flash_attn_with_kvcache"
        )
    values = feature_values.from_keywords(keywords, "flash_attn_varlen_func")
    if spec is not None and not isinstance(spec, KernelSpec):
        fail(f"spec={spec!r}: must be a forward KernelSpec with the varlen feature, or None")
    variant = spec.name if spec is not None else None
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
            softmax_scale, variant, *op_args.op_args(values))  # fmt: skip
    o, lse = _run(*args) if _direct(q, k, v) else _OP(*args)
    if return_attn_probs:
        return o, lse, None
    return (o, lse) if return_lse else o


def flash_attn_varlen_qkvpacked_func(
    qkv: Any,
    cu_seqlens: Any,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """FlashAttention's `flash_attn_varlen_qkvpacked_func`: `flash_attn_varlen_func` on qkv
    (total, 3, H, d), q, k and v its views (gradients flow back into it), one set of prefix
    sums for all three."""
    _check_packed("qkv", qkv, 3)
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q: Any,
    kv: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """FlashAttention's `flash_attn_varlen_kvpacked_func`: `flash_attn_varlen_func` on q
    (total_q, H, d) and kv (total_k, 2, H_kv, d)."""
    _check_packed("kv", kv, 2)
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
    )  # fmt: skip


def _check_packed(name: str, x: Any, parts: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[1] != parts:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        fail(f"{name}: {got}; must be a (total, {parts}, H, d) torch tensor")


def clear_cache() -> None:
    """Forget every validated signature and selection (the loaded kernels stay cached)."""
    with _lock:
        _entries.clear()
        _plans.clear()
        _bwd_entries.clear()
        _bwd_plans.clear()
        _counters.clear()


__all__ = [
    "BWD_SCHEMA",
    "SCHEMA",
    "clear_cache",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]
