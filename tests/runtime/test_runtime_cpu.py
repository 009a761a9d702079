"""The runtime's and the launch module's logic against recording stand-ins for pycuda and libcuda.

The stand-ins only record calls (tests/_fakecuda.py), so these tests pin flashgen's side of
the contract: what is loaded into which context, what `cuLaunchKernel` receives (grid, block,
shared memory, stream and each kernelParams entry read back through its address), NaN poison,
leading family arguments, contexts per thread, and how errors are reported. The real driver
is exercised by the GPU tier (tests/gpu/).
"""

from __future__ import annotations

import ctypes
import gc
import struct
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from _fakecuda import FakeLibcuda, install_libcuda, install_pycuda, kinds

from flashgen.generator.arch import STATIC_SMEM_LIMIT
from flashgen.generator.features import FeatureArgs
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.runtime import launch
from flashgen.runtime.prefix import PrefixRegistry


def fresh_prefixes() -> PrefixRegistry[Any]:
    """An empty forward prefix registry (the real one already holds wgmma's builder)."""
    return PrefixRegistry(launch.POINTERS, launch.PREFIX_PROVIDERS, "kernels")


@pytest.fixture
def calls(monkeypatch):
    return install_pycuda(monkeypatch)


@pytest.fixture
def cuda(monkeypatch) -> FakeLibcuda:
    return install_libcuda(monkeypatch)


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
        dev((b, h, tq, d), dt, 0x100_0000),  # 16 MiB apart: outputs must not overlap inputs
        dev((b, h, tk, d), dt, 0x200_0000),
        dev((b, h, tk, d), dt, 0x300_0000),
        dev((b, h, tq, d), dt, 0x400_0000),
        dev((b, h, tq), np.float32, 0x500_0000),
    )


SIMT = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp16", causal=True)


def test_a_launch_passes_each_abi_argument_through_kernel_params(calls, cuda):
    q, k, v, o, lse = operands(SIMT)
    problem = runtime.launch(SIMT, q, k, v, o, lse, 0.3)
    assert kinds(calls.log, "compile") == [("compile", SIMT.name, "sm_90")]
    [call] = cuda.launches
    assert call.grid == (3, 3, 2) and call.block == (SIMT.threads, 1, 1)
    assert call.smem == SIMT.smem_bytes and call.stream == 0
    assert call.ptrs == (0x100_0000, 0x200_0000, 0x300_0000, 0x400_0000, 0x500_0000)
    assert (call.tq, call.tk) == (70, 45)
    assert call.strides == problem.kernel_strides()
    assert call.scale_log2 == np.float32(0.3 * runtime.LOG2E)
    assert call.kv_group == 1
    assert calls.log[-1] == ("synchronize",)


@pytest.mark.parametrize(("h", "h_kv"), [(8, 2), (8, 1)])
def test_grouped_query_attention_passes_query_heads_per_kv_head(calls, cuda, h, h_kv):
    q, _, _, o, lse = operands(SIMT, h=h)
    k = dev((2, h_kv, 45, SIMT.d), SIMT.dtype_info.numpy, 0x200_0000)
    v = dev((2, h_kv, 45, SIMT.d), SIMT.dtype_info.numpy, 0x300_0000)
    runtime.launch(SIMT, q, k, v, o, lse, 0.3)
    [call] = cuda.launches
    assert call.grid == (3, h, 2)  # one block row per query head
    assert call.kv_group == h // h_kv


def test_the_kernel_is_loaded_into_the_devices_primary_context_and_the_caller_keeps_its_own(
    calls, cuda
):
    cuda.stack.append(0xBEEF)  # some other context is current on this thread
    runtime.get_function(SIMT)
    [load] = kinds(cuda.log, "load")
    assert load == ("load", b"cubin:" + SIMT.name.encode(), FakeLibcuda.context_of(0))
    assert cuda.stack == [0xBEEF]


