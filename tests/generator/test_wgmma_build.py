"""The wgmma family from the command line on a machine with no GPU: built for sm_90a."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from flashgen.cli import main
from flashgen.generator.compile import compile_kernel
from flashgen.generator.spec import KernelSpec

SPEC = KernelSpec(family="wgmma", d=64, br=128, bc=64, dtype="bf16", causal=True)


def test_no_gpu_and_no_arch_compiles_wgmma_for_sm_90a(
    nvcc_required: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLASHGEN_ARCH", raising=False)
    monkeypatch.setattr("flashgen.generator.compile.local_arch", lambda: None)
    ck = compile_kernel(SPEC)
    assert ck.arch == "sm_90a" and ck.report.spill_stores == 0


def test_an_sm_90_gpu_compiles_wgmma_for_its_a_twin(
    nvcc_required: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("flashgen.generator.compile.local_arch", lambda: "sm_90")
    assert compile_kernel(SPEC).arch == "sm_90a"


def test_build_wgmma_without_arch_succeeds(nvcc_required: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main,
        ["build", "--family", "wgmma", "--d", "64", "--br", "128", "--bc", "64",
         "--dtype", "bf16", "--causal", "--out", str(tmp_path)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "sm_90a" in res.output
    assert (tmp_path / f"{SPEC.name}.cu").exists()


def test_wgmma_for_sm_80_is_refused_in_one_line(nvcc_required: Path, tmp_path: Path) -> None:
    args = ["build", "--name", SPEC.name, "--arch", "sm_80", "--out", str(tmp_path)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: arch=sm_80: family wgmma runs on sm_90a only; choose another --arch or "
        "another --family"
    ]
