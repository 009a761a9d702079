"""Recording stand-ins for libcuda (through the real `launch.Driver`) and for pycuda.

`FakeLibcuda` implements the driver entry points flashgen calls with the C calling shapes
ctypes hands them (byref out-parameters, a kernelParams array of addresses), so the tests read
back what a real `cuLaunchKernel` would receive: each argument through its address.
"""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from flashgen.generator import abi
from flashgen.generator.compile import CompiledKernel
from flashgen.generator.features.hook import HOOK_PARAMS
from flashgen.generator.report import ResourceReport
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.runtime import launch

ERROR_NAMES = {701: b"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 201: b"CUDA_ERROR_INVALID_CONTEXT"}


class _Fn:
    """A libcuda symbol: callable, with the argtypes/restype attributes ctypes functions have."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl
        self.argtypes: Any = None
        self.restype: Any = None

    def __call__(self, *args: Any) -> int:
        return int(self.impl(*args))


def _out(ref: Any, value: Any) -> None:
    """Write through a ctypes.byref(...) out-parameter."""
    ref._obj.value = value


@dataclass
class Launch:
    """One decoded cuLaunchKernel call."""

    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    stream: int
    context: int  # the context current when it was issued
    prefix: list[bytes]
    ptrs: tuple[int, ...]
    tq: int
    tk: int
    strides: tuple[int, ...]
    scale_log2: float
    kv_group: int
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: int = 0
    hook_block: tuple[int | float, ...] = ()  # a hooked launch's aux block (HOOK_PARAMS order)
    # a varlen launch's (cu_seqlens_q, cu_seqlens_k, n_seqs, work_counter)
    varlen: tuple[int, int, int, int] | None = None


@dataclass
class FakeLibcuda:
    log: list[tuple[Any, ...]] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    optin: int = 227 * 1024
    launch_rc: int = 0
    prefix_sizes: list[int] = field(default_factory=list)  # byte sizes of leading arguments
    decode_params: bool = False  # read launches as the decode kernel's (abi.DECODE) instead
    decode_launches: list[dict[str, Any]] = field(default_factory=list)  # name -> value
    # with decode_params: the split merge's launches (abi.DECODE_COMBINE), name -> value
    combine_launches: list[dict[str, Any]] = field(default_factory=list)
    stack: list[int] = field(default_factory=list)  # this (single) thread's context stack

    def __post_init__(self) -> None:
        for name in dir(self):
            if name.startswith("_cu"):
                setattr(self, name[1:], _Fn(getattr(self, name)))
        # the versioned names flashgen binds
        self.cuCtxPushCurrent_v2 = self.cuCtxPushCurrent  # type: ignore[attr-defined]
        self.cuCtxPopCurrent_v2 = self.cuCtxPopCurrent  # type: ignore[attr-defined]

    @staticmethod
    def context_of(device: int) -> int:
        return 0xC000 + device

    def _cuInit(self, flags: int) -> int:
        return 0

    def _cuDeviceGet(self, ref: Any, ordinal: int) -> int:
        _out(ref, ordinal)
        return 0

    def _cuDevicePrimaryCtxRetain(self, ref: Any, dev: Any) -> int:
        self.log.append(("retain", dev.value))
        _out(ref, self.context_of(dev.value))
        return 0

    def _cuCtxPushCurrent(self, ctx: int) -> int:
        self.log.append(("push", ctx))
        self.stack.append(ctx)
        return 0

    def _cuCtxPopCurrent(self, ref: Any) -> int:
        ctx = self.stack.pop()
        self.log.append(("pop", ctx))
        _out(ref, ctx)
        return 0

    def _cuCtxGetCurrent(self, ref: Any) -> int:
        _out(ref, self.stack[-1] if self.stack else None)
        return 0

    def _cuModuleLoadData(self, ref: Any, image: bytes) -> int:
        self.log.append(("load", image, self.stack[-1] if self.stack else None))
        _out(ref, 0x1000 + len(self.log))
        return 0

    def _cuModuleGetFunction(self, ref: Any, module: Any, name: bytes) -> int:
        self.log.append(("function", name.decode()))
        _out(ref, 0x2000 + len(self.log))
        return 0

    def _cuDeviceGetAttribute(self, ref: Any, attr: int, dev: int) -> int:
        if attr == launch.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
            _out(ref, 132)  # an H200's
            return 0
        assert attr == launch.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        _out(ref, self.optin)
        return 0

    def _cuOccupancyMaxActiveBlocksPerMultiprocessor(
        self, ref: Any, func: Any, threads: int, smem: int
    ) -> int:
        _out(ref, max(1, min(32, 2048 // max(threads, 1), (228 * 1024) // max(smem + 1024, 1))))
        return 0

    def _cuFuncSetAttribute(self, func: Any, attr: int, value: int) -> int:
        self.log.append(("set_attribute", attr, value))
        return 0

    def _cuGetErrorName(self, rc: int, ref: Any) -> int:
        _out(ref, ERROR_NAMES.get(rc, b"CUDA_ERROR_UNKNOWN"))
        return 0

    def _cuGetErrorString(self, rc: int, ref: Any) -> int:
        _out(ref, b"an error")
        return 0

    def _cuEventCreate(self, ref: Any, flags: int) -> int:
        _out(ref, 0xE000 + len(self.log))
        self.log.append(("event_create", ref._obj.value, flags))
        return 0

    def _cuEventRecord(self, event: Any, stream: Any) -> int:
        self.log.append(("event_record", event.value, stream))
        return 0

    def _cuStreamWaitEvent(self, stream: Any, event: Any, flags: int) -> int:
        self.log.append(("stream_wait_event", stream, event.value, flags))
        return 0

    def _cuEventDestroy_v2(self, event: Any) -> int:
        self.log.append(("event_destroy", event.value))
        return 0

    def _cuLaunchKernel(
        self, f: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, smem: int,
        stream: int, params: Any, extra: Any,
    ) -> int:  # fmt: skip
        assert extra is None
        n = len(self.prefix_sizes)
        addrs = [int(a) for a in params]
        if self.decode_params:
            table = abi.DECODE if len(addrs) == len(abi.DECODE) else abi.DECODE_COMBINE
            assert len(addrs) == len(table)
            read = {"P": ctypes.c_void_p, "i": ctypes.c_int, "f": ctypes.c_float,
                    "q": ctypes.c_longlong}  # fmt: skip
            args = {p.name: read[p.code].from_address(a).value or 0
                    for p, a in zip(table, addrs, strict=True)}  # fmt: skip
            args.update(grid=(gx, gy, gz), block=(bx, by, bz), smem=smem, stream=stream,
                        function=f)  # fmt: skip
            (self.decode_launches if table is abi.DECODE else self.combine_launches).append(args)
            self.log.append(("launch",))
            return self.launch_rc
        hooked = len(addrs) == n + launch.N_COMMON_ARGS + len(HOOK_PARAMS)
        varlen = len(addrs) == n + launch.N_COMMON_ARGS + len(abi.VARLEN_FWD)
        assert len(addrs) == n + launch.N_COMMON_ARGS or hooked or varlen
        readers = {"P": ctypes.c_void_p, "i": ctypes.c_int, "f": ctypes.c_float}
        block = tuple(
            readers[p.code].from_address(a).value or 0
            for p, a in zip(HOOK_PARAMS, addrs[n + launch.N_COMMON_ARGS :], strict=True)
        ) if hooked else ()  # fmt: skip
        prefix = [
            ctypes.string_at(a, size) for a, size in zip(addrs[:n], self.prefix_sizes, strict=True)
        ]
        common = addrs[n:]
        self.launches.append(
            Launch(
                f, (gx, gy, gz), (bx, by, bz), smem, stream,
                self.stack[-1] if self.stack else 0,
                prefix,
                tuple(int(ctypes.c_void_p.from_address(a).value or 0) for a in common[:5]),
                ctypes.c_int.from_address(common[5]).value,
                ctypes.c_int.from_address(common[6]).value,
                tuple(ctypes.c_longlong.from_address(a).value for a in common[7:19]),
                ctypes.c_float.from_address(common[19]).value,
                ctypes.c_int.from_address(common[20]).value,
                (ctypes.c_int.from_address(common[21]).value,
                 ctypes.c_int.from_address(common[22]).value),
                ctypes.c_float.from_address(common[23]).value,
                int(ctypes.c_void_p.from_address(common[24]).value or 0),
                block,
                (int(ctypes.c_void_p.from_address(common[25]).value or 0),
                 int(ctypes.c_void_p.from_address(common[26]).value or 0),
                 ctypes.c_int.from_address(common[27]).value,
                 int(ctypes.c_void_p.from_address(common[28]).value or 0)) if varlen else None,
            )
        )  # fmt: skip
        self.log.append(("launch",))
        return self.launch_rc


    def _cuLaunchKernelEx(self, config: Any, f: int, params: Any, extra: Any) -> int:
        """cuLaunchKernelEx: the CUlaunchConfig read back by its C layout (grid, block, shared
        memory, stream, then the attribute array), its attributes logged as (id, first int of
        the value union), then the launch decoded as cuLaunchKernel's."""
        raw = ctypes.string_at(ctypes.addressof(config._obj), ctypes.sizeof(config._obj))
        gx, gy, gz, bx, by, bz, smem = struct.unpack_from("<7I", raw, 0)
        stream, attrs, n_attrs = struct.unpack_from("<QQI", raw, 32)  # 7 x 4 B, padded to 8
        got = []
        for i in range(n_attrs):  # CUlaunchAttribute: id, 4 pad bytes, a 64-byte value union
            a_id, value = struct.unpack("<i4xi", ctypes.string_at(attrs + 72 * i, 12))
            got.append((a_id, value))
        self.log.append(("launch_attributes", tuple(got)))
        return self._cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra)


