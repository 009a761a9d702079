"""What flashgen's PyTorch front doors share for one call (flashgen.torch, .hooked, .varlen,
.kvcache): argument checks with one clear error each, the feature values bound for q's
device, the device's arch name, torch's dispatch probes, the current stream as a raw handle,
and the dense backward's launch with its fp32 scratch from torch's allocator."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

try:
    import torch
except ImportError as _exc:  # one line, says what is missing
    raise ImportError(
        f"flashgen's torch front doors need PyTorch, which cannot be imported ({_exc}); "
        "install torch"
    ) from None

from flashgen.generator.backward import scratch_shapes
from flashgen.generator.features import Feature, FeatureArgs
from flashgen.generator.select import backward_family
from flashgen.runtime import backward, feature_values, op_args


def fail(msg: str) -> NoReturn:
    """Raise the ValueError a bad argument gets (value, rule and fix in `msg`)."""
    raise ValueError(msg)


def check_tensor(name: str, x: Any, dims: int, device: Any = None) -> None:
    """`x` is a torch tensor with `dims` dimensions on a CUDA device (`device` when given)."""
    if not isinstance(x, torch.Tensor):
        fail(f"{name}: a {type(x).__name__}, expected a torch tensor on a CUDA device")
    if not x.is_cuda:
        fail(f"{name} on {x.device}: must be on a CUDA device; move it with .cuda()")
    if device is not None and x.device != device:
        fail(
            f"{name} on {x.device}, q on {device}: must be on one device; "
            "move it with .to(q.device)"
        )
    if x.dim() != dims:
        fail(f"{name}.shape={tuple(x.shape)}: must have {dims} dimensions")


def feature_args_key(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a remembered signature must match of a call's feature op arguments (defaults the
    dispatcher left out filled in): the scalar ones as they are, and of an array feature's
    tensor its pointer, shape, strides, dtype and device. The pointer alone let another view
    at the same address (s[::2], s[:1], a float64 tensor) skip validation: the kernel then
    read H fp32 values from memory laid out otherwise, or past the tensor's end. Built from
    the raw arguments, so a remembered call decodes and checks no feature value."""
    return tuple(
        (a.data_ptr(), tuple(a.shape), tuple(a.stride()), a.dtype, a.device)
        if isinstance(a, torch.Tensor) else a
        for a in op_args.full(args)
    )  # fmt: skip


def fa_features(
    window_size: Any, softcap: Any, alibi_slopes: Any, dropout_p: Any = 0.0
) -> dict[str, Any]:
    """FlashAttention's feature arguments as flashgen's feature keywords (`window`, `softcap`,
    `alibi_slopes`), the defaults left out, read as FlashAttention reads them: a negative
    `window_size` side is unbounded (flashgen's -1), a `softcap` <= 0 is off, `alibi_slopes`
    None is off (each value is then checked by its feature); `dropout_p` must be 0.0
    (flashgen has no attention dropout)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or dropout_p:
        fail(f"dropout_p={dropout_p!r}: flashgen has no attention dropout; pass 0.0")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        fail(f"window_size={window_size!r}: must be (left, right), -1 for unbounded")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        fail(f"softcap={softcap!r}: must be a float (0: off)")
    out: dict[str, Any] = {}
    sides = tuple(-1 if isinstance(w, int) and w < 0 else w for w in window_size)
    if sides != (-1, -1):
        out["window"] = sides
    if softcap > 0:
        out["softcap"] = float(softcap)
    if alibi_slopes is not None:
        out["alibi_slopes"] = alibi_slopes
    return out


def check_int_array(name: str, x: Any, shape: tuple[int, ...], device: Any) -> None:
    """`x` is an int32 tensor of `shape` (a negative last extent: any) on `device`, its last
    axis contiguous."""
    check_tensor(name, x, len(shape), device)
    if x.dtype != torch.int32:
        fail(f"{name}.dtype={x.dtype}: must be torch.int32; pass {name}.to(torch.int32)")
    if tuple(x.shape[: len(shape) - 1]) != shape[:-1] or (
        shape[-1] >= 0 and x.shape[-1] != shape[-1]
    ):
        want = ", ".join("n" if n < 0 else str(n) for n in shape)
        fail(f"{name}.shape={tuple(x.shape)}: must be ({want})")
    if x.stride(-1) != 1:
        fail(f"{name}: its last axis must be contiguous; pass {name}.contiguous()")


def feature_args(values: feature_values.Values, q: Any, h: int) -> FeatureArgs:
    """A call's feature values validated for q's device and its `h` query heads: scalar ones
    by their feature, array ones' shape, dtype, layout and device."""

    def pointer(feature: Feature, tensor: Any) -> int:
        feature.check_array(tuple(tensor.shape), tensor.dtype, h)
        if not tensor.is_contiguous():
            fail(f"{feature.keyword}: must be contiguous; pass {feature.keyword}.contiguous()")
        if tensor.device != q.device:
            fail(
                f"{feature.keyword} on {tensor.device}, q on {q.device}: must be on one "
                "device; move them with .to(q.device)"
            )
        ptr = int(tensor.data_ptr())
        feature.check(ptr)
        return ptr

    return feature_values.bind(values, pointer)


