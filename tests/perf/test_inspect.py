"""`flashgen inspect`: the SASS instruction mix and the traffic model on top of the ptxas report.

The cubins compile once per module (a shared cache directory). SASS comes from a fake
cuobjdump printing canned text (always runs), and from the real one when it is installed
(`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`; skipped otherwise).
"""

from __future__ import annotations

import inspect as pyinspect
import json
import stat
from pathlib import Path
from typing import Any

import pytest
from _nvcc import requires_nvcc
from click.testing import CliRunner, Result

from flashgen.cli import app as cli
from flashgen.generator.spec import KernelSpec
from flashgen.perf.sass import INSTALL_HINT, SassUnavailable, find_cuobjdump
from flashgen.perf.traffic import traffic_report
from perf.test_sass import MMA_SASS

SIMT = ["--d", "64", "--bc", "32"]
MMA = ["--family", "mma", "--d", "64", "--br", "64", "--bc", "64", "--warps", "4", "--stages", "1"]
MMA_SPEC = KernelSpec(family="mma", d=64, br=64, bc=64, dtype="bf16", warps=4, stages=1)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cubins")


@pytest.fixture(autouse=True)
def env(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(cache_dir))
    monkeypatch.delenv("FLASHGEN_CUOBJDUMP", raising=False)


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    kw: dict[str, Any] = (
        {"mix_stderr": False}
        if "mix_stderr" in pyinspect.signature(CliRunner.__init__).parameters
        else {}
    )
    return CliRunner(**kw).invoke(cli.main, list(args), env=env, catch_exceptions=False)


