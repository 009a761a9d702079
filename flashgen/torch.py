"""`flashgen.torch`: generated FlashAttention kernels as a PyTorch operator.

`attention(q, k, v, *, causal=False, scale=None, return_lse=False, spec=None,
deterministic=False, **features)` (features by keyword: `window`, `softcap`, `alibi_slopes`)
runs on CUDA tensors and returns torch tensors. It is registered as the custom op
`torch.ops.flashgen.attention` (schema below) with a fake implementation, so
`torch.compile(..., fullgraph=True)` traces it as one graph node, and it can be captured in a
CUDA graph: outputs come from torch's caching allocator on q's device, the kernel is launched on
`torch.cuda.current_stream(q.device)` in that device's primary context, and nothing synchronizes
or depends on data.

Host path, per call: a signature (shapes, strides, dtypes, devices, pointer alignment, causal,
scale, variant) is looked up in a dict. The first call of a signature validates everything (the
same ValueErrors as `flashgen.attention`, naming value, rule and fix), selects the variant,
compiles it for the tensor's GPU (cached on disk) and binds a launch plan
(`flashgen.runtime.launch`); every later call allocates O and LSE and issues one
`cuLaunchKernel`. In eager mode, with plain tensors and no autograd or dispatch mode in play,
`attention` calls that path directly; otherwise (torch.compile, fake tensors, tensors that
require grad, dispatch modes) it goes through the dispatcher.

Gradients: the op is differentiable (fp16/bf16, d <= 128, dv = d; with the window, softcap
and ALiBi features too) through the custom op `torch.ops.flashgen.attention_backward` (O and
LSE saved, and the ALiBi slopes; the feature values are passed on to it, and it runs the
backward variant compiled with the call's features). On an sm_90 GPU (H100/H200) a call that
fits family wgmma's backward (d a multiple of 8 up to 128, fp16/bf16, TMA-loadable strides)
runs it (TMA + wgmma, dQ added by bulk reductions); every other call runs family mma's.
`deterministic=True` runs the same family's deterministic variant, whose dQ, dK and dV are
bit-identical run to run: wgmma's adds into dQ in a fixed order (a semaphore per query tile),
mma's computes dQ without floating-point atomics. FLASHGEN_WGMMA_BWD=0 in the environment
keeps sm_90 on mma's backward too. The choice is made on a signature's first backward call;
`clear_cache()` forgets it. A backward through a call the kernels cannot serve (fp32, d > 128,
dv != d) raises NotImplementedError naming it.

Decoding against a K/V cache (contiguous or paged, variable lengths, split over the keys):
`attention_with_kvcache`, from `flashgen.kvcache`; FlashAttention's `flash_attn_with_kvcache`
(appending the new tokens' K/V into the cache first) and `append_kv`, from
`flashgen.kvappend`. A call of `attention` itself with few query rows against many keys
(Tq <= 16, Tk >= 256 and >= 4 Tq: `runtime.decode.routes_to_decode`) and no `spec` runs that
decode kernel too (GQA heads packed, keys split over the GPU), with the same O, LSE and
gradients.

O has q's memory layout (dense, in the order of q's strides), so for a (B, T, H, d) model
layout passed as a transposed view, `o.transpose(1, 2)` is contiguous (B, T, H, d) again.
LSE is float32 (B, H, Tq), natural log.

FlashAttention's dense calls take that layout directly: `flash_attn_func(q, k, v, ...)` with
(B, T, H, d) tensors and its argument names, and `flash_attn_qkvpacked_func` /
`flash_attn_kvpacked_func` on a fused projection's (B, T, 3, H, d) / (B, T, 2, H_kv, d);
packed sequences: `flash_attn_varlen_func` (and its `qkvpacked`/`kvpacked` forms), from
`flashgen.varlen`. torch's own `scaled_dot_product_attention(query, key, value, ...)` call runs
`attention` as well (no dense masks, no dropout).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    import torch
except ImportError as _exc:  # one line, says what is missing and what still works
    raise ImportError(
        f"flashgen.torch needs PyTorch, which cannot be imported ({_exc}); install torch "
        "(`import flashgen` and flashgen.attention work without it)"
    ) from None

import numpy as np

from flashgen.generator.dtypes import DTYPES
from flashgen.generator.features import (
    FeatureArgs,
    FeatureKeywords,
)
from flashgen.generator.numerics import LOG2E
from flashgen.generator.select import packs_gqa, select
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import feature_values, launch, op_args
from flashgen.runtime import gpu as runtime
from flashgen.runtime.validate import (
    Problem,
    check_head_dims,
    check_layout,
    check_scale,
    check_spec,
    check_spec_fits_call,
    check_spec_type,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack  # Python 3.10 has no typing.Unpack

from flashgen.hooked import BlockMap, block_map, hook_op_args, hooked_attention  # noqa: E402
from flashgen.kvappend import append_kv, flash_attn_with_kvcache  # noqa: E402
from flashgen.kvcache import (  # noqa: E402  (after torch's import check)
    DenseDecode,
    attention_with_kvcache,
    dense_decode,
)
from flashgen.sinks import HookedSinkAttention, SinkAttention, check_sinks  # noqa: E402
from flashgen.torch_support import WGMMA_BWD_ENV as WGMMA_BWD_ENV  # noqa: E402 (re-exported)
from flashgen.torch_support import (  # noqa: E402
    backward_family_for,
    dispatch_stack,
    eager_autograd,
    fa_features,
    feature_args,
    feature_args_key,
    function_modes,
    out_strides,
    raw_stream,
    run_backward,
)
from flashgen.torch_support import device_arch as _device_arch  # noqa: E402 (tests patch it)
from flashgen.varlen import (  # noqa: E402
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

__all__ = [
    "SCHEMA",
    "BlockMap",
    "append_kv",
    "attention",
    "attention_with_kvcache",
    "block_map",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "scaled_dot_product_attention",
]


# ---- the features as op arguments (runtime/op_args.py) ----------------------------------------
_op_args = op_args.op_args
_values = op_args.values_of
_arrays_of = op_args.arrays_of
_full = op_args.full
N_FEATURE_ARGS = op_args.N_FEATURE_ARGS
FEATURE_SCHEMA = op_args.FEATURE_SCHEMA


SCHEMA = (
    "attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, "
    f"str? variant=None, {FEATURE_SCHEMA}, bool deterministic=False) -> (Tensor, Tensor)"
)

_library: Any = torch.library  # partly untyped: keep mypy --strict quiet with torch installed
_LIB: Any = _library.Library("flashgen", "DEF")
_LIB.define(SCHEMA)


# ---- layout ---------------------------------------------------------------------------------
def _concrete(x: Any) -> bool:
    return isinstance(x, int)


_NP_DTYPES: dict[Any, np.dtype[Any]] = {
    getattr(torch, np.dtype(info.numpy).name): np.dtype(info.numpy) for info in DTYPES.values()
}


@dataclass(frozen=True)
class _Shim:
    """What validate.describe reads from an array: shape, byte strides, dtype (no pointer)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype[Any]


