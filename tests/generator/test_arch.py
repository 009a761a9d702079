"""Every GPU: the arch table, and which arch the runtime compiles a family for on each GPU."""

from __future__ import annotations

import pytest

from flashgen.generator.arch import ARCHS, arch_info
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.runtime.launch import GpuUnavailable

SIMT = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp32")
MMA = KernelSpec(family="mma", d=64, br=64, bc=32, dtype="fp16")


@pytest.mark.parametrize(
    ("arch", "smem_per_block", "threads", "blocks"),
    [
        ("sm_80", 163 * 1024, 2048, 32),
        ("sm_86", 99 * 1024, 1536, 16),
        ("sm_89", 99 * 1024, 1536, 24),
        ("sm_90", 227 * 1024, 2048, 32),
        ("sm_100", 227 * 1024, 2048, 32),
        ("sm_120", 99 * 1024, 1536, 32),
    ],
)
def test_the_arch_table_has_each_gpus_limits(
    arch: str, smem_per_block: int, threads: int, blocks: int
) -> None:
    info = arch_info(arch)
    assert (info.smem_per_block, info.max_threads_per_sm, info.max_blocks_per_sm) == (
        smem_per_block, threads, blocks,
    )  # fmt: skip
    assert info.gencode == f"-gencode=arch=compute_{arch[3:]},code={arch}"


@pytest.mark.parametrize("device", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"])
@pytest.mark.parametrize("spec", [SIMT, MMA], ids=["simt", "mma"])
def test_the_runtime_compiles_for_the_gpu_actually_present(
    monkeypatch: pytest.MonkeyPatch, device: str, spec: KernelSpec
) -> None:
    monkeypatch.delenv("FLASHGEN_ARCH", raising=False)
    monkeypatch.setattr(runtime, "device_arch", lambda: device)
    assert runtime.kernel_arch(spec) == device


def test_a_gpu_missing_from_the_table_gets_the_newest_arch_of_its_major(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLASHGEN_ARCH", raising=False)
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_87")
    assert "sm_87" not in ARCHS
    assert runtime.kernel_arch(SIMT) == "sm_80"


def test_a_family_that_cannot_run_on_this_gpu_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLASHGEN_ARCH", raising=False)
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_75")
    with pytest.raises(GpuUnavailable) as info:
        runtime.kernel_arch(SIMT)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("arch=sm_75: family simt runs on sm_80 or newer only")


def test_an_arch_specific_family_gets_its_a_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    wgmma = shipped("wgmma")
    if not wgmma:
        pytest.skip("no wgmma variant is shipped yet")
    monkeypatch.delenv("FLASHGEN_ARCH", raising=False)
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_90")
    assert runtime.kernel_arch(wgmma[0]) == "sm_90a"
    monkeypatch.setattr(runtime, "device_arch", lambda: "sm_86")
    with pytest.raises(GpuUnavailable, match="arch=sm_86: family wgmma runs on sm_90a only"):
        runtime.kernel_arch(wgmma[0])
