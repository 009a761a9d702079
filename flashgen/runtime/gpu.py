"""Launch generated kernels on PyCUDA arrays (PyCUDA imported lazily: flashgen works without it).

One CUDA context per process: the primary context of device 0, retained and pushed once per
thread (and popped again when that thread ends, or at exit for the main thread). PyTorch uses
the same primary context, so flashgen and torch can share one process (the benchmark does).
Each variant is compiled for the GPU it runs on (a cubin only runs on its own major arch),
loaded once into a launch plan (`launch.plan`, shared with `flashgen.torch`) and launched with
`cuLaunchKernel` through ctypes.

Everything a launch depends on is checked (`validate.validate_inputs`) before it is issued.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from flashgen.generator import abi
from flashgen.generator.arch import ARCHS
from flashgen.generator.compile import CompiledKernel, compile_kernel
from flashgen.generator.dtypes import DTYPES
from flashgen.generator.features import NO_FEATURES, FeatureArgs
from flashgen.generator.features.hook import HookArgs
from flashgen.generator.numerics import LOG2E
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import launch as _launch
from flashgen.runtime.launch import INSTALL_HINT, GpuUnavailable, LaunchPlan
from flashgen.runtime.validate import (
    Problem,
    cai_stream,
    check_scale,
    check_slopes_apart,
    validate_inputs,
)

# The kernel C ABI (templates/_common.cuh.j2) as struct codes: q, k, v, o, lse pointers; tq, tk
# as int; twelve long long strides (q, k, v, o x batch, head, token); scale_log2 as float;
# kv_group (query heads per K/V head) as int; the features' window_left, window_right (int),
# softcap (float) and ALiBi slopes pointer.
# (launch.Bound passes each as its own kernelParams entry.)
ABI_FORMAT = abi.struct_format(abi.FWD)

# Quiet-NaN bit patterns, written with cuMemsetD16/D32 (works for bf16, which PyCUDA's
# elementwise fill does not know).
NAN_BITS: dict[str, tuple[int, int]] = {  # dtype -> (bits, width in bytes)
    "fp32": (0x7FC00000, 4),
    "fp16": (0x7E00, 2),
    "bf16": (0x7FC0, 2),
}

__all__ = ["INSTALL_HINT", "GpuUnavailable", "LaunchPlan"]  # re-exported from launch


@dataclass
class _Gpu:
    drv: Any  # the pycuda.driver module
    device: Any
    context: Any
    arch: str  # sm_XY of the device
    main_thread: int  # threading.main_thread()'s ident: its push is popped at exit


_lock = threading.RLock()
_gpu: _Gpu | None = None
# (spec, arch) -> launch plan on device 0 (launch.plan caches too; this skips its key)
_functions: dict[tuple[KernelSpec, str], LaunchPlan] = {}
_pushed = threading.local()
_pool: Any = None  # pycuda.tools.DeviceMemoryPool for pooled outputs, made on first use
_counters: list[Any] = []  # the decode kernel's int32 zeros (`decode_counters`)
# The arch `device_arch()` reports instead of device 0's while set: flashgen.torch sets it to
# the arch of the tensor's device, so `kernel_arch` compiles for that GPU.
_arch_override: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "flashgen_device_arch", default=None
)


class _PopAtThreadExit:
    """Lives in a thread-local: CPython drops it in the exiting thread, which pops our context."""

    def __init__(self, drv: Any) -> None:
        self.drv = drv

    def __del__(self) -> None:
        # the context may already be gone (process exit): then there is nothing to undo
        with contextlib.suppress(Exception):
            self.drv.Context.pop()


def _import_driver() -> Any:
    try:
        import pycuda.driver as drv
    except ImportError as exc:
        raise GpuUnavailable(f"PyCUDA cannot be imported ({exc}); {INSTALL_HINT}") from exc
    except OSError as exc:  # the extension loads libcuda.so: no driver installed
        raise GpuUnavailable(f"the CUDA driver library is missing ({exc}); {INSTALL_HINT}") from exc
    return drv


def gpu() -> _Gpu:
    """The process's GPU state, created on first use; raise GpuUnavailable when there is none."""
    global _gpu
    state = _gpu
    if state is not None and getattr(_pushed, "done", False):
        return state  # the common case: no lock
    with _lock:
        if _gpu is None:
            drv = _import_driver()
            try:
                drv.init()
                count = drv.Device.count()
            except drv.Error as exc:
                raise GpuUnavailable(
                    f"the CUDA driver failed to start ({exc}); {INSTALL_HINT}"
                ) from exc
            if count == 0:
                raise GpuUnavailable(f"no CUDA device found; {INSTALL_HINT}")
            device = drv.Device(0)
            context = device.retain_primary_context()
            major, minor = device.compute_capability()
            main = threading.main_thread().ident or 0
            _gpu = _Gpu(drv, device, context, f"sm_{major}{minor}", main)
            atexit.register(_release)
        if not getattr(_pushed, "done", False):
            # PyCUDA keeps one context stack per thread: make ours current in this thread, and
            # pop it when the thread ends (PyCUDA aborts the process if a thread exits with a
            # context still on its stack) -- the first use included, whichever thread it is
            # on. The main thread's push is popped by _release at exit.
            _gpu.context.push()
            _pushed.done = True
            if threading.get_ident() != _gpu.main_thread:
                _pushed.guard = _PopAtThreadExit(_gpu.drv)
        return _gpu