# torch's own probes: a call may launch directly only when no dispatch or function mode is on
dispatch_stack = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
function_modes = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: False)


def no_modes() -> bool:
    """True outside torch.compile, dispatch modes (fake tensors, ...) and function modes: where
    a registered op's dispatcher would add nothing to a direct call of its implementation."""
    return not torch.compiler.is_compiling() and not dispatch_stack() and not function_modes()


def device_arch(dev: int) -> str:
    """The compute capability of CUDA device `dev` as the arch name kernels compile for
    (`sm_90` on an H200)."""
    major, minor = torch.cuda.get_device_capability(dev)
    return f"sm_{major}{minor}"


WGMMA_BWD_ENV = "FLASHGEN_WGMMA_BWD"
"""Set to 0 to leave family wgmma's backward (its TMA descriptors) out of every choice."""


def backward_family_for(
    arch: str, problem: Any, deterministic: bool, tensors: tuple[Any, ...]
) -> str:
    """The backward's family for a call on GPU `arch` (`select.backward_family`: on sm_90
    wgmma's where the call fits its rules, else mma's); `tensors` are the call's arrays, whose
    strides say whether a TMA can step them; FLASHGEN_WGMMA_BWD=0 leaves out the TMA family."""
    strided = all(
        s != 0 or n == 1 for t in tensors for n, s in zip(t.shape, t.stride(), strict=True)
    )
    return backward_family(
        arch, problem.d, problem.value_dim, problem.dtype, deterministic=deterministic,
        strided=strided, tensor_maps=os.environ.get(WGMMA_BWD_ENV) != "0",
    )  # fmt: skip


def _raw_stream_fn() -> Callable[[int], int]:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw  # type: ignore[no-any-return]
    return lambda dev: int(torch.cuda.current_stream(dev).cuda_stream)


raw_stream: Callable[[int], int] = _raw_stream_fn()
"""The current CUDA stream of a device as a CUstream handle (torch's C entry point when it has
one: a call per launch, so the cheapest)."""