def _shim(name: str, t: Any) -> _Shim | None:
    """A pointer-free stand-in for a (fake) tensor, or None when its sizes are symbolic."""
    if t.dtype not in _NP_DTYPES:
        raise ValueError(
            f"{name}.dtype={t.dtype}: unsupported; use torch.float32, float16 or bfloat16"
        )
    sizes, strides = tuple(t.shape), tuple(t.stride())
    if not all(_concrete(x) for x in (*sizes, *strides)):
        return None
    size = t.element_size()
    return _Shim(sizes, tuple(s * size for s in strides), _NP_DTYPES[t.dtype])


def _fake_checks(q: Any, k: Any, v: Any, causal: bool, scale: float | None) -> None:
    """The layout checks that need no data, on fake tensors (same ValueErrors as a real call)."""
    if causal is not True and causal is not False:
        raise ValueError(f"causal={causal!r}: must be True or False")
    shims = [_shim(n, t) for n, t in zip("qkv", (q, k, v), strict=True)]
    if all(s is not None for s in shims):
        problem = check_layout(*shims)
        check_head_dims(problem)
        check_scale(scale, problem.d)


# ---- the op's implementations ----------------------------------------------------------------
def _fake(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    variant: str | None = None, *rest: Any,
) -> tuple[Any, Any]:  # fmt: skip
    _fake_checks(q, k, v, causal, scale)
    _values(rest[:N_FEATURE_ARGS])  # the scalar features' checks
    if variant is not None:
        KernelSpec.from_name(variant)
    o_shape = (*tuple(q.shape)[:3], v.shape[3])  # v's head dim (dv)
    o = q.new_empty_strided(o_shape, out_strides(o_shape, tuple(q.stride())))
    lse = q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)
    return o, lse


@dataclass(frozen=True)
class _Entry:
    """A validated signature: the bound launch and how to allocate O and LSE."""

    bound: launch.Bound | DenseDecode  # the forward's bound launch, or the decode route
    device: Any  # torch.device
    dtype: Any  # torch dtype of q, k, v, O
    o_shape: tuple[int, ...]
    o_stride: tuple[int, ...]
    lse_shape: tuple[int, int, int]