def _release() -> None:
    """At exit: drop loaded modules, pop the context we pushed (as pycuda.autoprimaryctx does)."""
    global _gpu
    state = _gpu
    if state is None:
        return
    _functions.clear()
    _launch.clear()
    _counters.clear()
    global _pool
    if _pool is not None:
        with contextlib.suppress(Exception):
            _pool.stop_holding()
        _pool = None
    try:
        if threading.get_ident() == state.main_thread and getattr(_pushed, "done", False):
            state.context.pop()
        from pycuda.tools import clear_context_caches

        clear_context_caches()
    except Exception:  # a dead context at exit is nothing to report
        pass
    _gpu = None


def gpu_status() -> str | None:
    """None when a GPU is usable, else the reason it is not (for skipping GPU tests)."""
    try:
        gpu()
    except GpuUnavailable as exc:
        return str(exc)
    return None


def device_arch() -> str:
    """`sm_XY` of the GPU flashgen runs on (device 0, or the device `for_device_arch` names)."""
    override = _arch_override.get()
    return override if override is not None else gpu().arch


@contextlib.contextmanager
def for_device_arch(arch: str) -> Iterator[None]:
    """Within the block, `device_arch()` (and so `kernel_arch`) answers for a GPU of `arch`.

    For hosts that run on a device other than PyCUDA's device 0 (flashgen.torch on cuda:1):
    the kernel is then compiled for the GPU that will run it.
    """
    token = _arch_override.set(arch)
    try:
        yield
    finally:
        _arch_override.reset(token)


def device_plan(spec: KernelSpec, device_arch: str, device: int) -> _launch.LaunchPlan:
    """The launch plan of `spec` on torch's CUDA `device` of arch `device_arch` (`sm_90`):
    compiled for that GPU (`kernel_arch` under `for_device_arch`; cached on disk) and loaded
    once per (spec, arch, device). The torch front doors' one way to a plan."""
    with for_device_arch(device_arch):
        karch = kernel_arch(spec)
    return _launch.plan(spec, lambda: compile_kernel(spec, karch).cubin, karch, device)


def spill_bytes(spec: KernelSpec, device_arch: str) -> int:
    """ptxas' spill stores plus loads of `spec` compiled for a GPU of arch `device_arch` (the
    compile `device_plan` would load; cached on disk, so asking first costs it nothing)."""
    with for_device_arch(device_arch):
        karch = kernel_arch(spec)
    return compile_kernel(spec, karch).report.spill_bytes


def device_name() -> str:
    """The GPU's marketing name, e.g. 'NVIDIA H200' (tuning tables are keyed by it)."""
    return str(gpu().device.name())


def kernel_arch(spec: KernelSpec) -> str:
    """The arch to compile `spec` for so that the cubin loads on this GPU.

    FLASHGEN_ARCH wins when set. Otherwise the GPU's own arch: its `a` arch when the family
    ships one (wgmma: sm_90a on an H100), else its plain arch when flashgen knows it and the
    family runs there (sm_86, sm_89, sm_100, sm_120 ...). A GPU flashgen has no table entry for
    gets the newest family arch of its major that is not newer than it. A family that cannot
    run on this GPU raises GpuUnavailable in one line.
    """
    from flashgen.generator.arch import arch_number, runs_on

    env = os.environ.get("FLASHGEN_ARCH")
    if env:
        return env
    dev = device_arch()
    if f"{dev}a" in spec.archs:
        return f"{dev}a"
    if dev in ARCHS:
        if runs_on(spec.archs, dev):
            return dev
    else:
        dev_num = arch_number(dev)
        same_major = [
            a
            for a in spec.archs
            if not a.endswith("a") and arch_number(a) // 10 == dev_num // 10
            and arch_number(a) <= dev_num
        ]  # fmt: skip
        if same_major:
            return max(same_major, key=arch_number)
    plain = [a for a in spec.archs if not a.endswith("a")]
    where = f"{min(plain, key=arch_number)} or newer" if plain else " or ".join(spec.archs)
    raise GpuUnavailable(
        f"arch={dev}: family {spec.family} runs on {where} only, not on this GPU; choose "
        "another family, or set FLASHGEN_ARCH to an arch this GPU runs"
    )


