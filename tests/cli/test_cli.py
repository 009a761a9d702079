"""The `flashgen` command line through click's CliRunner: files, output, errors, exit codes.

Every test runs in an empty working directory with its own FLASHGEN_CACHE_DIR, so nothing
touches the checkout or ~/.cache. `check` and `fuzz` run against a fake checks module (the
real one needs a GPU); the GPU tier exercises the real thing.
"""

from __future__ import annotations

import dataclasses
import inspect as pyinspect
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
from _nvcc import REQUIRE_ENV, nvcc_is_required, require_nvcc, requires_nvcc
from click.testing import CliRunner, Result

import flashgen
import flashgen.verify
from flashgen.cli import app as cli
from flashgen.generator.arch import ARCHS
from flashgen.generator.cache import CubinCache, FlashgenWarning, cache_dir
from flashgen.generator.compile import CompiledKernel, CompileError
from flashgen.generator.nvcc import NvccNotFound
from flashgen.generator.render import render
from flashgen.generator.report import ResourceReport
from flashgen.generator.space import pruned, shipped
from flashgen.generator.spec import KernelSpec

REPO = Path(__file__).resolve().parents[2]
SIMT = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp32")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(autouse=True)
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cwd and a private cubin cache; returns the cwd."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FLASHGEN_HYPOTHESIS_PROFILE", raising=False)
    return cwd


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    """Invoke the CLI as a user would (standalone mode: errors become exit codes)."""
    # click < 8.2 mixes stderr into stdout unless told not to
    kw: dict[str, Any] = (
        {"mix_stderr": False}
        if "mix_stderr" in pyinspect.signature(CliRunner.__init__).parameters
        else {}
    )
    return CliRunner(**kw).invoke(cli.main, list(args), env=env, catch_exceptions=False)


