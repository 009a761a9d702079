"""The runtime's launch logic against a recording stand-in for pycuda.driver.

The stand-in only records calls, so these tests pin flashgen's side of the contract (what is
launched, with which grid, block, shared memory, arguments and NaN poison, and how errors are
reported); the real PyCUDA is exercised by the GPU tier (tests/gpu/).
"""

from __future__ import annotations

import struct
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from flashgen.generator import runtime
from flashgen.generator.arch import STATIC_SMEM_LIMIT
from flashgen.generator.compile import CompiledKernel
from flashgen.generator.report import ResourceReport
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec


@dataclass
class Calls:
    log: list[tuple[Any, ...]] = field(default_factory=list)
    fail_launch: bool = False


def fake_driver(calls: Calls) -> types.ModuleType:
    drv = types.ModuleType("pycuda.driver")

    class Error(Exception):
        pass

    class Func:
        def __init__(self, name: str) -> None:
            self.name = name

        def set_attribute(self, attr: str, value: int) -> None:
            calls.log.append(("set_attribute", attr, value))

        def prepare(self, fmt: str) -> None:
            calls.log.append(("prepare", fmt))

        def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
            if calls.fail_launch:
                raise Error("cuLaunchKernel failed: too many resources requested for launch")
            struct.pack(runtime.ABI_FORMAT, *args)  # what PyCUDA's _pvt_struct.pack does
            calls.log.append(("launch", self.name, grid, block, stream, args, shared_size))

    class Module:
        def get_function(self, name: str) -> Func:
            calls.log.append(("get_function", name))
            return Func(name)

    class Context:
        def push(self) -> None:
            calls.log.append(("push",))

        def pop(self) -> None:
            calls.log.append(("pop",))

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
            return (9, 0)

        def get_attribute(self, attr: str) -> int:
            assert attr == "OPTIN"
            return 227 * 1024

        def name(self) -> str:
            return "Fake H200"

    drv.Error = Error  # type: ignore[attr-defined]
    drv.Context = Context  # type: ignore[attr-defined]
    drv.Device = Device  # type: ignore[attr-defined]
    drv.init = lambda: calls.log.append(("init",))  # type: ignore[attr-defined]
    drv.function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="MAXDYN")  # type: ignore[attr-defined]
    drv.device_attribute = types.SimpleNamespace(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN="OPTIN")  # type: ignore[attr-defined]

    def module_from_buffer(cubin: bytes) -> Module:
        calls.log.append(("module_from_buffer", cubin))
        return Module()

    drv.module_from_buffer = module_from_buffer  # type: ignore[attr-defined]
    for name in ("memset_d16", "memset_d32"):
        drv.__dict__[name] = lambda *a, _n=name: calls.log.append((_n, *a))
    return drv


@pytest.fixture
def calls(monkeypatch) -> Calls:
    rec = Calls()
    pkg = types.ModuleType("pycuda")
    drv = fake_driver(rec)
    pkg.driver = drv  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", drv)
    monkeypatch.setattr(runtime, "_gpu", None)
    monkeypatch.setattr(runtime, "_pushed", threading.local())
    monkeypatch.setattr(runtime, "_functions", {})
    monkeypatch.setattr(runtime.atexit, "register", lambda fn: None)
    monkeypatch.delenv("FLASHGEN_ARCH", raising=False)

    def fake_compile(spec: KernelSpec, arch: str) -> CompiledKernel:
        rec.log.append(("compile", spec.name, arch))
        return CompiledKernel(
            spec, arch, b"cubin:" + spec.name.encode(), ResourceReport(arch, 1, 0, 0, 0, 0), False
        )

    monkeypatch.setattr(runtime, "compile_kernel", fake_compile)
    return rec


@dataclass
class Dev:
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: Any
    ptr: int


def dev(shape: tuple[int, ...], dtype: Any, ptr: int) -> Dev:
    size = np.dtype(dtype).itemsize
    strides, step = [], size
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return Dev(shape, tuple(reversed(strides)), np.dtype(dtype), ptr)


def operands(spec: KernelSpec, b=2, h=3, tq=70, tk=45):
    dt = spec.dtype_info.numpy
    d = spec.d
    return (
        dev((b, h, tq, d), dt, 0x10000),
        dev((b, h, tk, d), dt, 0x20000),
        dev((b, h, tk, d), dt, 0x30000),
        dev((b, h, tq, d), dt, 0x40000),
        dev((b, h, tq), np.float32, 0x50000),
    )


def kind(calls: Calls, name: str) -> list[tuple[Any, ...]]:
    return [c for c in calls.log if c[0] == name]