_entries: dict[tuple[Any, ...], _Entry] = {}
_entries_lock = threading.Lock()


def _run(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    variant: str | None = None, *rest: Any,
) -> tuple[Any, Any]:  # fmt: skip
    """The CUDA implementation: signature lookup, allocate, launch on the current stream.
    `rest`: the feature arguments, then `deterministic`, which only rides along to the
    backward (setup_context reads it): the forward has no atomics and computes the same
    either way."""
    feature_args = rest[:N_FEATURE_ARGS]
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    dev = q.get_device()
    key = (
        q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
        dev, k.get_device(), v.get_device(), (qp | kp | vp) & 15, causal, scale, variant,
        feature_args_key(feature_args),
    )  # fmt: skip
    try:
        e = _entries.get(key)
    except TypeError:  # an unhashable scale: validation names it
        e = None
    if e is None:
        e = _prepare(key, q, k, v, causal, scale, variant, feature_args)
    o = torch.empty_strided(e.o_shape, e.o_stride, dtype=e.dtype, device=e.device)
    lse = torch.empty(e.lse_shape, dtype=torch.float32, device=e.device)
    e.bound(qp, kp, vp, o.data_ptr(), lse.data_ptr(), _raw_stream(dev))
    return o, lse


_raw_stream = raw_stream  # flashgen.torch_support's (tests stand a CPU one in)


def _feature_args(problem: Problem, args: tuple[Any, ...], q: Any) -> FeatureArgs:
    """A call's feature values from its op arguments, validated (the forward's and the
    backward's): scalar ones by their feature, array ones' shape, dtype, layout and device
    (q's)."""
    return feature_args(_values(args), q, problem.h)


def _prepare(
    key: tuple[Any, ...], q: Any, k: Any, v: Any, causal: Any, scale: Any, variant: Any,
    feature_args: tuple[Any, ...],
) -> _Entry:  # fmt: skip
    """First call of a signature: validate, select, compile, load, bind (then cached)."""
    if causal is not True and causal is not False:
        raise ValueError(f"causal={causal!r}: must be True or False")
    problem = check_layout(q, k, v)  # CPU tensors, shapes, dtypes, strides: ValueError
    check_head_dims(problem)
    value = check_scale(scale, problem.d)
    arrays = _arrays_of(feature_args)
    devices = [t.device for t in (q, k, v, *(a for _, a in arrays))]
    if len(set(devices)) > 1:
        names = "".join(f", {f.keyword}" for f, _ in arrays)
        raise ValueError(
            f"q, k, v{names} on {', '.join(map(str, devices))}: must be on one device; move "
            "them with .to(q.device)"
        )
    features = _feature_args(problem, feature_args, q)
    dev = int(q.get_device())
    shape = (*(int(n) for n in q.shape[:3]), int(v.shape[3]))  # O: q's rows, v's head dim
    o_stride = out_strides(shape, tuple(int(s) for s in q.stride()))
    # few query rows against many keys: the decode kernel (split over the keys), unless the
    # call names a variant
    route = (
        dense_decode(q, k, v, bool(causal), scale, _values(feature_args), o_stride)
        if variant is None else None
    )  # fmt: skip
    bound: launch.Bound | DenseDecode
    if route is not None:
        bound = route
    else:
        chosen = _variant_for(problem, bool(causal), variant, dev, features)
        o = torch.empty_strided(shape, o_stride, dtype=q.dtype, device=q.device)
        lse = torch.empty(shape[:3], dtype=torch.float32, device=q.device)
        full = check_layout(q, k, v, o=o, lse=lse)
        check_spec(chosen.spec, full, check_pointers=True)
        bound = chosen.bind(_without_pointers(full), value * LOG2E, features)
    entry = _Entry(bound, q.device, q.dtype, shape, o_stride, (shape[0], shape[1], shape[2]))
    launch.remember(_entries, key, entry)  # bounded: a decode loop's Tk grows every step
    return entry


# (device, d, dtype, causal, alignment, variant, features, GQA packing) -> loaded plan: a new
# signature of a known kind (another length) skips selection and loading
_plans: dict[tuple[Any, ...], launch.LaunchPlan] = {}


