"""`flashgen.attention`: run a generated FlashAttention kernel on NumPy arrays or GPUArrays."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flashgen.generator.dtypes import DTYPES
from flashgen.generator.features import RUNTIME_FEATURES, Feature, FeatureKeywords, check_fits
from flashgen.generator.numerics import LOG2E
from flashgen.generator.select import select
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import feature_values, hook_arrays, hook_spec, launch
from flashgen.runtime import gpu as runtime
from flashgen.runtime.dense_decode import DenseDecodeLaunch, dense_decode
from flashgen.runtime.gpu import GpuUnavailable
from flashgen.runtime.hook_calls import check_indices, resolve_hooks
from flashgen.runtime.validate import (
    cai_stream,
    check_head_dims,
    check_layout,
    check_scale,
    check_spec,
    check_spec_fits_call,
    check_spec_type,
    describe,
)

if TYPE_CHECKING:  # Python 3.10 has no typing.Unpack; annotations are not evaluated
    from typing_extensions import Unpack

__all__ = ["GpuUnavailable", "attention"]


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    spec: KernelSpec | None = None,
    return_lse: bool = False,
    score_mod: Any = None,
    mask_mod: Any = None,
    aux: Mapping[str, Any] | None = None,
    **features: Unpack[FeatureKeywords],
) -> Any:
    """softmax(Q·Kᵀ·scale + mask)·V with a generated kernel; O (and LSE) like the inputs.

    q is (B, H, Tq, d), k and v are (B, H_kv, Tk, d) with H a multiple of H_kv (grouped-query
    attention; H_kv = 1 is multi-query), all of one dtype (float32, float16 or
    ml_dtypes.bfloat16), d any multiple of 8 up to 256. Any strided device view works as
    long as the last (d) axis is contiguous (NumPy inputs are copied, so any view of them).
    NumPy inputs are copied to the GPU and the output comes back as a NumPy array; PyCUDA
    GPUArrays are used in place and the output is a new GPUArray, computed on the legacy
    default stream (in order with PyCUDA's own operations; the call does not wait for it);
    objects with a CUDA array interface (CuPy, Numba) are used in place too, the launch
    waiting (on the GPU) for the stream their interface names (v3 `stream`);
    torch tensors are passed to `flashgen.torch.attention` (torch tensors out, torch's current
    stream). A GPUArray call whose shapes, strides, dtypes and arguments were seen before
    skips validation and selection. `causal` masks key j for
    query i when j > i + Tk - Tq (bottom-right aligned); a row that sees no key outputs zeros
    and LSE -inf. `scale` defaults to 1/sqrt(d). `spec=None` picks a shipped variant for
    (d, dtype, causal, this GPU); a given spec must match the call's d, dtype and causal.
    With `return_lse`, returns (O, LSE) where LSE is float32 (B, H, Tq), natural log.

    Features, by keyword (each runs a variant compiled with it; one variant serves every
    value; `flashgen.generator.features` lists them):
    `window=(left, right)` lets query i see keys p - left .. p + right around its position
    p = i + Tk - Tq (-1: unbounded on that side; with causal, right is 0 in effect), tiles
    outside the window are skipped; `softcap=c` turns the logits s into c * tanh(s / c);
    `alibi_slopes` (float32 (H,), host array or GPUArray like q) adds -slope[h] * |p - j|.

    `score_mod` / `mask_mod`: your own score and mask functions (docs/hooks.md), each a traced
    hook (`flashgen.generator.hooks`) or a function without aux values, their aux values in
    `aux` by name: NumPy arrays with NumPy q, k, v (copied, with the range summaries that let
    a document mask skip tiles), GPUArrays with GPUArrays (used in place; no summaries: every
    tile a table-reading mask keeps any key of is computed), numbers for scalars. The call runs
    the variant an unhooked call would, compiled with the hooks; not together with `spec`.

    A call with few query rows against many keys (Tq <= 16, Tk >= 256 and 4 Tq) and no
    `spec` or hooks runs family mma's decode kernel (GQA heads packed, keys split over the
    GPU), as `flashgen.torch.attention` does: the same O and LSE, faster on such shapes
    (`flashgen.attention_with_kvcache` takes a K/V cache's own layouts and lengths).

    Inputs are validated before the GPU is touched (ValueError naming value, rule and fix;
    head dims too, which variant selection would otherwise judge after finding the GPU);
    without PyCUDA, a driver or a GPU the call raises GpuUnavailable. ALiBi slopes are
    checked on every call that changes their pointer, shape, strides or dtype.

    Example (needs an NVIDIA GPU and PyCUDA)::

        import numpy as np
        import flashgen

        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((2, 8, 300, 64)).astype(np.float16) for _ in range(3))
        o, lse = flashgen.attention(q, k, v, causal=True, return_lse=True)
        print(o.shape, o.dtype, lse.shape)  # (2, 8, 300, 64) float16 (2, 8, 300)
    """
    if _is_torch(q, k, v):
        from flashgen import torch as fg_torch

        return fg_torch.attention(
            q, k, v, causal=causal, scale=scale, return_lse=return_lse, spec=spec,
            score_mod=score_mod, mask_mod=mask_mod, aux=aux, **features,
        )  # fmt: skip
    values = feature_values.from_keywords(features, "flashgen.attention")
    if scale is not None:
        check_scale(scale, 1)  # every call: a remembered signature's key takes True for 1.0
    hooks = resolve_hooks(score_mod, mask_mod)
    if hooks and spec is not None:
        raise ValueError(
            "spec and score_mod/mask_mod: a hooked call picks its own variant (the one an "
            "unhooked call would run, compiled with the hooks); drop spec"
        )
    host = _is_host(q, k, v)
    if not host:
        hooked = hook_arrays.device_call(hooks, aux) if hooks or aux else None
        o, lse = _on_device(q, k, v, causal, scale, spec, values, hooked=hooked)
        return (o, lse) if return_lse else o
    upload = hook_arrays.host_call(hooks, aux, runtime.to_device) if hooks or aux else None
    # copied anyway: make the copies contiguous so any NumPy view is accepted
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    problem = check_layout(q, k, v)
    check_head_dims(problem)  # selection (after the GPU is found) would say it too late
    if hooks:
        check_indices(hooks, dict(aux or {}), batch=problem.b, heads=problem.h,
                      q_len=problem.tq, kv_len=problem.tk)  # fmt: skip
    check_scale(scale, problem.d)
    _check_causal(causal)
    # array features (ALiBi's slopes) from the host: checked, contiguous float32, then copied
    hosted = tuple(
        f.host_array(v, problem.h) if f.array and v is not None else None
        for f, v in zip(RUNTIME_FEATURES, values, strict=True)
    )
    if spec is not None:
        check_spec_type(spec)
        check_spec_fits_call(spec, problem, causal)
        check_spec(spec, problem, check_pointers=False)
        check_fits(spec, feature_values.uses(values))

    # Validation is done; from here on the GPU is needed.
    dq, dk, dv = (runtime.to_device(x) for x in (q, k, v))
    pairs = zip(values, hosted, strict=True)
    on_gpu = tuple(v if a is None else runtime.to_device(a) for v, a in pairs)
    # an array's copy is new each call: its signature is not worth remembering
    remember = all(a is None for a in hosted)
    hooked = upload() if upload is not None else None  # aux arrays: per call, as pointers
    o, lse = _on_device(dq, dk, dv, causal, scale, spec, on_gpu, remember, hooked)
    runtime.gpu().drv.Context.synchronize()  # to_host would wait anyway; this names a failure
    o, lse = runtime.to_host(o), runtime.to_host(lse)
    return (o, lse) if return_lse else o


@dataclass(frozen=True)
class _Entry:
    """A validated device-array signature: the variant, its bound launch, the output shapes."""

    spec: KernelSpec
    bound: launch.Bound | DenseDecodeLaunch
    o_shape: tuple[int, int, int, int]
    dtype: np.dtype[Any]


# (shapes, strides, dtypes, pointer alignment, causal, scale, spec, feature values, each array
# feature's pointer, shape, strides and dtype) -> entry, for GPUArrays; at most
# launch.MAX_SIGNATURES entries (then it starts over), like flashgen.torch's
_entries: dict[tuple[Any, ...], _Entry] = {}


def _on_device(
    q: Any,
    k: Any,
    v: Any,
    causal: Any,
    scale: Any,
    spec: Any,
    feats: feature_values.Values,
    remember: bool = True,
    hooked: hook_arrays.HookedCall | None = None,
) -> tuple[Any, Any]:
    """Launch on device arrays (GPUArrays or CUDA-array-interface objects); new GPUArrays out.

    A GPUArray signature seen before skips validation and selection: its pointers are read,
    O and LSE allocated (from a memory pool) and the kernel launched on the legacy default
    stream, in order with PyCUDA's own operations; nothing waits for it. CUDA-array-interface
    objects (CuPy, Numba) are validated every call, and the launch waits (on the GPU) for the
    stream their interface names (v3 `stream`), as the interface asks of a consumer.
    """
    key = None
    if all(hasattr(x, "gpudata") for x in (q, k, v)):
        ptrs = (int(q.gpudata), int(k.gpudata), int(v.gpudata))
        key = (
            q.shape, q.strides, q.dtype, k.shape, k.strides, k.dtype, v.shape, v.strides,
            v.dtype, (ptrs[0] | ptrs[1] | ptrs[2]) & 15, causal, scale, spec,
            feature_values.signature(feats, _array_key),
            hooked.key() if hooked is not None else None,
        )  # fmt: skip
        try:
            e = _entries.get(key) if causal is True or causal is False else None
        except TypeError:  # unhashable scale or spec: validation below names it
            e, key = None, None
    else:
        e = None
    if e is None:
        e, ptrs = _prepare(q, k, v, causal, scale, spec, feats, hooked)
        if key is not None and remember:
            _remember(key, e)
    b, h, tq, _ = e.o_shape
    o = runtime.empty(e.o_shape, e.dtype, pooled=True)
    lse = runtime.empty((b, h, tq), np.float32, pooled=True)
    if key is None:  # CUDA-array-interface inputs: after the work of the stream they name
        streams = [cai_stream(n, x) for n, x in zip("qkv", (q, k, v), strict=True)]
        launch.wait_for_streams(streams, 0)
    hook_ptrs = hooked.args().pointers() if hooked is not None else None  # this call's
    e.bound(ptrs[0], ptrs[1], ptrs[2], int(o.gpudata), int(lse.gpudata), 0, hook_ptrs=hook_ptrs)
    return o, lse


def _remember(key: tuple[Any, ...], entry: _Entry) -> None:
    """Keep a validated signature (`launch.remember`: bounded, as a decode loop whose Tk grows
    every step makes a new signature per step: 20,001 steps kept 20,001 entries)."""
    launch.remember(_entries, key, entry)


def _pointer(feature: Feature, array: Any) -> int:
    """The device pointer of an array feature's value given as a GPUArray; ValueError
    otherwise."""
    if not hasattr(array, "gpudata"):
        raise ValueError(
            f"{feature.keyword}={type(array).__name__}: with device inputs pass it as a "
            "GPUArray too (or all of q, k, v and it as NumPy arrays)"
        )
    return int(array.gpudata)


def _array_key(array: Any) -> tuple[Any, ...]:
    """What a remembered signature must match of an array feature's value: pointer, shape,
    strides and dtype (`feature_values.signature`)."""
    ptr = int(array.gpudata) if hasattr(array, "gpudata") else None  # else refused on binding
    return (ptr, tuple(array.shape), tuple(array.strides), np.dtype(array.dtype))


def _prepare(
    q: Any, k: Any, v: Any, causal: Any, scale: Any, spec: Any, feats: feature_values.Values,
    hooked: hook_arrays.HookedCall | None = None,
) -> tuple[_Entry, tuple[int, int, int]]:  # fmt: skip
    """Validate device arrays, select the variant, load its plan, bind the signature (a hooked
    call: `hook_spec.forward_spec`'s variant, bound to the call's aux values)."""
    problem = check_layout(q, k, v)
    check_head_dims(problem)
    value = check_scale(scale, problem.d)
    _check_causal(causal)

    def pointer(feature: Feature, array: Any) -> int:
        ptr = _pointer(feature, array)
        feature.check_array(tuple(array.shape), array.dtype, problem.h)
        if not array.flags.c_contiguous:
            raise ValueError(f"{feature.keyword}: must be contiguous; copy it first")
        feature.check(ptr)  # aligned as the kernels load it
        return ptr

    features = feature_values.bind(feats, pointer)
    if spec is not None:
        check_spec_type(spec)
        check_spec_fits_call(spec, problem, causal)
        check_spec(spec, problem, check_pointers=True)
        check_fits(spec, features)
    elif hooked is not None and hooked.hooks:
        check_indices(hooked.hooks, hooked.values, batch=problem.b, heads=problem.h,
                      q_len=problem.tq, kv_len=problem.tk)  # fmt: skip
        spec = hook_spec.forward_spec(
            problem, causal, runtime.device_arch(), runtime.device_name(),
            (*features.tokens, *hooked.tokens),
        )  # fmt: skip
    else:
        routed = dense_decode(q, k, v, causal, value * LOG2E, features)
        if routed is not None:  # few query rows against many keys: the decode kernel
            dense, o_shape = routed
            dtype = np.dtype(DTYPES[problem.dtype].numpy)
            return _Entry(dense.spec, dense, o_shape, dtype), _device_ptrs(q, k, v)
        spec = select(
            problem.d, problem.dtype, causal, runtime.device_arch(),
            alignment=problem.alignment(pointers=True), gpu_name=runtime.device_name(),
            features=features.tokens, dv=problem.value_dim, kv_group=problem.kv_group,
            tq=problem.tq, kv_heads=problem.b * problem.kv_heads,
        )  # fmt: skip
    plan = runtime.get_function(spec)
    b, h, tq, d = problem.b, problem.h, problem.tq, problem.value_dim  # O has v's head dim
    dtype = np.dtype(DTYPES[problem.dtype].numpy)
    size = dtype.itemsize
    o_like = _Layout((b, h, tq, d), (h * tq * d * size, tq * d * size, d * size, size), dtype)
    full = check_layout(q, k, v, o=o_like)  # a fresh contiguous O, as allocated per call
    check_spec(spec, full, check_pointers=True)
    q_ptr, k_ptr, v_ptr = full.q_ptr, full.k_ptr, full.v_ptr
    if q_ptr is None or k_ptr is None or v_ptr is None:
        raise ValueError("q, k, v: no device pointer; pass GPUArrays or CUDA arrays")
    args = hooked.args() if hooked is not None and hooked.hooks else None
    entry = _Entry(spec, plan.bind(full, value * LOG2E, features, hooks=args), (b, h, tq, d), dtype)
    return entry, (q_ptr, k_ptr, v_ptr)


def _device_ptrs(q: Any, k: Any, v: Any) -> tuple[int, int, int]:
    ptrs = tuple(describe(n, x).ptr for n, x in zip("qkv", (q, k, v), strict=True))
    if any(p is None for p in ptrs):
        raise ValueError("q, k, v: no device pointer; pass GPUArrays or CUDA arrays")
    return ptrs  # type: ignore[return-value]


@dataclass(frozen=True)
class _Layout:
    """A pointer-free array description (shape, byte strides, dtype) for validation."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype[Any]


def _check_causal(causal: Any) -> None:
    if causal is not True and causal is not False:
        raise ValueError(f"causal={causal!r}: must be True or False")


def _all_or_none(q: Any, k: Any, v: Any, kind: Callable[[Any], bool], mixed: str) -> bool:
    """Whether q, k and v are all of one kind; ValueError (`mixed` as the fix) when some are."""
    kinds = [kind(x) for x in (q, k, v)]
    if all(kinds):
        return True
    if any(kinds):
        names = ", ".join(f"{n}={type(x).__name__}" for n, x in zip("qkv", (q, k, v), strict=True))
        raise ValueError(f"{names}: {mixed}")
    return False


def _is_torch(q: Any, k: Any, v: Any) -> bool:
    return _all_or_none(
        q, k, v, lambda x: type(x).__module__.split(".")[0] == "torch",
        "mixed torch tensors and other arrays; pass all three as torch tensors "
        "(flashgen.torch.attention) or none",
    )  # fmt: skip


def _is_host(q: Any, k: Any, v: Any) -> bool:
    return _all_or_none(
        q, k, v, lambda x: isinstance(x, np.ndarray),
        "mixed host and device arrays; pass all three as NumPy arrays or all three as GPUArrays",
    )  # fmt: skip