def test_a_launch_passes_the_abi_grid_block_and_shared_memory(calls):
    spec = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp16", causal=True)
    q, k, v, o, lse = operands(spec)
    problem = runtime.launch(spec, q, k, v, o, lse, 0.3)
    assert kind(calls, "compile") == [("compile", spec.name, "sm_90")]
    assert kind(calls, "prepare") == [("prepare", runtime.ABI_FORMAT)]
    [launch] = kind(calls, "launch")
    _, name, grid, block, stream, args, shared = launch
    assert (name, grid, block, stream, shared) == (
        spec.name, (3, 3, 2), (spec.threads, 1, 1), None, spec.smem_bytes,
    )  # fmt: skip
    assert list(args[:5]) == [0x10000, 0x20000, 0x30000, 0x40000, 0x50000]
    assert [int(a) for a in args[5:7]] == [70, 45]
    assert tuple(int(a) for a in args[7:19]) == problem.kernel_strides()
    assert args[19] == np.float32(0.3 * runtime.LOG2E) and isinstance(args[19], np.float32)
    assert calls.log[-1] == ("synchronize",)


def test_the_shared_memory_attribute_is_raised_only_above_48_kib(calls):
    small = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp32")
    big = max(shipped(), key=lambda s: s.smem_bytes)
    assert small.smem_bytes <= STATIC_SMEM_LIMIT < big.smem_bytes
    runtime.get_function(small)
    assert kind(calls, "set_attribute") == []
    runtime.get_function(big)
    assert kind(calls, "set_attribute") == [("set_attribute", "MAXDYN", big.smem_bytes)]


def test_modules_are_loaded_once_per_variant(calls):
    spec = KernelSpec(family="simt", d=32, br=16, bc=16, dtype="fp32")
    assert runtime.get_function(spec) is runtime.get_function(spec)
    assert len(kind(calls, "module_from_buffer")) == 1 and len(kind(calls, "compile")) == 1


def test_poisoning_fills_o_and_lse_with_nan_before_the_launch(calls):
    spec = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="bf16")
    q, k, v, o, lse = operands(spec)
    runtime.launch(spec, q, k, v, o, lse, None, poison_outputs=True)
    names = [c[0] for c in calls.log]
    assert names.index("memset_d16") < names.index("launch")
    assert kind(calls, "memset_d16") == [("memset_d16", 0x40000, 0x7FC0, 2 * 3 * 70 * 64)]
    assert kind(calls, "memset_d32") == [("memset_d32", 0x50000, 0x7FC00000, 2 * 3 * 70)]


def test_poisoning_refuses_a_strided_output(calls):
    spec = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp16")
    q, k, v, o, lse = operands(spec)
    wide = Dev(o.shape, (3 * 70 * 256, 70 * 256, 256, 2), o.dtype, o.ptr)  # token: 128 el.
    with pytest.raises(ValueError, match=r"poisoning needs a contiguous o"):
        runtime.launch(spec, q, k, v, wide, lse, None, poison_outputs=True)
    runtime.launch(spec, q, k, v, wide, lse, None)  # without poison a strided o is fine


def test_validation_runs_before_anything_is_issued(calls):
    spec = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp16")
    q, k, v, o, lse = operands(spec)
    with pytest.raises(ValueError, match="lse"):
        runtime.launch(spec, q, k, v, o, dev((2, 3, 69), np.float32, 0x50000), None)
    assert kind(calls, "launch") == [] and kind(calls, "compile") == []


def test_launch_failures_name_the_kernel(calls):
    spec = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp16")
    calls.fail_launch = True
    with pytest.raises(
        RuntimeError, match=rf"kernel {spec.name} failed \(grid \(3, 3, 2\), block 128"
    ):
        runtime.launch(spec, *operands(spec), None)


def test_without_sync_nothing_waits(calls):
    spec = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp16")
    runtime.launch(spec, *operands(spec), None, sync=False)
    assert kind(calls, "synchronize") == []


def test_the_context_is_pushed_once_per_thread(calls):
    runtime.gpu()
    runtime.gpu()
    assert kind(calls, "push") == [("push",)]
    t = threading.Thread(target=runtime.gpu)
    t.start()
    t.join()
    assert kind(calls, "push") == [("push",), ("push",)]
    assert runtime.device_arch() == "sm_90" and runtime.device_name() == "Fake H200"


def test_the_argument_block_is_148_bytes_with_natural_alignment():
    assert struct.calcsize(runtime.ABI_FORMAT) == 5 * 8 + 2 * 4 + 12 * 8 + 4