def test_a_launch_while_another_context_is_current_pushes_the_plans_and_pops_it(calls, cuda):
    plan = runtime.get_function(SIMT)
    bound = plan.bind(runtime.launch(SIMT, *operands(SIMT), None, sync=False), 0.5)
    cuda.stack[:] = [0xBEEF]
    bound(1 << 12, 2 << 12, 3 << 12, 4 << 12, 5 << 12, 77)
    assert cuda.launches[-1].context == FakeLibcuda.context_of(0)
    assert cuda.launches[-1].stream == 77 and cuda.stack == [0xBEEF]
    cuda.stack[:] = [FakeLibcuda.context_of(0)]
    pushes = len(kinds(cuda.log, "push"))
    bound(1 << 12, 2 << 12, 3 << 12, 4 << 12, 5 << 12, 77)
    assert len(kinds(cuda.log, "push")) == pushes  # already current: no push


def test_the_shared_memory_limit_is_raised_only_above_48_kib(calls, cuda):
    small = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp32")
    big = max((s for s in shipped() if s.family in ("simt", "mma")), key=lambda s: s.smem_bytes)
    assert small.smem_bytes <= STATIC_SMEM_LIMIT < big.smem_bytes
    runtime.get_function(small)
    assert kinds(cuda.log, "set_attribute") == []
    runtime.get_function(big)
    assert kinds(cuda.log, "set_attribute") == [
        ("set_attribute", launch.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, big.smem_bytes)
    ]


def test_a_kernel_needing_more_shared_memory_than_the_gpu_allows_is_refused(calls, cuda):
    big = max((s for s in shipped() if s.family in ("simt", "mma")), key=lambda s: s.smem_bytes)
    cuda.optin = big.smem_bytes - 1
    with pytest.raises(RuntimeError, match=rf"kernel {big.name} \(sm_90\): loading failed: "
                       rf"needs {big.smem_bytes} B of shared memory"):  # fmt: skip
        runtime.get_function(big)
    assert cuda.stack == []  # the context pushed for the load was popped


def test_modules_are_loaded_once_per_variant(calls, cuda):
    spec = KernelSpec(family="simt", d=32, br=16, bc=16, dtype="fp32")
    assert runtime.get_function(spec) is runtime.get_function(spec)
    assert len(kinds(cuda.log, "load")) == 1 and len(kinds(calls.log, "compile")) == 1


def test_poisoning_fills_o_and_lse_with_nan_before_the_launch(calls, cuda):
    spec = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="bf16")
    runtime.launch(spec, *operands(spec), None, poison_outputs=True)
    assert kinds(calls.log, "memset_d16") == [("memset_d16", 0x400_0000, 0x7FC0, 2 * 3 * 70 * 64)]
    assert kinds(calls.log, "memset_d32") == [("memset_d32", 0x500_0000, 0x7FC00000, 2 * 3 * 70)]
    assert len(cuda.launches) == 1  # after the poison (recorded in order below)
    names = [c[0] for c in calls.log]
    assert names.index("memset_d32") < names.index("synchronize")


def test_poisoning_refuses_a_strided_output(calls, cuda):
    q, k, v, o, lse = operands(SIMT)
    wide = Dev(o.shape, (3 * 70 * 256, 70 * 256, 256, 2), o.dtype, o.ptr)  # token: 128 el.
    with pytest.raises(ValueError, match=r"poisoning needs a contiguous o"):
        runtime.launch(SIMT, q, k, v, wide, lse, None, poison_outputs=True)
    runtime.launch(SIMT, q, k, v, wide, lse, None)  # without poison a strided o is fine
    assert cuda.launches[-1].strides[9:] == (3 * 70 * 128, 70 * 128, 128)


def test_validation_runs_before_anything_is_issued(calls, cuda):
    q, k, v, o, lse = operands(SIMT)
    with pytest.raises(ValueError, match="lse"):
        runtime.launch(SIMT, q, k, v, o, dev((2, 3, 69), np.float32, 0x50000), None)
    assert cuda.launches == [] and kinds(calls.log, "compile") == []