def _variant_for(
    problem: Problem, causal: bool, variant: str | None, dev: int, features: FeatureArgs
) -> launch.LaunchPlan:
    """The plan for this call's variant: the named one (checked against the call) or selected."""
    align = problem.alignment(pointers=True)
    dims = (problem.d, problem.value_dim)
    kv_heads = problem.b * problem.kv_heads
    packs = variant is None and packs_gqa(problem.kv_group, problem.tq, kv_heads)  # select's
    key = (dev, dims, problem.dtype, causal, align, variant, features.tokens, packs)
    hit = _plans.get(key)
    if variant is not None:
        spec = hit.spec if hit is not None else KernelSpec.from_name(variant)
        check_spec_fits_call(spec, problem, causal)
        check_spec(spec, problem, check_pointers=True)
    if hit is not None:
        return hit
    arch = _device_arch(dev)
    if variant is None:
        spec = select(
            problem.d, problem.dtype, causal, arch, alignment=align,
            gpu_name=torch.cuda.get_device_name(dev), features=features.tokens,
            dv=problem.value_dim, kv_group=problem.kv_group, tq=problem.tq,
            kv_heads=problem.b * problem.kv_heads,
        )  # fmt: skip
    made = runtime.device_plan(spec, arch, dev)
    _plans[key] = made
    return made


def _without_pointers(p: Problem) -> Problem:
    return Problem(
        p.b,
        p.h,
        p.tq,
        p.tk,
        p.d,
        p.dtype,
        p.q_strides,
        p.k_strides,
        p.v_strides,
        p.o_strides,
        h_kv=p.h_kv,
        dv=p.dv,
    )


def _cpu(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None,
    variant: str | None = None, *rest: Any,
) -> tuple[Any, Any]:  # fmt: skip
    """CPU tensors: the validation error that says what to do (the kernels run on CUDA)."""
    check_layout(q, k, v)  # raises "q: a CPU tensor; move it to the GPU"
    raise ValueError("q: a CPU tensor; move it to the GPU (.cuda())")  # pragma: no cover


# ---- the backward pass: dQ, dK, dV from Q, K, V, O, LSE and dO (families mma and wgmma) -------
BWD_SCHEMA = (
    "attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, "
    f"bool causal, float? scale, bool deterministic=False, {FEATURE_SCHEMA}) "
    "-> (Tensor, Tensor, Tensor)"
)
_LIB.define(BWD_SCHEMA)
BWD_MAX_D = 128  # the widest head dim family mma's backward holds dK and dV for in registers

# "0": family mma's backward on sm_90 GPUs too (the default there: wgmma's, where the call fits)
# (device, d, dtype, causal, deterministic, family, feature tokens) -> the backward plan
_bwd_plans: dict[tuple[Any, ...], launch.LaunchPlan] = {}


def _bwd_family(dev: int, problem: Problem, deterministic: bool, tensors: tuple[Any, ...]) -> str:
    """The backward's family for a call (`torch_support.backward_family_for`)."""
    return backward_family_for(_device_arch(dev), problem, deterministic, tensors)


def _bwd_plan(
    dev: int, d: int, dtype: str, causal: bool, deterministic: bool, family: str,
    features: tuple[str, ...] = (),
) -> tuple[KernelSpec, launch.LaunchPlan]:  # fmt: skip
    """The backward variant (the family's default tile) for a call, compiled and loaded:
    `features` are the call's feature tokens (`FeatureArgs.tokens`: window, softcap, alibi),
    compiled in beside `deterministic`."""
    key = (dev, d, dtype, causal, deterministic, family, tuple(features))
    hit = _bwd_plans.get(key)
    if hit is None:
        feats = (*features, *(("deterministic",) if deterministic else ()))
        spec = KernelSpec(
            family=family, d=d, dtype=dtype, causal=causal, direction="bwd", features=feats
        )
        hit = runtime.device_plan(spec, _device_arch(dev), dev)
        _bwd_plans[key] = hit
    return hit.spec, hit


