"""Launch generated kernels through PyCUDA (imported lazily: flashgen works without it).

One CUDA context per process: the primary context of device 0, retained and pushed once per
thread. PyTorch uses the same primary context, so flashgen and torch can share one process
(the benchmark does). Each variant is compiled for the GPU it runs on (a cubin only runs on
its own major arch), loaded once, and cached for the life of the process.

Everything a launch depends on is checked (`validate.validate_inputs`) before it is issued.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .arch import ARCHS, STATIC_SMEM_LIMIT
from .compile import CompiledKernel, compile_kernel
from .dtypes import DTYPES
from .spec import KernelSpec
from .validate import Problem, check_scale, validate_inputs

LOG2E = 1.4426950408889634

# The kernel C ABI (templates/_common.cuh.j2) as PyCUDA struct codes: q, k, v, o, lse
# pointers; tq, tk as int; twelve long long strides (q, k, v, o x batch, head, token);
# scale_log2 as float.
ABI_FORMAT = "PPPPP" + "ii" + "q" * 12 + "f"

# Quiet-NaN bit patterns, written with cuMemsetD16/D32 (works for bf16, which PyCUDA's
# elementwise fill does not know).
NAN_BITS: dict[str, tuple[int, int]] = {  # dtype -> (bits, width in bytes)
    "fp32": (0x7FC00000, 4),
    "fp16": (0x7E00, 2),
    "bf16": (0x7FC0, 2),
}

INSTALL_HINT = (
    "install PyCUDA (pip install 'flashgen[gpu]') on a machine with an NVIDIA driver and GPU"
)


class GpuUnavailable(RuntimeError):
    """PyCUDA, the CUDA driver or a GPU is missing; the message says which and what to do."""


@dataclass
class _Gpu:
    drv: Any  # the pycuda.driver module
    device: Any
    context: Any
    arch: str  # sm_XY of the device
    main_thread: int  # the thread that pushed the context first (pops it at exit)


_lock = threading.RLock()
_gpu: _Gpu | None = None
# (spec, arch) -> (module, prepared function); the module is kept so the function stays valid
_functions: dict[tuple[KernelSpec, str], tuple[Any, Any]] = {}
_pushed = threading.local()


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
            context.push()
            _pushed.done = True
            major, minor = device.compute_capability()
            _gpu = _Gpu(drv, device, context, f"sm_{major}{minor}", threading.get_ident())
            atexit.register(_release)
        elif not getattr(_pushed, "done", False):
            # PyCUDA keeps one context stack per thread: make ours current in this thread too,
            # and pop it when the thread ends (PyCUDA aborts the process if a thread exits
            # with a context still on its stack).
            _gpu.context.push()
            _pushed.done = True
            _pushed.guard = _PopAtThreadExit(_gpu.drv)
        return _gpu


def _release() -> None:
    """At exit: drop loaded modules, pop the context we pushed (as pycuda.autoprimaryctx does)."""
    global _gpu
    state = _gpu
    if state is None:
        return
    _functions.clear()
    try:
        if threading.get_ident() == state.main_thread:
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
    """`sm_XY` of the GPU flashgen runs on."""
    return gpu().arch


def device_name() -> str:
    """The GPU's marketing name, e.g. 'NVIDIA H200' (tuning tables are keyed by it)."""
    return str(gpu().device.name())