def test_launch_failures_name_the_kernel_and_the_driver_error(calls, cuda):
    cuda.launch_rc = 701
    with pytest.raises(
        RuntimeError,
        match=rf"kernel {SIMT.name} failed \(grid \(3, 3, 2\), block 128, .*\): "
        "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    ):
        runtime.launch(SIMT, *operands(SIMT), None)


def test_without_sync_nothing_waits(calls, cuda):
    runtime.launch(SIMT, *operands(SIMT), None, sync=False)
    assert kinds(calls.log, "synchronize") == [] and len(cuda.launches) == 1


@pytest.mark.parametrize(
    "stream,handle",
    [(None, 0), (5, 5), (type("S", (), {"handle": 6})(), 6),
     (type("T", (), {"cuda_stream": 7})(), 7)],
)  # fmt: skip
def test_streams_are_passed_as_their_handles(stream, handle):
    assert runtime.stream_handle(stream) == handle


def test_a_non_stream_is_refused():
    with pytest.raises(ValueError, match=r"stream='s': not a CUDA stream"):
        runtime.stream_handle("s")


def test_the_context_is_pushed_once_per_thread(calls):
    runtime.gpu()
    runtime.gpu()
    assert len(kinds(calls.log, "push")) == 1
    t = threading.Thread(target=runtime.gpu)
    t.start()
    t.join()
    assert len(kinds(calls.log, "push")) == 2
    assert runtime.device_arch() == "sm_90" and runtime.device_name() == "Fake H200"


def test_first_gpu_use_on_a_worker_thread_pops_its_context_when_the_thread_ends(calls):
    # issue #9: the first use pushed without the pop-at-exit guard, so a worker that touched
    # the GPU first left a context on its stack (PyCUDA aborts the process on that)
    worker: list[int] = []

    def work() -> None:
        worker.append(threading.get_ident())
        runtime.gpu()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    gc.collect()
    assert ("push", worker[0]) in calls.log and ("pop", worker[0]) in calls.log
    main = threading.get_ident()
    runtime.gpu()  # the main thread pushes its own, popped at exit (not by a guard)
    assert ("push", main) in calls.log and ("pop", main) not in calls.log
    runtime._release()
    assert ("pop", main) in calls.log


def test_a_device_arch_override_makes_kernel_arch_compile_for_that_gpu(calls):
    spec = KernelSpec(family="simt", d=64, dtype="fp32")
    assert runtime.kernel_arch(spec) == "sm_90"
    with runtime.for_device_arch("sm_80"):
        assert runtime.device_arch() == "sm_80"
        assert runtime.kernel_arch(spec) == "sm_80"
    assert runtime.device_arch() == "sm_90"


def test_the_argument_block_is_176_bytes_with_natural_alignment():
    # 5 pointers, tq, tk, 12 strides, scale_log2, kv_group, window left/right, softcap, then
    # the ALiBi pointer (8-aligned: 4 bytes of padding after softcap)
    assert struct.calcsize(runtime.ABI_FORMAT) == 5 * 8 + 2 * 4 + 12 * 8 + 4 + 4 + 4 + 4 + 4 + 4 + 8


# ---- leading by-value arguments (the wgmma family's tensor maps) ------------------------------
class Blob(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 128)]


def test_family_prefix_args_lead_the_kernel_params_and_are_rebuilt_only_when_pointers_change(
    monkeypatch, calls, cuda
):
    built: list[tuple[int | None, ...]] = []

    def builder(spec: KernelSpec, problem: Any) -> list[Any]:
        built.append((problem.q_ptr, problem.k_ptr, problem.v_ptr, problem.o_ptr, problem.lse_ptr))
        blobs = []
        for tag in (1, 2, 3):
            b = Blob()
            b.bytes[0], b.bytes[127] = tag, (problem.q_ptr >> 12) & 0xFF
            blobs.append(b)
        return blobs

    monkeypatch.setattr(launch, "_prefixes", fresh_prefixes())
    launch.register_prefix_args("simt", builder)
    cuda.prefix_sizes = [128, 128, 128]
    q, k, v, o, lse = operands(SIMT)
    problem = runtime.launch(SIMT, q, k, v, o, lse, 0.3, sync=False)
    bound = runtime.get_function(SIMT).bind(problem, 0.3 * runtime.LOG2E)
    bound(0x10000, 0x20000, 0x30000, 0x40000, 0x50000)
    bound(0x10000, 0x20000, 0x30000, 0x40000, 0x50000)
    bound(0x11000, 0x20000, 0x30000, 0x40000, 0x50000)
    # runtime.launch built once for its own bound, then once per distinct pointer set here
    assert built == [
        (0x100_0000, 0x200_0000, 0x300_0000, 0x400_0000, 0x500_0000),
        (0x10000, 0x20000, 0x30000, 0x40000, 0x50000),
        (0x11000, 0x20000, 0x30000, 0x40000, 0x50000),
    ]
    for call in cuda.launches:
        assert [p[0] for p in call.prefix] == [1, 2, 3]
        assert call.prefix[0][127] == (call.ptrs[0] >> 12) & 0xFF
        assert (call.tq, call.tk) == (70, 45) and call.strides == problem.kernel_strides()
    assert cuda.launches[-1].ptrs[0] == 0x11000