def _run_backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool, scale: float | None,
    deterministic: bool = False, *feature_args: Any,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """The CUDA backward: fp32 scratch from torch's allocator, three kernels on the current
    stream, nothing synchronized (CUDA-graph safe like the forward). `deterministic`: the
    variant without atomics (bit-identical gradients; no fp32 dQ accumulator allocated).
    The feature arguments are the forward's (`_op_args`: window sides -1 unbounded, softcap
    0.0 off, the ALiBi slopes a float32 (H,) tensor on q's device or None); the variant is
    compiled with the features they use."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    # dO arrives in whatever layout autograd made; the kernels want O's kind of strides (and
    # the wgmma backward's TMA positive strides: an expanded dO, stride 0, is copied too)
    do = do if tuple(do.stride()) == tuple(o.stride()) else do.contiguous()
    tensors = (q, k, v, o, lse, do)
    det = bool(deterministic)
    key = (
        *((t.shape, t.stride(), t.dtype) for t in tensors), q.get_device(),
        tuple(t.data_ptr() & 15 for t in tensors), bool(causal), scale, det,
        feature_args_key(feature_args),
    )  # fmt: skip
    try:
        hit = _bwd_entries.get(key)
    except TypeError:  # an unhashable argument: validation names it
        hit = None
    if hit is None:  # first call of this signature: validate everything, then reuse
        hit = _bwd_prepare(key, (*tensors, dq, dk, dv), bool(causal), scale, det, feature_args)
    prepared, dev = hit
    run_backward(prepared, (q, k, v, o, lse, do, dq, dk, dv), _raw_stream(dev))
    return dq, dk, dv


def _bwd_prepare(
    key: tuple[Any, ...], tensors: tuple[Any, ...], causal: bool, scale: Any, det: bool,
    feature_args: tuple[Any, ...],
) -> tuple[Any, int]:  # fmt: skip
    """First backward call of a signature: validate (q, k, v, o, lse, do, dq, dk, dv and the
    feature values), choose and load the variant, prepare its launches (then cached)."""
    from flashgen.runtime import backward

    q, k, v, o, lse, do, dq, dk, dv = tensors
    problem = check_layout(q, k, v)
    dev = int(q.get_device())
    features = _feature_args(problem, feature_args, q)
    family = _bwd_family(dev, problem, det, (q, k, v, o, do))
    spec, plan = _bwd_plan(
        dev, problem.d, problem.dtype, causal, det, family, features=features.tokens
    )
    bp = backward.validate_backward(spec, q, k, v, o, lse, do, dq, dk, dv)
    value = check_scale(scale, problem.d)
    hit = (backward.Prepared(plan, spec, bp, value * LOG2E, features), dev)
    launch.remember(_bwd_entries, key, hit)
    return hit


# backward signature (shapes, strides, dtypes, device, pointer alignment, causal, scale, mode,
# feature values and the ALiBi slopes' pointer) -> (prepared launches, device): later calls of
# a signature skip validation
_bwd_entries: dict[tuple[Any, ...], tuple[Any, int]] = {}


def _fake_backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool, scale: float | None,
    deterministic: bool = False, *feature_args: Any,
) -> tuple[Any, Any, Any]:  # fmt: skip
    _values(feature_args)  # the scalar features' checks
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_LIB.impl("attention_backward", _run_backward, "CUDA")
_library.register_fake("flashgen::attention_backward", _fake_backward, lib=_LIB)


def _setup_context(ctx: Any, inputs: Any, output: Any) -> None:
    q, k, v, causal, scale, variant, *rest = inputs
    feature_args = rest[:N_FEATURE_ARGS]
    deterministic = rest[N_FEATURE_ARGS] if len(rest) > N_FEATURE_ARGS else False
    o, lse = output
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic
    # the features are passed on: the scalar arguments in ctx, the tensors (ALiBi's slopes)
    # saved with the inputs
    tensors = [a if isinstance(a, _Tensor) else None for a in feature_args]
    ctx.feature_args = tuple(None if isinstance(a, _Tensor) else a for a in feature_args)
    # what the backward kernels cannot serve: say so when gradients are asked
    ctx.unsupported = ["dv != d"] if v.shape[-1] != q.shape[-1] else []
    if q.dtype not in (torch.float16, torch.bfloat16):
        ctx.unsupported.append(f"dtype {q.dtype} (the backward kernels are fp16/bf16)")
    if q.shape[-1] > BWD_MAX_D:
        ctx.unsupported.append(
            f"head dim {q.shape[-1]} (the backward kernels take d <= {BWD_MAX_D})"
        )
    ctx.mark_non_differentiable(lse)  # gradients flow through O only
    # only O and LSE besides the inputs (and the features' tensors, or None): no P, no S
    ctx.save_for_backward(q, k, v, o, lse, *tensors)


def _backward(ctx: Any, grad_o: Any, grad_lse: Any) -> Any:
    if ctx.unsupported:
        raise NotImplementedError(
            f"flashgen.torch.attention: no backward pass yet with {', '.join(ctx.unsupported)}; "
            "call it under torch.no_grad() for inference, or train without them"
        )
    q, k, v, o, lse, *tensors = ctx.saved_tensors
    none = (None,) * (4 + N_FEATURE_ARGS)  # causal, scale, variant, features, deterministic
    if grad_o is None:
        return (None, None, None, *none)
    feature_args = tuple(
        t if a is None else a for a, t in zip(ctx.feature_args, tensors, strict=True)
    )
    dq, dk, dv = _BWD_OP(
        q, k, v, o, lse, grad_o, ctx.causal, ctx.scale, ctx.deterministic, *feature_args
    )  # fmt: skip
    return (dq, dk, dv, *none)


_LIB.impl("attention", _run, "CUDA")
_LIB.impl("attention", _cpu, "CPU")
_library.register_fake("flashgen::attention", _fake, lib=_LIB)
_library.register_autograd("flashgen::attention", _backward, setup_context=_setup_context, lib=_LIB)

_OP = torch.ops.flashgen.attention.default
_BWD_OP = torch.ops.flashgen.attention_backward.default


# ---- the public function ---------------------------------------------------------------------
_assume_constant_result: Any = torch.compiler.assume_constant_result


def _spec_name(spec: KernelSpec) -> str:
    return spec.name


# torch.compile takes the name as a constant instead of tracing the spec's properties
_variant_name: Callable[[KernelSpec], str] = _assume_constant_result(_spec_name)


_is_compiling = torch.compiler.is_compiling
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_dispatch_stack = dispatch_stack  # flashgen.kvcache's
_function_modes = function_modes


def _direct(q: Any, k: Any, v: Any) -> bool:
    """True when the dispatcher would add nothing: eager, plain tensors, no autograd, no modes."""
    return (
        not _is_compiling()
        and type(q) is _Tensor and q.is_cuda and type(k) is _Tensor and type(v) is _Tensor
        and not (_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        and not _dispatch_stack()
        and not _function_modes()
    )  # fmt: skip


class _EagerAttention(torch.autograd.Function):
    """`flashgen::attention` with its registered autograd formula (`_setup_context`,
    `_backward`), for eager calls only (`torch_support.eager_autograd`): the same kernels,
    saved tensors and gradients.
    `apply(q, k, v, causal, scale, variant, deterministic, *feature_args)`."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: Any, k: Any, v: Any, causal: bool, scale: float | None,
        variant: str | None, deterministic: bool, *feature_args: Any,
    ) -> tuple[Any, Any]:  # fmt: skip
        o, lse = _run(q, k, v, causal, scale, variant, *feature_args)
        _setup_context(ctx, (q, k, v, causal, scale, variant, *feature_args, deterministic),
                       (o, lse))  # fmt: skip
        return o, lse

    @staticmethod
    def backward(ctx: Any, grad_o: Any, grad_lse: Any) -> Any:  # type: ignore[override]
        dq, dk, dv, *_ = _backward(ctx, grad_o, grad_lse)
        return (dq, dk, dv, None, None, None, None, *(None,) * len(ctx.feature_args))


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    spec: KernelSpec | None = None,
    deterministic: bool = False,
    score_mod: Any = None,
    mask_mod: Any = None,
    aux: Mapping[str, Any] | None = None,
    sinks: Any = None,
    block_map: BlockMap | None = None,
    **features: Unpack[FeatureKeywords],
) -> Any:
    """softmax(Q·Kᵀ·scale + mask)·V on CUDA tensors; O (and LSE) as torch tensors.

    q is (B, H, Tq, d), k and v are (B, H_kv, Tk, d) with H a multiple of H_kv (GQA/MQA),
    d any multiple of 8 up to 256: float32, float16 or bfloat16, one device,
    any strides with the d axis contiguous (a (B, T, H, d) tensor passes as
    `x.transpose(1, 2)`, no copy). `causal` masks key j for query i when j > i + Tk - Tq
    (bottom-right aligned). `scale` defaults to 1/sqrt(d). `spec=None` picks a shipped variant
    for (d, dtype, causal, the tensor's GPU). Returns O with q's dtype and memory layout on q's
    device, or (O, LSE) with `return_lse` (LSE float32 (B, H, Tq), natural log).
    Features, as in `flashgen.attention`: `window=(left, right)` (-1 unbounded), `softcap=c`,
    `alibi_slopes` a float32 (H,) tensor on q's device; the backward pass takes them too.
    `deterministic=True` makes the backward pass (when gradients are asked) use the variant
    without floating-point atomics: dQ, dK, dV bit-identical run to run, somewhat slower.
    The forward is the same either way.
    `score_mod` / `mask_mod`: user hooks (docs/hooks.md), a traced hook or a function without
    aux, with their aux values by name in `aux` (int32/float32 tensors on q's device, or
    numbers); the forward then runs the variant an unhooked call would (family wgmma's on
    Hopper) compiled with them, the backward family mma's (flashgen.hooked; not with `spec`).
    `sinks`: a float32 (H,) tensor on q's device, one logit per query head that joins every
    row's softmax as a key with no value (gpt-oss's attention sinks); gradients flow to it
    (flashgen.sinks; with score_mod/mask_mod too). LSE then includes the sink.
    `block_map`: a mask_mod's tile verdicts built once for calls like this one
    (`flashgen.torch.block_map(q, k, v, mask_mod=..., aux=...)`, docs/hooks.md), passed to
    every such call (layers, steps) instead of rebuilt per call.

    Runs on the current stream of q's device, never synchronizes, allocates only through
    torch's caching allocator: safe inside CUDA-graph capture (after one warm-up call per
    signature, which compiles and loads the kernel) and under torch.compile(fullgraph=True).
    Bad inputs raise ValueError naming value, rule and fix, as flashgen.attention does.

    Example::

        import torch
        import flashgen.torch as fgt

        B, T, H, d = 2, 1024, 16, 128
        qkv = torch.randn(B, T, 3, H, d, device="cuda", dtype=torch.bfloat16)
        q, k, v = (x.transpose(1, 2) for x in qkv.unbind(2))  # (B, H, T, d) views
        o = fgt.attention(q, k, v, causal=True)
        y = o.transpose(1, 2).reshape(B, T, H * d)  # no copy: O has q's layout
    """
    if causal is not True and causal is not False:
        raise ValueError(f"causal={causal!r}: must be True or False")
    if deterministic is not True and deterministic is not False:
        raise ValueError(f"deterministic={deterministic!r}: must be True or False")
    if scale is not None:
        scale = check_scale(scale, 1)
    args = _op_args(feature_values.from_keywords(features, "flashgen.torch.attention"))
    if block_map is not None and mask_mod is None:
        raise ValueError(
            "block_map without mask_mod: a block map holds a mask_mod's verdicts; pass the "
            "mask_mod (and aux) it was built with"
        )
    if score_mod is not None or mask_mod is not None or aux is not None:
        if spec is not None:
            raise ValueError(
                "spec and score_mod/mask_mod: a hooked call picks its own variant (the "
                "unhooked call's, with the hooks compiled in); drop spec"
            )
        if sinks is not None:
            check_sinks(sinks, q)
            hooks, tensors, floats, ints = hook_op_args(score_mod, mask_mod, aux, q)
            if block_map is not None:
                tensors, ints = block_map.op_args(hooks, tensors, ints, q, k, v, causal)
            o, lse = HookedSinkAttention.apply(  # type: ignore[no-untyped-call]
                q, k, v, sinks, causal, scale, deterministic, hooks, floats, ints,
                len(tensors), *tensors, *args,
            )  # fmt: skip
            return (o, lse) if return_lse else o
        o, lse = hooked_attention(
            q, k, v, score_mod=score_mod, mask_mod=mask_mod, aux=aux, causal=causal,
            scale=scale, deterministic=deterministic, feature_arguments=args,
            block_map=block_map,
        )  # fmt: skip
        return (o, lse) if return_lse else o
    variant = None
    if spec is not None:
        check_spec_type(spec)
        variant = _variant_name(spec)
    if sinks is not None:
        check_sinks(sinks, q)
        o, lse = SinkAttention.apply(  # type: ignore[no-untyped-call]
            q, k, v, sinks, causal, scale, variant, deterministic, *args
        )
        return (o, lse) if return_lse else o
    if _direct(q, k, v):
        o, lse = _run(q, k, v, causal, scale, variant, *args)
    elif eager_autograd(q, k, v, [a for a in args if isinstance(a, _Tensor)]):
        o, lse = _EagerAttention.apply(  # type: ignore[no-untyped-call]
            q, k, v, causal, scale, variant, deterministic, *args
        )
    else:
        o, lse = _OP(q, k, v, causal, scale, variant, *args, deterministic)
    return (o, lse) if return_lse else o


