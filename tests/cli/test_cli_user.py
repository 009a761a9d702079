"""The CLI as a user meets it: one line and exit 2 for every mistake, no Python wording,
defaults that fit, repeated options refused, Ctrl-C, warnings, every GPU arch, file modes.

Reuses test_cli's runner and sandbox (an empty cwd and a private cache per test).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

import click
import pytest
from _nvcc import requires_nvcc

import flashgen
from cli.test_cli import assert_one_line_error, files_under, run, sandbox  # noqa: F401
from flashgen.cli import app as cli
from flashgen.cli import perf as cli_perf
from flashgen.generator.cache import CubinCache, cache_key
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.perf import bench as bench_mod


# ---- defaults that fit, and the knobs ---------------------------------------------------------
@pytest.mark.parametrize("family", ["mma", "wgmma"])
def test_a_family_with_only_d_gets_a_shipped_variant_that_fits(family: str, tmp_path: Path) -> None:
    if not shipped(family):
        pytest.skip(f"family {family} ships nothing yet")
    for d in sorted({s.d for s in shipped(family)}):
        result = run("build", "--family", family, "--d", str(d), "--no-compile",
                     "--out", str(tmp_path))  # fmt: skip
        assert result.exit_code == 0, (d, result.output)
        assert "not a shipped variant" not in result.stderr
        [name] = re.findall(r"wrote \S+/(\S+)\.cu", result.stdout)
        assert KernelSpec.from_name(name) in set(shipped(family))


def test_mma_d256_without_tiles_is_a_shipped_variant_not_an_error(tmp_path: Path) -> None:
    result = run("show", "--family", "mma", "--d", "256")
    assert result.exit_code == 0, result.output
    name = re.search(r"flash_fwd_mma_d256_\w+", result.stdout)
    assert name is not None and KernelSpec.from_name(name.group()) in set(shipped("mma"))


def test_the_usual_defaults_are_unchanged() -> None:
    assert "flash_fwd_simt_d64_br32_bc32_fp32_noncausal" in run("show", "--d", "64").stdout
    out = run("show", "--family", "mma", "--d", "128").stdout
    assert "flash_fwd_mma_d128_br128_bc64_bf16_noncausal" in out


@pytest.mark.parametrize("option", ["--warps", "--stages"])
def test_zero_warps_or_stages_is_refused_like_zero_br(option: str) -> None:
    assert_one_line_error(run("show", "--family", "mma", "--d", "64", option, "0"), option, "0")


@pytest.mark.parametrize(
    "args",
    [
        ["--d", "64", "--d", "128"],
        ["--d", "64", "--br", "16", "--br", "32"],
        ["--d", "64", "--causal", "--no-causal"],
        ["--d", "64", "--family", "simt", "--family", "mma"],
        ["--d", "64", "--arch", "sm_80", "--arch", "sm_90"],
    ],
)
def test_a_repeated_option_is_refused_not_silently_the_last(args: list[str]) -> None:
    opt = args[-2]
    line = assert_one_line_error(run("build", *args, "--no-compile"), "given 2 times", opt)
    assert "give it once" in line


def test_building_an_unshipped_variant_says_so(tmp_path: Path) -> None:
    result = run("build", "--d", "48", "--no-compile", "--out", str(tmp_path))
    assert result.exit_code == 0
    spec = KernelSpec(family="simt", d=48, br=32, bc=32)
    assert spec not in set(shipped())
    assert f"note: {spec.name} is not a shipped variant" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    shipped_one = run("build", "--d", "64", "--no-compile", "--out", str(tmp_path))
    assert shipped_one.stderr == ""


# ---- the public API ---------------------------------------------------------------------------
def test_gpu_unavailable_is_exported() -> None:
    from flashgen.runtime import gpu as runtime
    from flashgen.verify import checks

    assert "GpuUnavailable" in flashgen.__all__
    assert flashgen.GpuUnavailable is runtime.GpuUnavailable is checks.GpuUnavailable


# ---- operating-system errors, Ctrl-C, warnings -------------------------------------------------
def test_os_errors_are_described_without_python_wording(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = assert_one_line_error(
        run("build", "--d", "64", "--out", str(blocker / "sub"), "--no-compile")
    )
    assert "[Errno" not in line and "Errno" not in line and "'" not in line
    assert str(blocker) in line and "a part of the path is a file, not a folder" in line


@pytest.mark.parametrize("where", ["command", "click"])
def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if where == "click":
            raise click.Abort() from KeyboardInterrupt()
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "render", interrupted)
    result = run("show", "--d", "64")
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted"


def test_the_unwritable_cache_warning_is_one_line_with_the_right_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nvcc_required: Path
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = run("build", "--d", "16", "--br", "16", "--bc", "16", "--arch", "sm_80",
                 "--out", str(tmp_path / "out"),
                 env={"FLASHGEN_CACHE_DIR": str(blocker / "cache")})  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    warnings_ = [ln for ln in lines if ln.startswith("warning: ")]
    assert len(warnings_) == 1, lines
    assert "UserWarning" not in result.stderr and "warnings.warn" not in result.stderr
    assert f"warning: cache folder {blocker / 'cache'} cannot be used" in warnings_[0]
    assert "point FLASHGEN_CACHE_DIR at a folder you own" in warnings_[0]
    assert "set FLASHGEN_CACHE_DIR to choose" not in result.stderr


# ---- the cache commands ------------------------------------------------------------------------
def test_cache_info_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "never" / "cache"
    result = run("cache", "info", env={"FLASHGEN_CACHE_DIR": str(root)})
    assert result.exit_code == 0
    assert f"dir      {root}  (not created yet)" in result.stdout
    assert not root.parent.exists()


def test_cache_clear_leaves_nothing_behind(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    c = CubinCache(root)
    for i in range(2):
        key = cache_key(str(i))
        with c.lock(key):
            c.put(key, b"\x7fELF", {})
    result = run("cache", "clear")
    assert result.exit_code == 0 and "removed 2 entries" in result.stdout
    assert not root.exists()


# ---- bench and tune ----------------------------------------------------------------------------
def _all_params() -> list[tuple[str, click.Parameter]]:
    out: list[tuple[str, click.Parameter]] = []

    def walk(cmd: click.Command, path: str) -> None:
        out.extend((path, p) for p in cmd.params)
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}".strip())

    walk(cli.main, "")
    return out


def test_every_option_has_help_text() -> None:
    missing = [
        f"{path} {'/'.join(p.opts)}"
        for path, p in _all_params()
        if isinstance(p, click.Option) and not (p.help or "").strip()
    ]
    assert missing == []


def test_bench_spells_the_causal_switch_like_every_other_command() -> None:
    for command in ("bench", "build", "bundle"):
        assert "--causal / --no-causal" in run(command, "--help").stdout, command


@pytest.mark.parametrize(("flag", "causal"), [([], (False, True)), (["--causal"], (True,)),
                                               (["--no-causal"], (False,))])  # fmt: skip
def test_bench_causal_switch_selects_the_masks(
    monkeypatch: pytest.MonkeyPatch, flag: list[str], causal: tuple[bool, ...]
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(cli_perf, "_gpu_or_fail", lambda command: ("GPU", "sm_90"))

    def cases(*args: Any) -> Any:
        seen.append(tuple(args[3]))
        raise cli.CliError("stop here")

    monkeypatch.setattr(bench_mod, "cases", cases)
    assert_one_line_error(run("bench", *flag), "stop here")
    assert seen == [causal]


@pytest.mark.parametrize("d", ["100", "0", "264", "-8"])
def test_bench_refuses_a_head_dim_it_cannot_bench_before_asking_for_a_gpu(
    monkeypatch: pytest.MonkeyPatch, d: str
) -> None:
    def no_gpu(command: str) -> Any:
        raise AssertionError("the head dim is checked first")

    monkeypatch.setattr(cli_perf, "_gpu_or_fail", no_gpu)
    line = assert_one_line_error(run("bench", "--d", "64", "--d", d), f"--d {d}:")
    assert "multiples of 8 from 8 to 256" in line and "--d 96" in line


def test_bench_takes_any_multiple_of_8_up_to_256(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(cli_perf, "_gpu_or_fail", lambda command: ("GPU", "sm_90"))

    def cases(*args: Any) -> Any:
        seen.append(tuple(args[1]))
        raise cli.CliError("stop here")

    monkeypatch.setattr(bench_mod, "cases", cases)
    assert_one_line_error(run("bench", "--d", "96", "--d", "8", "--d", "256"), "stop here")
    assert seen == [(96, 8, 256)]
    assert bench_mod.Case("bf16", 96, False, 4096).h == 21  # H = MODEL_DIM // d


@pytest.mark.parametrize("command", ["tune", "bench"])
def test_tune_and_bench_name_themselves_when_torch_is_missing(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    def no_torch() -> Any:
        raise bench_mod.BenchUnavailable(
            "torch is not importable (No module named 'torch'); bench needs torch with CUDA"
        )

    monkeypatch.setattr(bench_mod, "_torch", no_torch)
    line = assert_one_line_error(run(command), f"{command} needs torch with CUDA")
    if command == "tune":
        assert "bench" not in line


# ---- every GPU ---------------------------------------------------------------------------------
@requires_nvcc
@pytest.mark.parametrize("arch", ["sm_86", "sm_89", "sm_100", "sm_120"])
def test_build_and_inspect_for_every_gpu_arch(arch: str, tmp_path: Path) -> None:
    tiny = ["--d", "16", "--br", "16", "--bc", "16"]
    built = run("build", *tiny, "--arch", arch, "--out", str(tmp_path))
    assert built.exit_code == 0, built.output
    assert f"compiled for {arch} (" in built.stdout
    inspected = run("inspect", *tiny, "--arch", arch)
    assert inspected.exit_code == 0, inspected.output
    assert f"({arch}, cache hit)" in inspected.stdout


@requires_nvcc
def test_flashgen_arch_sm89_is_the_default_target(tmp_path: Path) -> None:
    env = {"FLASHGEN_ARCH": "sm_89"}
    tiny = ["--d", "16", "--br", "16", "--bc", "16"]
    built = run("build", *tiny, "--out", str(tmp_path), env=env)
    assert built.exit_code == 0, built.output
    assert "compiled for sm_89 (" in built.stdout
    assert run("inspect", *tiny, "--json", env=env).exit_code == 0


def test_an_unknown_flashgen_arch_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run("inspect", "--d", "64", env={"FLASHGEN_ARCH": "sm_61"}),
                          "FLASHGEN_ARCH=sm_61: not a supported arch")  # fmt: skip


def test_a_variant_too_big_for_the_arch_is_one_line() -> None:
    big = max(shipped("mma"), key=lambda s: s.smem_bytes)
    assert_one_line_error(run("inspect", "--name", big.name, "--arch", "sm_86"),
                          big.name, "sm_86 allows")  # fmt: skip


def test_a_family_that_cannot_run_on_the_arch_is_one_line() -> None:
    wgmma = shipped("wgmma")
    if not wgmma:
        pytest.skip("no wgmma variant is shipped yet")
    assert_one_line_error(run("inspect", "--name", wgmma[0].name, "--arch", "sm_90"),
                          "family wgmma runs on sm_90a only")  # fmt: skip


# ---- file modes -------------------------------------------------------------------------------
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_written_files_follow_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        assert (
            run("build", "--d", "64", "--no-compile", "--out", str(tmp_path / "g")).exit_code == 0
        )
        assert (
            run("build", "--d", "64", "--no-compile", "--bundle", str(tmp_path / "b")).exit_code
            == 0
        )
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "g").rglob("*") if p.is_file()]
    files += [p for p in (tmp_path / "b").rglob("*") if p.is_file()]
    assert len(files) > 2
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {oct(mode)}