def stream_zeros(
    table: dict[tuple[int, int], Any], lock: threading.Lock, dev: int, stream: int, n: int,
    minimum: int = 1,
) -> Any:  # fmt: skip
    """At least `n` int32 zeros for a launch on (`dev`, `stream`) of a kernel that counts in
    them and leaves them zero (the varlen tile scheduler's words, the decode merge's counters).

    Eager calls share one buffer per (device, stream), kept in `table` (`minimum` words at
    least, grown when a call needs more): the stream orders its launches, each launch puts the
    words back to zero, so a call costs a dict lookup, and launches on other streams never touch
    them. Under CUDA-graph capture each call gets fresh words zeroed by a node of the graph
    instead: a replay may run on any stream, beside eager calls or other graphs, and must share
    its words with none of them -- and a buffer first made under capture would hold zeros only
    once the graph ran. (Capture is asked of the current device's stream, which is q's in any
    capture that torch.cuda.graph sets up.) Neither path reads anything back from the GPU."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(max(n, 1), dtype=torch.int32, device=f"cuda:{dev}")
    key = (dev, stream)
    buf = table.get(key)
    if buf is None or buf.numel() < n:
        with lock:
            buf = table.get(key)
            if buf is None or buf.numel() < n:  # zeroed on that stream (the current one)
                buf = torch.zeros(max(n, minimum), dtype=torch.int32, device=f"cuda:{dev}")
                table[key] = buf
    return buf


def out_strides(shape: tuple[Any, ...], stride: tuple[Any, ...]) -> tuple[Any, ...]:
    """Dense strides for O with q's axis order (axes sorted by q's strides, d innermost): the
    front doors' O (and so the dO autograd hands back) is laid out as the caller's q, so a
    (B, T, H, d) caller gets no copy on either side."""
    order = sorted(
        range(3), key=lambda a: (-int(stride[a]) if isinstance(stride[a], int) else 0, a)
    )  # fmt: skip
    out: list[Any] = [0, 0, 0, 1]
    step = shape[3]
    for axis in reversed(order):
        out[axis] = step
        step = step * shape[axis]
    return tuple(out)


def run_backward(
    prepared: backward.Prepared, tensors: tuple[Any, ...], stream: int,
    hook_ptrs: Sequence[int] | None = None,
) -> None:  # fmt: skip
    """Launch a dense backward's kernels on (q, k, v, o, lse, do, dq, dk, dv) on `stream` (a
    CUstream handle: `raw_stream(device)`), its fp32 scratch (D and LSE; the fast mode's dQ
    accumulator) allocated through torch's caching allocator (CUDA-graph safe, nothing
    synchronized); a hooked variant with this call's aux pointers (`hook_ptrs`)."""
    q, k, v, o, lse, do, dq, dk, dv = tensors
    b, h, tq, d = (int(n) for n in q.shape)
    d_shape, dq_shape = scratch_shapes(prepared.spec, b, h, tq, d)
    d_buf = torch.empty(d_shape, dtype=torch.float32, device=q.device)
    accum = 0
    if dq_shape is not None:  # the fast mode's fp32 dQ accumulator (what blocks add into)
        dq_accum = torch.empty(dq_shape, dtype=torch.float32, device=q.device)
        accum = dq_accum.data_ptr()
    pointers = (
        q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), do.data_ptr(), lse.data_ptr(),
        d_buf.data_ptr(), accum, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
    )  # fmt: skip
    prepared(pointers, stream, hook_ptrs=hook_ptrs)


def eager_autograd(q: Any, k: Any, v: Any, tensors: Sequence[Any] = ()) -> bool:
    """True when autograd is all the dispatcher would add to an attention op's call: eager,
    plain CUDA tensors (and plain `tensors`: the features' or aux values), no modes. Such a
    call runs the op's own autograd formula as a `torch.autograd.Function`
    (`flashgen.torch._EagerAttention`, `flashgen.hooked._EagerHookedAttention`), skipping the
    custom op's autograd wrapper, whose argument flattening and default filling cost ~250 us
    of host time per forward + backward (bench/NOTES.md, twentieth session). torch.compile,
    tensor subclasses, dispatch modes and torch.func transforms take the registered op, as
    before."""
    return (
        not torch.compiler.is_compiling()
        and type(q) is torch.Tensor and q.is_cuda
        and type(k) is torch.Tensor and type(v) is torch.Tensor
        and all(type(t) is torch.Tensor for t in tensors)
        and not dispatch_stack()
        and not function_modes()
        and _functorch_level() is None
    )  # fmt: skip


# the innermost torch.func transform (grad, vmap, ...) around the call, or None: an
# autograd.Function without functorch staticmethods is refused inside one, the op is not
_functorch_level: Callable[[], Any] = getattr(
    getattr(torch._C, "_functorch", None), "peek_interpreter_stack", lambda: None
)