# ---- FlashAttention's dense calls: (B, T, H, d) tensors --------------------------------------
def flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """FlashAttention's `flash_attn_func` on `attention`: q (B, Tq, H, d), k and v
    (B, Tk, H_kv, d) and (B, Tk, H_kv, dv), as FlashAttention takes them (no copy: they are
    passed as (B, H, T, d) views). `causal` bottom-right aligned, `window_size` (left, right)
    with -1 unbounded, `softcap` 0.0 off, `alibi_slopes` float32 (H,), `deterministic` for
    the backward, as FlashAttention's. Returns out (B, Tq, H, dv), dense in that layout; with
    `return_attn_probs`, (out, softmax_lse (B, H, Tq) float32, None): flashgen has no
    dropout, so there is no probability mask to return. `dropout_p` must be 0.0.
    Differentiable, CUDA-graph safe and traceable as `attention` is."""
    _check_fa_operands(("q", q), ("k", k), ("v", v))
    features = fa_features(window_size, softcap, alibi_slopes, dropout_p)
    o, lse = attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
        scale=softmax_scale, return_lse=True, deterministic=deterministic, **features,
    )  # fmt: skip
    out = o.transpose(1, 2)  # O has q's layout: (B, Tq, H, dv) dense
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(
    qkv: Any,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """FlashAttention's `flash_attn_qkvpacked_func`: `flash_attn_func` on qkv (B, T, 3, H, d)
    (a fused projection's output; q, k, v are views of it, gradients flow back into it)."""
    _check_fa_operands(("qkv", qkv), dims=5, packed=3)
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)  # fmt: skip