def kernel_arch(spec: KernelSpec) -> str:
    """The arch to compile `spec` for so that the cubin loads on this GPU.

    FLASHGEN_ARCH wins when set. Otherwise the newest of the family's archs that this device
    runs (same major, minor not above the device's; an `a` arch only on its exact GPU), else
    the device's own arch when flashgen knows it.
    """
    env = os.environ.get("FLASHGEN_ARCH")
    if env:
        return env
    dev = device_arch()
    dev_num = int(dev.removeprefix("sm_"))
    runnable = []
    for arch in spec.archs:
        num = int(arch.removeprefix("sm_").rstrip("a"))
        exact_only = arch.endswith("a")
        if (num == dev_num) or (not exact_only and num // 10 == dev_num // 10 and num <= dev_num):
            runnable.append((num, arch))
    if runnable:
        return max(runnable)[1]
    if dev in ARCHS:
        return dev
    raise GpuUnavailable(
        f"arch={dev}: flashgen has no target for this GPU (family {spec.family} ships "
        f"{', '.join(spec.archs)}); set FLASHGEN_ARCH to a compatible arch"
    )


def get_function(spec: KernelSpec, compiled: CompiledKernel | None = None) -> Any:
    """The loaded, prepared kernel for `spec` (compiled for this GPU on first use, then cached)."""
    state = gpu()
    arch = compiled.arch if compiled is not None else kernel_arch(spec)
    key = (spec, arch)
    with _lock:
        hit = _functions.get(key)
        if hit is not None:
            return hit[1]
        kernel = compiled if compiled is not None else compile_kernel(spec, arch)
        drv = state.drv
        try:
            module = drv.module_from_buffer(kernel.cubin)
            func = module.get_function(spec.name)
            smem = spec.smem_bytes
            if smem > STATIC_SMEM_LIMIT:
                optin = state.device.get_attribute(
                    drv.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
                )
                if smem > optin:
                    raise RuntimeError(
                        f"kernel {spec.name}: needs {smem} B of shared memory, this GPU allows "
                        f"{optin} B per block; pick a variant with smaller tiles"
                    )
                func.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            func.prepare(ABI_FORMAT)
        except drv.Error as exc:
            raise RuntimeError(f"kernel {spec.name} ({arch}): loading failed: {exc}") from exc
        _functions[key] = (module, func)
        return func


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
    b, h, tq, d = problem.b, problem.h, problem.tq, problem.d
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
) -> Problem:
    """Run `spec` on device arrays (GPUArrays or CUDA-array-interface objects); return the Problem.

    q, k, v, o are (B, H, T, d) with the d axis contiguous; lse is a contiguous float32
    (B, H, Tq) array. Everything is validated before anything is issued. `poison_outputs`
    fills o and lse with NaN first (o must then be contiguous), so an unwritten element shows.
    With `sync` (default) the call waits for the kernel and raises RuntimeError naming it when
    the launch or the kernel fails.
    """
    problem = validate_inputs(spec, q, k, v, o=o, lse=lse)
    if problem.lse_ptr is None or problem.o_ptr is None:
        raise ValueError("o, lse: device arrays with a pointer are required; allocate GPUArrays")
    value = check_scale(scale, spec.d)
    func = get_function(spec)
    if poison_outputs:
        if not _contiguous(problem):
            raise ValueError(
                f"o.strides={problem.o_strides} elements: poisoning needs a contiguous o; "
                "allocate o as a fresh GPUArray"
            )
        count = problem.b * problem.h * problem.tq
        poison(problem.o_ptr, count * problem.d, spec.dtype, stream)
        poison(problem.lse_ptr, count, "fp32", stream)
    launch_problem(spec, func, problem, value, stream, sync=sync)
    return problem


def launch_problem(
    spec: KernelSpec, func: Any, problem: Problem, scale: float, stream: Any, *, sync: bool
) -> None:
    """Issue one validated launch (grid from the spec and the problem); optionally wait for it."""
    drv = gpu().drv
    grid = spec.grid(problem.b, problem.h, problem.tq)
    args = [
        problem.q_ptr, problem.k_ptr, problem.v_ptr, problem.o_ptr, problem.lse_ptr,
        np.int32(problem.tq), np.int32(problem.tk),
        *(np.int64(s) for s in problem.kernel_strides()),
        np.float32(scale * LOG2E),
    ]  # fmt: skip
    try:
        func.prepared_async_call(
            grid, (spec.threads, 1, 1), stream, *args, shared_size=spec.smem_bytes
        )
        if sync:
            if stream is None:
                drv.Context.synchronize()
            else:
                stream.synchronize()
    except drv.Error as exc:
        raise RuntimeError(
            f"kernel {spec.name} failed (grid {grid}, block {spec.threads}, "
            f"{spec.smem_bytes} B shared memory): {exc}"
        ) from exc


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


def empty(shape: tuple[int, ...], dtype: str | npt.DTypeLike) -> Any:
    """A new contiguous GPUArray (dtype: a flashgen dtype name or a NumPy dtype)."""
    gpu()
    from pycuda import gpuarray

    dt = np.dtype(DTYPES[dtype].numpy) if isinstance(dtype, str) else np.dtype(dtype)
    return gpuarray.GPUArray(shape, dt)
