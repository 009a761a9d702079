"""Read back a `__device__` array that an instrumented kernel writes (the timeline experiments:
bench/experiments/decode-timeline.patch, wgmma-fwd-timeline.patch), from the modules flashgen
has loaded: cuModuleGetGlobal on each plan's module, through ctypes on libcuda."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from flashgen.runtime import launch


def libcuda() -> Any:
    """libcuda with the three entry points used here typed."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuModuleGetGlobal_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                         ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p,
                                         ctypes.c_char_p]  # fmt: skip
    lib.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
    lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    return lib


def _globals(lib: Any, kernel_prefix: str, symbol: bytes) -> list[tuple[int, int, str]]:
    """(device pointer, bytes, kernel name) of `symbol` in every loaded module of a kernel
    whose name starts with `kernel_prefix`."""
    found: list[tuple[int, int, str]] = []
    for plan in launch._plans.values():
        if plan.spec.name.startswith(kernel_prefix):
            ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
            rc = lib.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size),
                                          ctypes.c_void_p(plan.module), symbol)  # fmt: skip
            if rc == 0:
                found.append((ptr.value, size.value, plan.spec.name))
    if not found:
        raise SystemExit(f"no {kernel_prefix} module holds {symbol.decode()}: patch applied?")
    return found


def recorded_call(
    lib: Any, call: Callable[[], object], host: np.ndarray, kernel_prefix: str, symbol: bytes
) -> str:
    """Zero `symbol` in every loaded `kernel_prefix` module, run `call` once, and read the one
    copy it wrote (its [..., 0, 0] entries not all zero) into `host`; that kernel's name."""
    tls = _globals(lib, kernel_prefix, symbol)
    for dptr, nbytes, _ in tls:
        assert nbytes == host.nbytes and lib.cuMemsetD8_v2(dptr, 0, nbytes) == 0
    torch.cuda.synchronize()
    call()
    torch.cuda.synchronize()
    written, kept = [], host.copy()
    for dptr, nbytes, name in tls:
        assert lib.cuMemcpyDtoH_v2(host.ctypes.data, dptr, nbytes) == 0
        if host[:, 0, 0].any():
            written.append(name)
            kept = host.copy()
    if len(written) != 1:
        raise SystemExit(f"expected one {kernel_prefix} kernel to record, got {written}")
    host[...] = kept
    return written[0]