def flash_attn_kvpacked_func(
    q: Any,
    kv: Any,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """FlashAttention's `flash_attn_kvpacked_func`: `flash_attn_func` on q (B, Tq, H, d) and
    kv (B, Tk, 2, H_kv, d)."""
    _check_fa_operands(("kv", kv), dims=5, packed=2)
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)  # fmt: skip


def _check_fa_operands(*named: tuple[str, Any], dims: int = 4, packed: int = 0) -> None:
    """Each a torch tensor of `dims` dimensions ((B, T, H, d); packed: (B, T, `packed`, H, d))."""
    want = "(B, T, H, d)" if not packed else f"(B, T, {packed}, H, d)"
    for name, x in named:
        if not isinstance(x, _Tensor):
            raise ValueError(f"{name}: a {type(x).__name__}; pass a {want} torch tensor")
        if x.dim() != dims or (packed and x.shape[2] != packed):
            raise ValueError(f"{name}.shape={tuple(x.shape)}: must be {want}")


# ---- torch's own call: scaled_dot_product_attention ---------------------------------------
def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """`torch.nn.functional.scaled_dot_product_attention`'s call on `attention`: query
    (N, ..., H, L, E), key (N, ..., H_kv, S, E), value (N, ..., H_kv, S, Ev) (at least 3
    dimensions; the leading ones are folded into the batch). `enable_gqa` lets H be a
    multiple of H_kv, as torch's. Returns (N, ..., H, L, Ev) laid out as query.
    Refused, each with an error that says why: `attn_mask` (pass a mask function as
    `mask_mod` to `attention` instead), `dropout_p` other than 0.0, and `is_causal` with
    L != S (torch aligns that mask to the top-left corner, flashgen's kernels to the
    bottom-right: they agree only when L == S)."""
    if attn_mask is not None:
        raise ValueError(
            "attn_mask: a dense mask tensor is not taken; pass is_causal, or write the mask as "
            "a function and call flashgen.torch.attention(..., mask_mod=...) (docs/hooks.md)"
        )
    fa_features((-1, -1), 0.0, None, dropout_p)  # the dropout rule alone
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, _Tensor) or x.dim() < 3:
            got = tuple(x.shape) if isinstance(x, _Tensor) else type(x).__name__
            raise ValueError(f"{name}: {got}; must be a (N, ..., H, L, E) torch tensor")
    lead = tuple(query.shape[:-3])
    if tuple(key.shape[:-3]) != lead or tuple(value.shape[:-3]) != lead:
        raise ValueError(
            f"query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}, "
            f"value.shape={tuple(value.shape)}: the leading (batch) dimensions must be equal"
        )
    h, length, h_kv, keys = query.shape[-3], query.shape[-2], key.shape[-3], key.shape[-2]
    if h != h_kv and not enable_gqa:
        raise ValueError(
            f"query heads {h}, key heads {h_kv}: must be equal, or pass enable_gqa=True "
            "(grouped-query attention), as torch's call asks"
        )
    if is_causal is True and length != keys:
        raise ValueError(
            f"is_causal with L={length} queries and S={keys} keys: torch aligns that mask to the "
            "top-left corner, flashgen to the bottom-right (query i sees keys j <= i + S - L); "
            "they agree only when L == S. Call flashgen.torch.attention(causal=True) for the "
            "bottom-right mask"
        )
    q, k, v = (x.reshape(-1, *x.shape[-3:]) if x.dim() != 4 else x for x in (query, key, value))
    o = attention(q, k, v, causal=is_causal, scale=scale)
    return o.reshape(*lead, *o.shape[1:]) if query.dim() != 4 else o


def clear_cache() -> None:
    """Forget every validated signature and selection, forward and backward (the loaded
    kernels stay cached)."""
    with _entries_lock:
        _entries.clear()
        _plans.clear()
        _bwd_entries.clear()
        _bwd_plans.clear()