def get_function(spec: KernelSpec, compiled: CompiledKernel | None = None) -> LaunchPlan:
    """The launch plan of `spec` on device 0 (compiled for this GPU on first use, then cached).

    `compiled` supplies the cubin (its arch wins); otherwise the variant is compiled for
    `kernel_arch(spec)`. Loading failures raise RuntimeError naming the kernel.
    """
    gpu()
    arch = compiled.arch if compiled is not None else kernel_arch(spec)
    key = (spec, arch)
    hit = _functions.get(key)
    if hit is not None:
        return hit
    with _lock:
        hit = _functions.get(key)
        if hit is None:

            def cubin() -> bytes:
                kernel = compiled if compiled is not None else compile_kernel(spec, arch)
                return kernel.cubin

            hit = _functions[key] = _launch.plan(spec, cubin, arch, 0)
        return hit


def poison(ptr: int, count: int, dtype: str, stream: Any = None) -> None:
    """Fill `count` contiguous elements of `dtype` at device address `ptr` with NaN."""
    drv = gpu().drv
    bits, width = NAN_BITS[dtype]
    if width == 4:
        fill = drv.memset_d32 if stream is None else drv.memset_d32_async
    else:
        fill = drv.memset_d16 if stream is None else drv.memset_d16_async
    args = (ptr, bits, count) if stream is None else (ptr, bits, count, stream)
    fill(*args)


def _contiguous(problem: Problem) -> bool:
    b, h, tq, d = problem.b, problem.h, problem.tq, problem.value_dim  # o's head dim
    want = (h * tq * d if b > 1 else 0, tq * d if h > 1 else 0, d if tq > 1 else 0)
    return problem.o_strides == want


def launch(
    spec: KernelSpec,
    q: Any,
    k: Any,
    v: Any,
    o: Any,
    lse: Any,
    scale: float | None = None,
    stream: Any = None,
    *,
    poison_outputs: bool = False,
    sync: bool = True,
    features: FeatureArgs = NO_FEATURES,
    hooks: HookArgs | None = None,
) -> Problem:
    """Run `spec` on device arrays (GPUArrays or CUDA-array-interface objects); return the Problem.

    q, k, v, o are (B, H, T, d) with the d axis contiguous; lse is a contiguous float32
    (B, H, Tq) array. Everything is validated before anything is issued. `poison_outputs`
    fills o and lse with NaN first (o must then be contiguous), so an unwritten element shows.
    With `sync` (default) the call waits for the kernel and raises RuntimeError naming it when
    the launch or the kernel fails. `features` carries the call's window, softcap and ALiBi
    slopes (device pointer); the variant must be compiled with each one used; `hooks` the
    aux values of a hooked variant's hooks (`features.hook.HookArgs`). Arrays whose
    CUDA array interface names a stream (v3: CuPy, Numba) are waited for: `stream` waits on
    an event recorded there before the launch.
    """
    problem = validate_inputs(spec, q, k, v, o=o, lse=lse)
    if problem.lse_ptr is None or problem.o_ptr is None:
        raise ValueError("o, lse: device arrays with a pointer are required; allocate GPUArrays")
    value = check_scale(scale, spec.d)
    if features.alibi:
        check_slopes_apart(o, lse, features.alibi, problem.h)
    arrays = {"q": q, "k": k, "v": v, "o": o, "lse": lse}
    producers = [cai_stream(name, x) for name, x in arrays.items()]
    plan = get_function(spec)
    # CUDA-array-interface arrays: the launch follows the work queued on the stream they name
    _launch.wait_for_streams(producers, stream_handle(stream))
    if poison_outputs:
        if not _contiguous(problem):
            raise ValueError(
                f"o.strides={problem.o_strides} elements: poisoning needs a contiguous o; "
                "allocate o as a fresh GPUArray"
            )
        count = problem.b * problem.h * problem.tq
        poison(problem.o_ptr, count * problem.value_dim, spec.dtype, stream)
        poison(problem.lse_ptr, count, "fp32", stream)
    launch_problem(spec, plan, problem, value, stream, sync=sync, features=features, hooks=hooks)
    return problem


