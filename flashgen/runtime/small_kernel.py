"""Small helper kernels the torch front door launches beside the attention kernels (range
summaries, block maps): compiled from their CUDA source through the cubin cache, loaded once
per (device, source, kernel name) into the device's primary context, launched with ctypes on
a given stream. One place for what runtime/summary_kernel.py and runtime/block_map.py share.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Sequence
from typing import Any

from flashgen.generator.arch import ARCHS
from flashgen.generator.cache import CubinCache, cache_key
from flashgen.generator.compile import (
    cubin_flags,
    flashgen_version,
    nvcc_flags_seen,
    run_nvcc_timed,
)
from flashgen.generator.nvcc import find_nvcc, nvcc_version
from flashgen.runtime import launch as _launch


def cubin(source: str, arch: str, what: str) -> bytes:
    """`source`'s cubin for `arch` (an `ARCHS` name), from the cubin cache or nvcc; `what`
    names it in messages and in the cache entry."""
    flags = cubin_flags(ARCHS[arch].gencode)
    key = cache_key(source, nvcc_flags_seen(flags), arch, nvcc_version(find_nvcc()),
                    flashgen_version())  # fmt: skip
    store = CubinCache()
    hit = store.get(key)
    if hit is not None:
        return hit[0]
    run = run_nvcc_timed(flags, source, what=f"{what} for {arch}")
    # an unwritable cache costs a rebuild in the next process, not this call
    with contextlib.suppress(OSError):
        store.put(key, run.output, {"name": what, "flags": flags})
    return run.output


_loaded: dict[tuple[int, str, str], tuple[int, int]] = {}  # (device, source, name) -> ctx, fn
_lock = threading.Lock()


def function(source: str, name: str, device: int, arch: str) -> tuple[int, int]:
    """(primary context, CUfunction) of kernel `name` of `source` on `device`, compiled and
    loaded on first use."""
    key = (device, source, name)
    got = _loaded.get(key)
    if got is None:
        with _lock:
            got = _loaded.get(key)
            if got is None:
                drv = _launch.driver()
                _, func = drv.load(device, cubin(source, arch, name), name, 0)
                got = _loaded[key] = (drv.primary_context(device), func)
    return got


def param_array(args: Sequence[Any]) -> Any:
    """The `kernelParams` array of `args` (ctypes values, in the kernel's parameter order): one
    pointer to each. It reads the values at launch time, so a caller that keeps the array may
    change the values in place between launches."""
    return (ctypes.c_void_p * len(args))(
        *(ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args)
    )


def launch(function_: tuple[int, int], grid: tuple[int, int, int], threads: int, stream: int,
           args: Sequence[Any], what: str) -> None:  # fmt: skip
    """Launch a `function` result on CUstream `stream` with `args` (ctypes values, in the
    kernel's parameter order): no synchronization. RuntimeError naming `what` when the driver
    refuses the launch."""
    launch_params(function_, grid, threads, stream, param_array(args), what)


def launch_params(function_: tuple[int, int], grid: tuple[int, int, int], threads: int,
                  stream: int, params: Any, what: str) -> None:  # fmt: skip
    """`launch` with a `param_array` built before (kept by the caller across launches)."""
    context, func = function_
    rc = _launch.launch_in_context(context, func, grid, threads, 0, stream, params)
    if rc:
        raise RuntimeError(f"kernel {what} failed: {_launch.driver().error(rc)}")


__all__ = ["cubin", "function", "launch", "launch_params", "param_array"]