def install_libcuda(monkeypatch: pytest.MonkeyPatch) -> FakeLibcuda:
    """Route flashgen's driver calls to a fresh FakeLibcuda; forget cached plans."""
    fake = FakeLibcuda()
    monkeypatch.setattr(launch, "_driver", launch.Driver(fake))
    monkeypatch.setattr(launch, "_plans", {})
    return fake


# ---- pycuda -----------------------------------------------------------------------------------
@dataclass
class Calls:
    log: list[tuple[Any, ...]] = field(default_factory=list)


class FakeGPUArray:
    """What flashgen reads from a GPUArray: shape, byte strides, dtype, gpudata."""

    _next = 0x7000_0000

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: Any,
        allocator: Any = None,
        gpudata: int | None = None,
        strides: tuple[int, ...] | None = None,
    ) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        out, step = [], self.dtype.itemsize
        for n in reversed(self.shape):
            out.append(step)
            step *= n
        dense = tuple(reversed(out))
        self.strides = dense if strides is None else strides
        if gpudata is None:
            FakeGPUArray._next += 1 << 20
            gpudata = FakeGPUArray._next
        self.gpudata = gpudata
        self.pooled = allocator is not None
        self.flags = types.SimpleNamespace(c_contiguous=self.strides == dense)


def fake_pycuda(calls: Calls, cc: tuple[int, int] = (9, 0)) -> dict[str, types.ModuleType]:
    """pycuda, pycuda.driver, pycuda.gpuarray and pycuda.tools stand-ins that record calls."""
    drv = types.ModuleType("pycuda.driver")

    class Error(Exception):
        pass

    class Context:
        def push(self) -> None:
            calls.log.append(("push", threading.get_ident()))

        @staticmethod
        def pop() -> None:  # static in PyCUDA: pops the calling thread's current context
            calls.log.append(("pop", threading.get_ident()))

        @staticmethod
        def synchronize() -> None:
            calls.log.append(("synchronize",))

    class Device:
        @staticmethod
        def count() -> int:
            return 1

        def __init__(self, n: int) -> None:
            assert n == 0

        def retain_primary_context(self) -> Context:
            return Context()

        def compute_capability(self) -> tuple[int, int]:
            return cc

        def name(self) -> str:
            return "Fake H200"

    drv.Error = Error  # type: ignore[attr-defined]
    drv.Context = Context  # type: ignore[attr-defined]
    drv.Device = Device  # type: ignore[attr-defined]
    drv.init = lambda: calls.log.append(("init",))  # type: ignore[attr-defined]
    for name in ("memset_d16", "memset_d32"):
        drv.__dict__[name] = lambda *a, _n=name: calls.log.append((_n, *a))
    drv.memcpy_htod = lambda dst, src: calls.log.append(("htod", dst, len(src)))  # type: ignore[attr-defined]
    drv.memcpy_dtoh = lambda dst, src: calls.log.append(("dtoh", src, len(dst)))  # type: ignore[attr-defined]

    gpuarray = types.ModuleType("pycuda.gpuarray")
    gpuarray.GPUArray = FakeGPUArray  # type: ignore[attr-defined]
    tools = types.ModuleType("pycuda.tools")

    class DeviceMemoryPool:
        def allocate(self, nbytes: int) -> int:
            return 0

        def stop_holding(self) -> None:
            pass

    tools.DeviceMemoryPool = DeviceMemoryPool  # type: ignore[attr-defined]
    tools.clear_context_caches = lambda: None  # type: ignore[attr-defined]
    pkg = types.ModuleType("pycuda")
    pkg.driver, pkg.gpuarray, pkg.tools = drv, gpuarray, tools  # type: ignore[attr-defined]
    return {"pycuda": pkg, "pycuda.driver": drv, "pycuda.gpuarray": gpuarray, "pycuda.tools": tools}