def fake_cuobjdump(folder: Path, text: str) -> Path:
    canned = folder / "canned.sass"
    canned.write_text(text)
    tool = folder / "cuobjdump"
    tool.write_text(f"#!/bin/sh\ncat {canned}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


@requires_nvcc
def test_without_cuobjdump_the_report_says_how_to_get_it_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    result = run("inspect", *SIMT, "--arch", "sm_90", env={"FLASHGEN_CUOBJDUMP": str(tmp_path)})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "registers" in out and "occupancy" in out  # the ptxas part is still there
    assert "SASS           not available: FLASHGEN_CUOBJDUMP=" in out
    assert f"for the instruction mix: {INSTALL_HINT}" in out
    assert "traffic model  B=1 H=16 Tq=8192 Tk=8192 d=64 fp32" in out
    assert "seed order" in out


@requires_nvcc
def test_sass_section_from_cuobjdump_output(tmp_path: Path) -> None:
    tool = fake_cuobjdump(tmp_path, MMA_SASS)
    result = run("inspect", *MMA, "--arch", "sm_90", env={"FLASHGEN_CUOBJDUMP": str(tool)})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "    tensor-core math: yes (2 HMMA)" in lines
    assert any(ln.split()[:2] == ["LDSM", "2"] for ln in lines)


@requires_nvcc
def test_json_carries_sass_and_the_traffic_model_for_the_given_lengths(tmp_path: Path) -> None:
    tool = fake_cuobjdump(tmp_path, MMA_SASS)
    result = run(
        "inspect", *MMA, "--arch", "sm_90", "--json", "--tq", "1000", "--tk", "3000", "--h", "8",
        env={"FLASHGEN_CUOBJDUMP": str(tool)},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rep = json.loads(result.stdout)
    assert KernelSpec(**rep["spec"]) == MMA_SPEC
    assert rep["sass"]["available"] and rep["sass"]["groups"]["HMMA"] == 2
    assert rep["sass"]["verdict"] == "tensor-core math: yes (2 HMMA)"
    assert rep["traffic"] == json.loads(
        json.dumps(traffic_report(MMA_SPEC, b=1, h=8, tq=1000, tk=3000))
    )
    assert rep["traffic"]["flops"] == 4 * 8 * 1000 * 3000 * 64
    assert set(rep["traffic"]["orders"]) == {"flashgen", "seed", "ideal"}


@requires_nvcc
def test_json_without_cuobjdump_has_the_reason_and_hint(tmp_path: Path) -> None:
    result = run("inspect", *SIMT, "--json", env={"FLASHGEN_CUOBJDUMP": str(tmp_path / "missing")})
    assert result.exit_code == 0, result.output
    sass = json.loads(result.stdout)["sass"]
    assert sass == {
        "available": False,
        "reason": f"FLASHGEN_CUOBJDUMP={tmp_path / 'missing'}: no such file; point it at a "
        "cuobjdump binary",
        "hint": INSTALL_HINT,
    }


def test_a_zero_length_is_one_usage_line() -> None:
    result = run("inspect", *SIMT, "--tk", "0")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1


def _real_cuobjdump() -> Path:
    try:
        return find_cuobjdump()
    except SassUnavailable as exc:
        pytest.skip(f"needs cuobjdump + nvdisasm ({INSTALL_HINT}): {exc}")


@requires_nvcc
@pytest.mark.parametrize(("args", "tensor_core"), [(SIMT, False), (MMA, True)], ids=["simt", "mma"])
def test_real_sass_tells_tensor_cores_from_cuda_cores(args: list[str], tensor_core: bool) -> None:
    _real_cuobjdump()
    result = run("inspect", *args, "--arch", "sm_90", "--json")
    assert result.exit_code == 0, result.output
    sass = json.loads(result.stdout)["sass"]
    assert sass["available"], sass
    groups = sass["groups"]
    assert sass["archs"] == ["sm_90"] and sass["tensor_core"] is tensor_core
    if tensor_core:  # mma.sync, ldmatrix and cp.async all in the binary
        assert groups["HMMA"] > 0 and groups["LDSM"] > 0 and groups["LDGSTS"] > 0
        assert sass["verdict"] == f"tensor-core math: yes ({groups['HMMA']} HMMA)"
    else:
        assert groups["HMMA"] == groups["HGMMA"] == 0 and groups["FFMA"] > 0
        assert sass["verdict"].startswith("tensor-core math: no: CUDA-core FFMA")
    assert groups["MUFU.EX2"] > 0  # exp2 on the SFU in both families


# ---- wgmma: the setmaxnreg split between the producer and the consumer warpgroups -----------
WGMMA = ["--family", "wgmma", "--d", "64", "--br", "128", "--bc", "64", "--stages", "2"]
WGMMA_SPEC = KernelSpec(family="wgmma", d=64, br=128, bc=64, dtype="bf16", stages=2)


@requires_nvcc
def test_wgmma_report_shows_the_register_split_next_to_the_ptxas_count(tmp_path: Path) -> None:
    from flashgen.generator.families import WGMMA_REGS, WgmmaFamily, family_of

    fam = family_of("wgmma")
    assert isinstance(fam, WgmmaFamily)
    assert fam.register_split(WGMMA_SPEC) == WGMMA_REGS[2] == (24, 240)
    no_sass = {"FLASHGEN_CUOBJDUMP": str(tmp_path / "missing")}
    result = run("inspect", *WGMMA, "--json", env=no_sass)
    assert result.exit_code == 0, result.output
    rep = json.loads(result.stdout)
    assert rep["arch"] == "sm_90a" and KernelSpec(**rep["spec"]) == WGMMA_SPEC
    regs = rep["registers"]
    assert 0 < regs <= 65536 // 384  # launch_bounds(384, 1)
    split = rep["register_split"]
    assert split == {
        "producer": 24, "consumer": 240, "consumers": 2, "warpgroup_threads": 128,
        "launch_registers": regs, "split_total": 128 * (24 + 2 * 240),
        "launch_total": 384 * regs, "fits": 384 * regs >= 128 * (24 + 2 * 240),
    }  # fmt: skip
    assert split["fits"], "the consumers' setmaxnreg.inc could never be granted"
    lines = run("inspect", *WGMMA, env=no_sass).stdout.splitlines()
    i = lines.index(f"  registers      {regs} per thread (ptxas; every thread at launch)")
    assert lines[i + 1] == (
        "    setmaxnreg   producer warpgroup 24, 2 consumer warpgroups 240 each "
        "(registers per thread)"
    )
    assert lines[i + 2] == f"      128*(24 + 2*240) = 64,512 of the {384 * regs:,} the launch holds"


@requires_nvcc
def test_other_families_have_no_register_split(tmp_path: Path) -> None:
    result = run("inspect", *MMA, "--json", env={"FLASHGEN_CUOBJDUMP": str(tmp_path / "x")})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["register_split"] is None
    text = run("inspect", *MMA, env={"FLASHGEN_CUOBJDUMP": str(tmp_path / "x")}).stdout
    assert "setmaxnreg" not in text and "(ptxas; every thread at launch)" not in text


def test_a_split_larger_than_the_launch_is_flagged() -> None:
    from flashgen.cli.app import _format_split
    from flashgen.perf.occupancy import register_split

    ok = register_split(producer=24, consumer=240, consumers=2, launch_registers=168)
    assert ok.fits and ok.split_total == ok.launch_total == 64512
    short = register_split(producer=24, consumer=240, consumers=2, launch_registers=160)
    assert not short.fits and short.launch_total == 61440
    (_, verdict) = _format_split(short.to_dict())
    assert "64,512 > the 61,440 the launch holds: setmaxnreg.inc would wait forever" in verdict
    with pytest.raises(ValueError, match="consumer registers=250: setmaxnreg takes a multiple"):
        register_split(producer=24, consumer=250, consumers=2, launch_registers=168)
    with pytest.raises(ValueError, match="producer registers=16"):
        register_split(producer=16, consumer=240, consumers=2, launch_registers=168)


@requires_nvcc
def test_real_sass_of_a_wgmma_kernel_counts_hgmma() -> None:
    _real_cuobjdump()
    result = run("inspect", *WGMMA, "--json")
    assert result.exit_code == 0, result.output
    rep = json.loads(result.stdout)
    sass = rep["sass"]
    assert sass["available"] and sass["archs"] == ["sm_90a"], sass
    assert sass["groups"]["HGMMA"] > 0 and sass["groups"]["HMMA"] == 0
    assert sass["verdict"] == f"tensor-core math: yes ({sass['groups']['HGMMA']} HGMMA)"
    assert rep["register_split"]["consumer"] == 240