def stream_handle(stream: Any) -> int:
    """The CUstream handle of a PyCUDA Stream, torch stream, int, or None (0: legacy default)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "handle", None)  # PyCUDA
    if handle is None:
        handle = getattr(stream, "cuda_stream", None)  # torch
    if handle is None:
        raise ValueError(
            f"stream={stream!r}: not a CUDA stream; pass a pycuda.driver.Stream, a "
            "torch.cuda.Stream, a CUstream handle (int) or None"
        )
    return int(handle)


def launch_problem(
    spec: KernelSpec,
    plan: LaunchPlan,
    problem: Problem,
    scale: float,
    stream: Any,
    *,
    sync: bool,
    features: FeatureArgs = NO_FEATURES,
    hooks: HookArgs | None = None,
) -> None:
    """Issue one validated launch (grid from the spec and the problem); optionally wait for it."""
    bound = plan.bind(problem, scale * LOG2E, features, hooks)
    q, k, v, o, lse = problem.q_ptr, problem.k_ptr, problem.v_ptr, problem.o_ptr, problem.lse_ptr
    if q is None or k is None or v is None or o is None or lse is None:
        raise ValueError("q, k, v, o, lse: device pointers are required; pass device arrays")
    bound(q, k, v, o, lse, stream_handle(stream))
    if sync:
        wait(
            stream,
            f"kernel {spec.name} failed (grid {bound.grid}, block {spec.threads}, "
            f"{spec.smem_bytes} B shared memory)",
        )


def wait(stream: Any, failed: str) -> None:
    """Wait for `stream` (None: the whole context); a CUDA error raises RuntimeError
    "`failed`: <the driver's message>"."""
    drv = gpu().drv
    try:
        if stream is None:
            drv.Context.synchronize()
        else:
            stream.synchronize()
    except drv.Error as exc:
        raise RuntimeError(f"{failed}: {exc}") from exc


def to_device(a: np.ndarray) -> Any:
    """Copy a host array to a new contiguous GPUArray (any flashgen dtype, bf16 included)."""
    gpu()
    from pycuda import gpuarray

    host = np.ascontiguousarray(a)
    out = gpuarray.GPUArray(host.shape, host.dtype)
    if host.size:
        # through bytes: ml_dtypes' bfloat16 has no buffer-protocol format PyCUDA could read
        gpu().drv.memcpy_htod(out.gpudata, host.reshape(-1).view(np.uint8))
    return out


def to_host(a: Any) -> np.ndarray:
    """Copy a contiguous GPUArray back into a new NumPy array of the same shape and dtype."""
    drv = gpu().drv
    if not a.flags.c_contiguous:
        raise ValueError(
            f"strides={a.strides}: to_host copies contiguous GPUArrays only; copy it first"
        )
    out = np.empty(tuple(a.shape), dtype=a.dtype)
    if out.size:
        drv.memcpy_dtoh(out.reshape(-1).view(np.uint8), a.gpudata)
    return out


def empty(shape: tuple[int, ...], dtype: str | npt.DTypeLike, *, pooled: bool = False) -> Any:
    """A new contiguous GPUArray (dtype: a flashgen dtype name or a NumPy dtype).

    `pooled` takes its memory from the process's device memory pool (freed memory is kept for
    reuse instead of going back to the driver: no cuMemAlloc per call).
    """
    state = gpu()
    from pycuda import gpuarray

    dt = np.dtype(DTYPES[dtype].numpy) if isinstance(dtype, str) else np.dtype(dtype)
    if not pooled:
        return gpuarray.GPUArray(shape, dt)
    global _pool
    if _pool is None:
        with _lock:
            if _pool is None:
                from pycuda.tools import DeviceMemoryPool

                _pool = DeviceMemoryPool()
    del state
    return gpuarray.GPUArray(shape, dt, allocator=_pool.allocate)


def decode_counters(n: int) -> Any:
    """A GPUArray of at least n int32 zeros for the decode kernel's split merge and the varlen
    forward's tile scheduler (each kernel leaves the words it uses zeroed; the legacy default
    stream, on which every call of this runtime that uses them launches, orders those calls).
    The caller holds it through its launch: a bigger one may replace it here meanwhile, and the
    old one is freed when its last holder lets go."""
    with _lock:
        if not _counters or _counters[0].shape[0] < n:
            buf = empty((max(n, 1024),), np.int32)
            gpu().drv.memset_d32(buf.gpudata, 0, buf.shape[0])
            _counters[:] = [buf]
        return _counters[0]