def assert_one_line_error(result: Result, *needles: str, stdout: bool = False) -> str:
    """Exit 2, exactly one `error: ...` line naming every needle, stdout empty unless allowed."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    if not stdout:
        assert result.stdout == ""
    return lines[0]


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---- build --------------------------------------------------------------------------------------
def test_build_writes_only_the_named_file_into_out(sandbox: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run("build", "--d", "64", "--bc", "32", "--out", str(out), "--no-compile")
    assert result.exit_code == 0, result.output
    assert files_under(out) == [f"{SIMT.name}.cu"]
    assert files_under(sandbox) == []  # nothing in the working directory
    assert (out / f"{SIMT.name}.cu").read_text() == render(SIMT).source
    assert f"wrote {out / SIMT.name}.cu" in result.stdout


def test_build_defaults_to_generated_in_cwd(sandbox: Path) -> None:
    result = run("build", "--d", "64", "--bc", "32", "--no-compile")
    assert result.exit_code == 0, result.output
    assert files_under(sandbox) == ["generated", f"generated/{SIMT.name}.cu"]


def test_build_twice_is_byte_identical_and_leaves_the_file_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    path = out / f"{SIMT.name}.cu"
    assert run("build", "--d", "64", "--out", str(out), "--no-compile").exit_code == 0
    first, stat = path.read_bytes(), path.stat()
    second_run = run("build", "--d", "64", "--out", str(out), "--no-compile")
    assert second_run.exit_code == 0
    assert path.read_bytes() == first
    assert path.stat().st_mtime_ns == stat.st_mtime_ns  # write-if-different: not rewritten
    assert second_run.stdout.startswith("unchanged ")


def test_build_repairs_a_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{SIMT.name}.cu").write_text("// edited by hand\n")
    result = run("build", "--d", "64", "--out", str(out), "--no-compile")
    assert result.exit_code == 0
    assert result.stdout.startswith("wrote ")
    assert (out / f"{SIMT.name}.cu").read_text() == render(SIMT).source


def test_build_by_name_equals_build_by_options(tmp_path: Path) -> None:
    spec = KernelSpec(family="mma", d=128, br=128, bc=64, dtype="fp16", causal=True)
    by_opts = run(
        "build",
        "--family",
        "mma",
        "--d",
        "128",
        "--dtype",
        "fp16",
        "--causal",
        "--out",
        str(tmp_path / "a"),
        "--no-compile",
    )
    by_name = run("build", "--name", spec.name, "--out", str(tmp_path / "b"), "--no-compile")
    assert by_opts.exit_code == 0 and by_name.exit_code == 0, by_opts.output + by_name.output
    a = (tmp_path / "a" / f"{spec.name}.cu").read_bytes()
    assert a == (tmp_path / "b" / f"{spec.name}.cu").read_bytes()


def test_family_defaults_fill_unset_options() -> None:
    assert cli.spec_from_options(None, None, 64, None, None, None, None, None, None) == SIMT
    mma = cli.spec_from_options(None, "mma", 64, None, None, None, None, None, None)
    assert (mma.br, mma.bc, mma.dtype, mma.causal) == (128, 64, "bf16", False)


def test_banner_regenerate_command_rebuilds_the_same_file(tmp_path: Path) -> None:
    for spec in (
        SIMT,
        KernelSpec(family="mma", d=64, br=64, bc=32, dtype="bf16", causal=True, warps=4, stages=1),
    ):
        source = render(spec).source
        line = next(ln for ln in source.splitlines() if "Re-generate with: flashgen " in ln)
        args = line.split("flashgen ", 1)[1].split()
        result = run(*args, "--out", str(tmp_path), "--no-compile")
        assert result.exit_code == 0, result.output
        assert (tmp_path / f"{spec.name}.cu").read_text() == source


@requires_nvcc
def test_build_compiles_and_reports_resources_then_hits_the_cache(
    sandbox: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    cold = run("build", "--d", "64", "--bc", "32", "--arch", "sm_80", "--out", str(out))
    assert cold.exit_code == 0, cold.output
    assert re.search(r"compiled for sm_80 \(nvcc [\d.]+ s\): \d+ registers", cold.stdout)
    assert "spills 0 B" in cold.stdout
    warm = run("build", "--d", "64", "--bc", "32", "--arch", "sm_80", "--out", str(out))
    assert "compiled for sm_80 (cache hit)" in warm.stdout
    assert files_under(out) == [f"{SIMT.name}.cu"]
    assert files_under(sandbox) == []
    assert len(CubinCache(tmp_path / "cache").entries()) == 1


def test_build_without_nvcc_still_writes_the_source_and_says_how_to_get_nvcc(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    result = run(
        "build",
        "--d",
        "64",
        "--out",
        str(out),
        env={"FLASHGEN_NVCC": str(tmp_path / "no-such-nvcc")},
    )
    assert result.exit_code == 0, result.output
    assert (out / f"{SIMT.name}.cu").exists()
    assert "note: not compiled" in result.stderr
    assert "pip install" in result.stderr and "[nvcc]" in result.stderr
    assert "Traceback" not in result.output


def test_compile_error_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise CompileError("nvcc failed (exit 1): nvcc ...\nkernel.cu(3): error: boom")

    monkeypatch.setattr(cli, "compile_kernel", broken)
    result = run("build", "--d", "64", "--out", str(tmp_path))
    assert_one_line_error(result, "nvcc failed", "error: boom", stdout=True)


# ---- bad input: one line, exit 2, no traceback ------------------------------------------------
BAD_INPUT = {
    "mma bc not a multiple of 16": (["--family", "mma", "--d", "64", "--bc", "40"], ["bc=40"]),
    "unknown dtype": (["--d", "64", "--dtype", "fp64"], ["fp64", "--dtype"]),
    "zero head dim": (["--d", "0"], ["d=0"]),
    "unknown kernel name": (["--name", "flash_fwd_nope"], ["flash_fwd_nope"]),
    "fp32 with mma": (["--family", "mma", "--d", "64", "--dtype", "fp32"], ["dtype=fp32"]),
    "unknown family": (["--family", "wmma", "--d", "64"], ["wmma"]),
    "name plus options": (["--name", SIMT.name, "--d", "32"], ["--name", "--d"]),
    "no head dim": ([], ["--d"]),
    "not an integer": (["--d", "sixty-four"], ["sixty-four"]),
    "unknown option": (["--d", "64", "--tile", "3"], ["--tile"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
@pytest.mark.parametrize("command", ["build", "show", "inspect", "check"])
def test_bad_input_is_one_line_naming_the_value_with_exit_2(
    case: str, command: str, tmp_path: Path, sandbox: Path
) -> None:
    args, needles = BAD_INPUT[case]
    extra = ["--out", str(tmp_path / "out")] if command == "build" else []
    assert_one_line_error(run(command, *args, *extra), *needles)
    assert not (tmp_path / "out").exists()
    assert files_under(sandbox) == []


def test_bad_arch_and_unknown_command_are_one_line() -> None:
    assert_one_line_error(run("build", "--d", "64", "--arch", "sm_70"), "sm_70")
    assert_one_line_error(run("biuld", "--d", "64"), "biuld")


def test_spec_errors_list_every_broken_rule() -> None:
    line = assert_one_line_error(
        run("show", "--family", "mma", "--d", "60", "--bc", "40", "--dtype", "fp32")
    )
    for value in ("d=60", "bc=40", "dtype=fp32"):
        assert value in line


def test_unwritable_out_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_one_line_error(run("build", "--d", "64", "--out", str(blocker / "sub"), "--no-compile"))


# ---- show ---------------------------------------------------------------------------------------
def test_show_piped_prints_the_plain_source() -> None:
    result = run("show", "--d", "64", "--bc", "32")
    assert result.exit_code == 0
    assert result.stdout == render(SIMT).source
    assert "\x1b[" not in result.stdout
    assert result.stdout.startswith("// Generated by flashgen ")
    assert f"// spec: {SIMT.to_json()}" in result.stdout


def test_show_on_a_terminal_is_highlighted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_stdout_is_terminal", lambda: True)
    result = run("show", "--d", "64", "--bc", "32")
    assert result.exit_code == 0
    assert "\x1b[" in result.stdout
    plain = ANSI.sub("", result.stdout)
    assert plain.rstrip("\n") == render(SIMT).source.rstrip("\n")  # no line cropped or wrapped


# ---- list ---------------------------------------------------------------------------------------
def _table_names(stdout: str) -> list[str]:
    return [ln.split()[0] for ln in stdout.splitlines() if ln.startswith("flash_fwd_")]


@pytest.mark.parametrize("family", [None, *sorted({s.family for s in shipped()})])
def test_list_prints_every_shipped_variant_and_the_count(family: str | None) -> None:
    result = run("list", *(["--family", family] if family else []))
    assert result.exit_code == 0
    specs = shipped(family)
    assert _table_names(result.stdout) == [s.name for s in specs]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{len(specs)} shipped variants")
    assert "pruned" not in result.stdout


def test_list_columns_show_the_derived_sizes() -> None:
    result = run("list", "--family", "simt")
    header = result.stdout.splitlines()[0].split()
    assert header == [
        "name",
        "d",
        "br",
        "bc",
        "dtype",
        "causal",
        "warps",
        "stages",
        "threads",
        "smem",
    ]
    spec = shipped("simt")[0]
    row = next(ln for ln in result.stdout.splitlines() if ln.startswith(spec.name + " "))
    assert row.split()[-2:] == [str(spec.threads), str(spec.smem_bytes)]


def test_list_all_adds_pruned_points_with_their_reasons() -> None:
    result = run("list", "--all")
    assert result.exit_code == 0
    assert pruned(), "some family prunes part of its product (else --all shows nothing new)"
    for family in sorted({s.family for s in shipped()}):
        points = pruned(family)
        assert f"pruned {family} ({len(points)}):" in result.stdout
        for p in points:
            assert f"  {p.label}: {'; '.join(p.reasons)}" in result.stdout
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{len(shipped())} shipped variants")
    assert last.endswith(f", {len(pruned())} pruned")


# ---- inspect ------------------------------------------------------------------------------------
@requires_nvcc
def test_inspect_reports_resources_budget_and_occupancy() -> None:
    result = run("inspect", "--d", "64", "--bc", "32", "--arch", "sm_80")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith(f"{SIMT.name}  (sm_80, ")
    assert re.search(r"registers +\d+ per thread", out)
    limit = f"{ARCHS['sm_80'].smem_per_block:,} B per block"
    assert f"{SIMT.smem_bytes:,} B dynamic" in out and limit in out
    assert "spills         0 B" in out
    assert re.search(r"occupancy +\d+ blocks? = \d+ of 64 warps per SM", out)


@requires_nvcc
def test_inspect_json_is_consistent_with_the_spec_and_arch() -> None:
    result = run("inspect", "--d", "64", "--bc", "32", "--arch", "sm_90", "--json")
    assert result.exit_code == 0, result.output
    rep = json.loads(result.stdout)
    assert rep["name"] == SIMT.name and rep["arch"] == "sm_90"
    assert KernelSpec(**rep["spec"]) == SIMT
    assert rep["threads"] == SIMT.threads
    assert rep["smem"]["dynamic"] == SIMT.smem_bytes
    assert rep["smem"]["limit_per_block"] == ARCHS["sm_90"].smem_per_block
    assert rep["spill_stores"] == rep["spill_loads"] == 0
    occ = rep["occupancy"]
    assert occ["blocks_per_sm"] == min(occ["blocks_by"].values()) >= 1
    assert occ["warps_per_sm"] == occ["blocks_per_sm"] * SIMT.threads // 32
    assert rep["registers"] == occ["registers"] > 0


def test_inspect_without_nvcc_is_one_line(tmp_path: Path) -> None:
    result = run("inspect", "--d", "64", env={"FLASHGEN_NVCC": str(tmp_path / "none")})
    assert_one_line_error(result, "FLASHGEN_NVCC")


# ---- cache --------------------------------------------------------------------------------------
def test_cache_info_and_clear(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    CubinCache(root).put("ab" * 32, b"\0" * 100, {"name": "k"})
    info = run("cache", "info")
    assert info.exit_code == 0
    assert f"dir      {root}" in info.stdout
    assert "entries  1" in info.stdout
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert size > 100 and f"bytes    {size:,}" in info.stdout
    cleared = run("cache", "clear")
    assert cleared.exit_code == 0 and f"removed 1 entries from {root}" in cleared.stdout
    assert CubinCache(root).entries() == []
    assert "entries  0" in run("cache", "info").stdout


def test_cache_clear_also_clears_the_fallback_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache used while FLASHGEN_CACHE_DIR was unusable was left behind by `cache clear`."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(FlashgenWarning):
        fallback = cache_dir()
    assert fallback == tmp / f"flashgen-cache-{os.getuid()}"
    CubinCache(fallback).put("ab" * 32, b"\x7fELF", {})
    result = run("cache", "clear")
    assert result.exit_code == 0, result.output
    assert f"removed 1 entries from {fallback}" in result.stdout
    assert not fallback.exists()


# ---- what `build` compares its output with -------------------------------------------------------
def _build_in_a_process(out: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`flashgen build --no-compile` in a process of its own, at most 60 s and 2 GiB."""

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    env = {**os.environ, "PYTHONPATH": str(REPO), "FLASHGEN_CACHE_DIR": str(tmp_path / "c")}
    try:
        return subprocess.run(
            [sys.executable, "-m", "flashgen", "build", "--d", "64", "--bc", "32", "--out",
             str(out), "--no-compile"],
            env=env, capture_output=True, text=True, timeout=60, preexec_fn=limit_memory,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("build hung on the file at its output path")


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-dev-zero"])
def test_build_never_reads_a_special_file_at_its_output_path(tmp_path: Path, kind: str) -> None:
    """The reported bug: `build` read the existing output file with no limit; a FIFO there hung
    it, a symlink to /dev/zero ran it out of memory. Only a regular file is compared."""
    out = tmp_path / "out"
    out.mkdir()
    path = out / f"{SIMT.name}.cu"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    result = _build_in_a_process(out, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {path} ")
    assert path.is_file() and not path.is_symlink()
    assert path.read_text() == render(SIMT).source


def test_the_compile_line_reports_waiting_apart_from_nvcc_time() -> None:
    """The reported bug: 27 s spent waiting for another process's lock read "nvcc 27.0 s"."""
    rep = ResourceReport("sm_90", 40, 0, 0, 0, 0)
    waited = CompiledKernel(SIMT, "sm_90", b"", rep, False, nvcc_seconds=1.25, waited_seconds=27)
    assert "(nvcc 1.2 s, after waiting 27.0 s for another build of it)" in (
        cli._describe_compile(waited)
    )
    hit = CompiledKernel(SIMT, "sm_90", b"", rep, True, waited_seconds=27)
    assert "(cache hit, after waiting 27.0 s for another build of it)" in cli._describe_compile(hit)
    alone = CompiledKernel(SIMT, "sm_90", b"", rep, False, nvcc_seconds=3.0)
    assert "(nvcc 3.0 s)" in cli._describe_compile(alone)


# ---- check and fuzz, against a fake checks module ---------------------------------------------
class FakeGpuUnavailable(RuntimeError):
    """Stands in for checks.GpuUnavailable."""


@dataclasses.dataclass
class FakeCheckResult:
    spec: KernelSpec
    b: int
    h: int
    tq: int
    tk: int
    o_err: float
    o_bound: float
    lse_err: float
    lse_bound: float
    has_nan: bool
    passed: bool
    scale: float
    seed: int


@dataclasses.dataclass
class FakeVariantResult:
    spec: KernelSpec
    examples: int
    worst_ratio: float
    passed: bool
    failure: str | None


@pytest.fixture
def fake_checks(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """Install a fake `flashgen.verify.checks`; tests set `.check` / `.fuzz` behaviour."""
    state = types.SimpleNamespace(calls=[], check=None, fuzz=None)
    mod = types.ModuleType("flashgen.verify.checks")

    def check_variant(spec: KernelSpec, **kw: Any) -> FakeCheckResult:
        state.calls.append((spec, kw))
        result: FakeCheckResult = state.check(spec, **kw)
        return result

    def run_fuzz(
        family: str | None,
        examples: int | None,
        profile: str | None,
        progress: Callable[[FakeVariantResult], None] | None = None,
    ) -> list[FakeVariantResult]:
        state.calls.append((family, examples, profile))
        results: list[FakeVariantResult] = state.fuzz(family, examples, profile)
        for r in results:
            if progress is not None:
                progress(r)
        return results

    mod.check_variant = check_variant  # type: ignore[attr-defined]
    mod.run_fuzz = run_fuzz  # type: ignore[attr-defined]
    mod.GpuUnavailable = FakeGpuUnavailable  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashgen.verify.checks", mod)
    monkeypatch.setattr(flashgen.verify, "checks", mod, raising=False)
    return state


def _result(spec: KernelSpec, o_err: float = 1e-7, nan: bool = False, **kw: Any) -> FakeCheckResult:
    o_bound, lse_err, lse_bound = 1e-5, 2e-6, 1e-4
    passed = o_err <= o_bound and lse_err <= lse_bound and not nan
    scale = kw["scale"] if kw["scale"] is not None else spec.d**-0.5
    return FakeCheckResult(
        spec,
        kw["b"],
        kw["h"],
        kw["tq"],
        kw["tk"],
        o_err,
        o_bound,
        lse_err,
        lse_bound,
        nan,
        passed,
        scale,
        kw["seed"],
    )


def test_check_pass_prints_errors_and_bounds(fake_checks: types.SimpleNamespace) -> None:
    fake_checks.check = _result
    result = run(
        "check",
        "--d",
        "64",
        "--bc",
        "32",
        "--b",
        "3",
        "--h",
        "5",
        "--tq",
        "7",
        "--tk",
        "11",
        "--seed",
        "9",
    )
    assert result.exit_code == 0, result.output
    assert fake_checks.calls == [
        (SIMT, {"b": 3, "h": 5, "tq": 7, "tk": 11, "seed": 9, "scale": None})
    ]
    assert result.stdout.startswith(f"{SIMT.name}  b=3 h=5 tq=7 tk=11 scale=0.125 seed=9\n")
    assert "O    error 1.000e-07   bound 1.000e-05   ok" in result.stdout
    assert "LSE  error 2.000e-06   bound 1.000e-04   ok" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "PASS"


def test_check_defaults_are_a_ragged_problem(fake_checks: types.SimpleNamespace) -> None:
    fake_checks.check = _result
    assert run("check", "--d", "64", "--scale", "0.5").exit_code == 0
    assert fake_checks.calls[0][1] == {
        "b": 2,
        "h": 4,
        "tq": 257,
        "tk": 300,
        "seed": 0,
        "scale": 0.5,
    }


@pytest.mark.parametrize("bad", [{"o_err": 1.0}, {"nan": True}])
def test_check_failure_exits_1(fake_checks: types.SimpleNamespace, bad: dict[str, Any]) -> None:
    fake_checks.check = lambda spec, **kw: _result(spec, **bad, **kw)
    result = run("check", "--d", "64")
    assert result.exit_code == 1
    assert result.stdout.strip().splitlines()[-1] == "FAIL"
    assert ("TOO LARGE" in result.stdout) or ("NaN  FOUND" in result.stdout)


def test_check_without_gpu_is_one_line(fake_checks: types.SimpleNamespace) -> None:
    def no_gpu(spec: KernelSpec, **kw: Any) -> FakeCheckResult:
        raise FakeGpuUnavailable(
            "no CUDA GPU: pycuda is not installed; pip install 'flashgen[gpu]'"
        )

    fake_checks.check = no_gpu
    assert_one_line_error(run("check", "--d", "64"), "no CUDA GPU")


def test_check_rejects_a_bad_problem_size(fake_checks: types.SimpleNamespace) -> None:
    assert_one_line_error(run("check", "--d", "64", "--tq", "0"), "--tq", "0")
    assert fake_checks.calls == []


def _oracle_execute(error: float) -> Callable[..., tuple[Any, Any]]:
    """A CPU stand-in for the GPU launch: the float64 oracle, rounded, plus `error` on O."""
    from flashgen.verify.oracle import reference

    def execute(
        spec: KernelSpec, q: Any, k: Any, v: Any, scale: float, *layouts: Any, **feats: Any
    ) -> tuple[Any, Any]:  # layouts: the case's tensor layouts (the oracle needs none)
        o, lse = reference(q, k, v, causal=spec.causal, scale=scale, **feats)
        return (o + error).astype(q.dtype), lse.astype("float32")

    return execute


@pytest.mark.parametrize(("error", "code", "verdict"), [(0.0, 0, "PASS"), (0.05, 1, "FAIL")])
def test_check_through_the_real_checks_module(
    monkeypatch: pytest.MonkeyPatch, error: float, code: int, verdict: str
) -> None:
    from flashgen.verify import checks

    monkeypatch.setattr(checks, "gpu_execute", _oracle_execute(error))
    result = run("check", "--d", "32", "--dtype", "bf16", "--causal", "--tq", "33", "--tk", "17")
    assert result.exit_code == code, result.output
    assert result.stdout.strip().splitlines()[-1] == verdict


def _fuzz_results(
    family: str | None, examples: int | None, profile: str | None, fail: bool = False
) -> list[FakeVariantResult]:
    """One result per shipped variant, as the real run_fuzz returns; the second fails if asked."""
    n = examples or 25
    out = [FakeVariantResult(s, n, 0.25, True, None) for s in shipped(family)]
    if fail:
        out[1] = FakeVariantResult(
            out[1].spec, 4, 7.5, False, "tq=5 tk=1: O error 3e-2 > bound\nfalsifying example ..."
        )
    return out


def test_fuzz_passes_options_through_and_prints_a_table(
    fake_checks: types.SimpleNamespace,
) -> None:
    fake_checks.fuzz = _fuzz_results
    result = run("fuzz", "--family", "simt", "--examples", "7", "--profile", "ci")
    assert result.exit_code == 0, result.output
    assert fake_checks.calls == [("simt", 7, "ci")]
    specs = shipped("simt")
    for s in specs:
        assert re.search(rf"^{s.name} +7 +0\.250 +pass$", result.stdout, re.M)
    assert f"{len(specs)} variants, {len(specs)} passed, 0 failed (profile ci)" in result.stdout
    # not a terminal: one progress line per variant on stderr, stdout stays the table
    progress = result.stderr.splitlines()
    assert len(progress) == len(specs)
    assert progress[2] == (
        f"[3/{len(specs)}] pass {specs[2].name} (7 examples, worst err/bound 0.250)"
    )


def test_fuzz_failure_exits_1_and_names_the_variant(fake_checks: types.SimpleNamespace) -> None:
    fake_checks.fuzz = lambda f, n, p: _fuzz_results(f, n, p, fail=True)
    result = run("fuzz", "--examples", "4")
    assert result.exit_code == 1
    bad = shipped()[1].name
    assert re.search(rf"^{bad} +4 +7\.500 +FAIL$", result.stdout, re.M)
    assert f"FAIL {bad}: tq=5 tk=1: O error 3e-2 > bound falsifying example ..." in result.stdout
    assert "1 failed" in result.stdout
    assert f"[2/{len(shipped())}] FAIL {bad} (4 examples, worst err/bound 7.500)" in result.stderr


def test_fuzz_profile_defaults_to_dev_and_follows_the_environment(
    fake_checks: types.SimpleNamespace,
) -> None:
    fake_checks.fuzz = _fuzz_results
    assert run("fuzz").exit_code == 0
    assert run("fuzz", env={"FLASHGEN_HYPOTHESIS_PROFILE": "thorough"}).exit_code == 0
    assert [c[2] for c in fake_checks.calls] == ["dev", "thorough"]
    assert fake_checks.calls[0][:2] == (None, None)  # None: the profile's example count


def test_fuzz_bad_options_and_no_gpu_exit_2(fake_checks: types.SimpleNamespace) -> None:
    assert_one_line_error(run("fuzz", "--profile", "fast"), "fast")
    assert_one_line_error(run("fuzz", "--examples", "0"), "--examples")

    def no_gpu(*args: Any) -> list[FakeVariantResult]:
        raise FakeGpuUnavailable("no CUDA device found")

    fake_checks.fuzz = no_gpu
    assert_one_line_error(run("fuzz"), "no CUDA device found")


# ---- help, version, entry points ----------------------------------------------------------------
def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            paths += _command_paths(cmd, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


@pytest.mark.parametrize("path", _command_paths(cli.main), ids=lambda p: " ".join(p) or "main")
def test_every_help_shows_an_example(path: tuple[str, ...]) -> None:
    result = run(*path, "--help")
    assert result.exit_code == 0
    assert "Example" in result.stdout
    assert re.search(r"^\s+flashgen \w", result.stdout, re.M)


def test_commands_exist() -> None:
    assert set(cli.main.commands) == {
        "build", "bundle", "show", "list", "inspect", "cache", "check", "fuzz", "bench", "tune"
    }  # fmt: skip


def test_version() -> None:
    result = run("--version")
    assert (
        result.exit_code == 0
        and result.stdout.strip() == f"flashgen, version {flashgen.__version__}"
    )


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
        timeout=120,
    )


def test_python_m_flashgen_help() -> None:
    proc = _python("-m", "flashgen", "--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("build", "show", "list", "inspect", "check", "fuzz", "cache"):
        assert re.search(rf"^\s+{command}\s", proc.stdout, re.M), command


def test_python_m_flashgen_error_is_one_line_without_traceback() -> None:
    proc = _python("-m", "flashgen", "show", "--d", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: d=0:") and len(proc.stderr.splitlines()) == 1


def test_import_flashgen_needs_no_gpu_stack() -> None:
    proc = _python(
        "-c",
        "import sys, flashgen; "
        "print(sorted(m for m in ('pycuda', 'flashgen.api') if m in sys.modules))",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_public_api() -> None:
    from flashgen.api import attention

    for name in flashgen.__all__:
        assert getattr(flashgen, name) is not None, name
    assert flashgen.attention is attention  # served lazily by the module's __getattr__
    assert flashgen.render(SIMT).source == render(SIMT).source
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = flashgen.nope


# ---- the nvcc helper the other test modules reuse ------------------------------------------------
@pytest.mark.parametrize("required", [False, True])
def test_require_nvcc_skips_or_fails_without_nvcc(
    monkeypatch: pytest.MonkeyPatch, required: bool
) -> None:
    import _nvcc

    def missing() -> Path:
        raise NvccNotFound("nvcc not found")

    monkeypatch.setattr(_nvcc, "find_nvcc", missing)
    if required:
        monkeypatch.setenv(REQUIRE_ENV, "1")
    else:
        monkeypatch.delenv(REQUIRE_ENV, raising=False)
    assert nvcc_is_required() is required
    outcome = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(outcome, match="nvcc not found"):
        require_nvcc()