def install_pycuda(monkeypatch: pytest.MonkeyPatch, cc: tuple[int, int] = (9, 0)) -> Calls:
    """A fake PyCUDA on a fake GPU (sm_90 by default), a fresh runtime state, compiles
    recorded not run."""
    rec = Calls()
    for name, mod in fake_pycuda(rec, cc).items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(runtime, "_gpu", None)
    monkeypatch.setattr(runtime, "_pool", None)
    monkeypatch.setattr(runtime, "_pushed", threading.local())
    monkeypatch.setattr(runtime, "_functions", {})
    monkeypatch.setattr(runtime, "_counters", [])
    monkeypatch.setattr(runtime.atexit, "register", lambda fn: None)
    monkeypatch.delenv("FLASHGEN_ARCH", raising=False)

    def fake_compile(spec: KernelSpec, arch: str) -> CompiledKernel:
        rec.log.append(("compile", spec.name, arch))
        return CompiledKernel(
            spec, arch, b"cubin:" + spec.name.encode(), ResourceReport(arch, 1, 0, 0, 0, 0), False
        )

    monkeypatch.setattr(runtime, "compile_kernel", fake_compile)
    return rec


def kinds(log: list[tuple[Any, ...]], name: str) -> list[tuple[Any, ...]]:
    return [c for c in log if c[0] == name]


def abi_size() -> int:
    return struct.calcsize(runtime.ABI_FORMAT)