def test_a_family_whose_provider_registers_no_builder_is_refused_before_loading(
    monkeypatch, calls, cuda
):
    monkeypatch.setitem(launch.PREFIX_PROVIDERS, "simt", "json")  # imports, registers nothing
    with pytest.raises(RuntimeError, match=r"family simt: its kernels take leading arguments"):
        runtime.get_function(SIMT)
    assert kinds(cuda.log, "load") == []


def test_prefix_args_that_use_only_q_k_v_are_not_rebuilt_for_fresh_outputs(
    monkeypatch, calls, cuda
):
    built: list[int | None] = []

    def builder(spec: KernelSpec, problem: Any) -> list[Any]:
        built.append(problem.q_ptr)
        b = Blob()
        b.bytes[0] = len(built)
        return [b]

    monkeypatch.setattr(launch, "_prefixes", fresh_prefixes())
    launch.register_prefix_args("simt", builder, uses=("q", "k", "v"))
    cuda.prefix_sizes = [128]
    q, k, v, o, lse = operands(SIMT)
    problem = runtime.launch(SIMT, q, k, v, o, lse, 0.3, sync=False)
    bound = runtime.get_function(SIMT).bind(problem, 1.0)
    for out in range(5):  # a fresh O and LSE every call, as flashgen.torch allocates them
        bound(0x10000, 0x20000, 0x30000, 0x90000 + out * 0x1000, 0xA0000 + out * 0x100)
    bound(0x10000, 0x20000, 0x31000, 0x90000, 0xA0000)  # v moved: rebuilt
    assert len(built) == 1 + 2  # runtime.launch's own bound, then two here
    assert [c.prefix[0][0] for c in cuda.launches] == [1, 2, 2, 2, 2, 2, 3]
    assert cuda.launches[-1].ptrs == (0x10000, 0x20000, 0x31000, 0x90000, 0xA0000)


def test_prefix_uses_must_name_pointers():
    with pytest.raises(ValueError, match=r"uses=\('q', 'x'\): name some of q, k, v, o, lse"):
        launch.register_prefix_args("simt", lambda s, p: [], uses=("q", "x"))


def test_outputs_overlapping_an_input_are_refused_before_anything_is_issued(calls, cuda):
    """runtime.launch(..., o=k, lse=<inside k>) launched: the kernel wrote O and LSE over the K
    that other blocks were still reading."""
    q, k, v, o, lse = operands(SIMT)
    inside_k = dev((2, 3, 70), np.float32, k.ptr + 4096)
    with pytest.raises(ValueError, match=r"o \(bytes .*\) overlaps k"):
        runtime.launch(SIMT, q, k, v, dev(o.shape, o.dtype, k.ptr), inside_k, None)
    with pytest.raises(ValueError, match=r"lse \(bytes .*\) overlaps k"):
        runtime.launch(SIMT, q, k, v, o, inside_k, None)
    alibi = SIMT.replace(features=("alibi",))
    with pytest.raises(ValueError, match=r"lse \(bytes .*\) overlaps alibi_slopes"):
        runtime.launch(alibi, q, k, v, o, lse, None, features=FeatureArgs(alibi=lse.ptr + 8))
    assert cuda.launches == [] and kinds(calls.log, "compile") == []
    runtime.launch(alibi, q, k, v, o, lse, None, features=FeatureArgs(alibi=0x600_0000))
    assert len(cuda.launches) == 1
