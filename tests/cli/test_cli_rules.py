"""The rules every command keeps (issue 30): a light `--help`, an option given once, errors that
name the environment variable behind them, nothing written by a refused build, `list
--direction`, and bundles of head dims generated on demand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from _nvcc import requires_nvcc
from click.testing import CliRunner

import flashgen
from cli.test_cli import REPO, assert_one_line_error, files_under, run, sandbox  # noqa: F401
from flashgen.bundle.emit import BundleError, select_variants
from flashgen.cli import app as cli
from flashgen.generator.select import select
from flashgen.generator.space import shipped
from flashgen.perf import sass

HEAVY = ("numpy", "ml_dtypes", "jinja2", "flashgen.generator", "flashgen.runtime", "pycuda")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
        check=False, cwd=REPO,
    )  # fmt: skip


# ---- 1. `flashgen --help` and `--version` import nothing heavy -----------------------------------
_LOADED = """
import sys
import flashgen.cli
for args in (["--help"], ["--version"], ["-h"], ["-V"]):
    try:
        flashgen.cli.main(args, prog_name="flashgen")
    except SystemExit as exc:
        assert exc.code == 0, exc.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"numpy", "ml_dtypes", "jinja2",
    "pycuda"} or m.startswith(("flashgen.generator", "flashgen.runtime", "flashgen.cli.app",
    "flashgen.cli.perf")))
print("HEAVY", heavy, file=sys.stderr)
"""


def test_help_and_version_import_nothing_heavy() -> None:
    """`flashgen --help` took 1.2 s importing ml_dtypes, NumPy, Jinja2 and the generator."""
    proc = _python(_LOADED)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stderr, proc.stderr
    assert "Commands:" in proc.stdout and "flashgen, version" in proc.stdout


def test_import_flashgen_is_light_and_keeps_its_public_api() -> None:
    code = "import sys, flashgen; print(sorted(m for m in sys.modules if m.startswith(%r)))"
    for prefix in HEAVY:
        proc = _python(code % prefix)
        assert proc.returncode == 0 and proc.stdout.strip() == "[]", (prefix, proc.stdout)
    for name in flashgen.__all__:  # every public name still resolves (on first use)
        assert getattr(flashgen, name) is not None, name
    from flashgen import KernelSpec, SpecError, shipped  # noqa: F401

    assert flashgen.KernelSpec.__module__ == "flashgen.generator.spec"
    assert set(dir(flashgen)) >= set(flashgen.__all__)
    with pytest.raises(AttributeError):
        flashgen.no_such_name  # noqa: B018


def test_the_lazy_command_list_is_what_click_would_print() -> None:
    """The summaries `flashgen --help` prints without importing the commands are their help's
    first paragraphs, and each command lives in the module named for it."""
    from flashgen.cli import group

    assert set(group.COMMANDS) == set(cli.main.commands)
    for name, (module, summary) in group.COMMANDS.items():
        cmd = cli.main.commands[name]
        first = " ".join((cmd.help or "").split("\n\n")[0].split())
        assert summary == first, name
        callback = cmd.callback
        assert callback is not None and callback.__module__ == module, name
    lazy = _python(
        "import flashgen.cli as c\n"
        "for width in (60, 80, 120):\n"
        "    try: c.main(['--help'], prog_name='flashgen', max_content_width=width,"
        " terminal_width=width)\n"
        "    except SystemExit: pass\n"
    )
    loaded = ""
    for width in (60, 80, 120):
        result = CliRunner().invoke(cli.main, ["--help"], prog_name="flashgen",
                                    terminal_width=width, max_content_width=width)  # fmt: skip
        loaded += result.output
    assert lazy.stdout == loaded


# ---- 2. an option given twice is refused by every command ----------------------------------------
def _commands(grp: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in sorted(grp.commands.items()):
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*prefix, name))
        out.append((*prefix, name))
    return out


def _value(opt: click.Option, tmp_path: Path) -> list[str]:
    """A valid value for `opt` (none for a flag)."""
    if opt.is_flag:
        return []
    if isinstance(opt.type, click.Choice):
        return [str(opt.type.choices[0])]
    if isinstance(opt.type, click.Path):
        return [str(tmp_path / "p")]
    if isinstance(opt.type, click.IntRange | click.FloatRange):
        low = opt.type.min if opt.type.min is not None else 1
        return [str(max(low, 16))]
    if opt.type is click.INT:
        return ["64"]
    if opt.type is click.FLOAT:
        return ["0.5"]
    return ["x"]


def _single_options() -> list[tuple[tuple[str, ...], str]]:
    cases = []
    for path in [(), *_commands(cli.main)]:
        cmd: click.Command = cli.main
        for name in path:
            assert isinstance(cmd, click.Group)
            cmd = cmd.commands[name]
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.multiple and not p.is_eager:
                cases.append((path, p.name or ""))
    return cases


@pytest.mark.parametrize(
    ("path", "name"), _single_options(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
def test_every_option_given_twice_is_refused(
    path: tuple[str, ...],
    name: str,
    sandbox: Path,  # noqa: F811
) -> None:
    """`bundle --no-causal --causal` kept the last while `build` refused it: one rule now."""
    cmd: click.Command = cli.main
    for part in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.commands[part]
    opt = next(p for p in cmd.params if p.name == name)
    assert isinstance(opt, click.Option)
    first = [opt.opts[0], *_value(opt, sandbox)]
    second = [(opt.secondary_opts or opt.opts)[0], *_value(opt, sandbox)]
    positional = ["out"] * sum(isinstance(p, click.Argument) for p in cmd.params)
    result = run(*path, *first, *second, *positional)
    line = assert_one_line_error(result, f"{opt.opts[0]}", "given 2 times", "give it once")
    assert " ".join(first) in line and " ".join(second) in line
    assert files_under(sandbox) == []


def test_bundle_causal_twice_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    result = run("bundle", str(tmp_path / "b"), "--d", "64", "--no-causal", "--causal")
    assert_one_line_error(result, "--causal/--no-causal given 2 times (--no-causal, --causal)")
    assert not (tmp_path / "b").exists()


def test_options_that_name_a_list_still_repeat(tmp_path: Path) -> None:
    result = run(
        "bundle", str(tmp_path / "b"), "--d", "64", "--d", "128", "--dtype", "bf16", "--dtype",
        "fp16", "--causal", "--features", "window", "--features", "softcap",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "b" / "kernels").glob("*.cu"))) == 12
    for command, args, key, want in (
        ("bench", ["--d", "64", "--d", "128", "--t", "512", "--t", "1024"], "head_dims",
         (64, 128)),
        ("tune", ["--dtype", "bf16", "--dtype", "fp16"], "dtypes", ("bf16", "fp16")),
    ):  # fmt: skip
        ctx = cli.main.commands[command].make_context(command, args)
        assert ctx.params[key] == want


# ---- 3. an error caused by an environment variable names it -------------------------------------
def test_an_unsupported_flashgen_arch_is_named(tmp_path: Path) -> None:
    result = run("build", "--d", "64", "--out", str(tmp_path), env={"FLASHGEN_ARCH": "sm_75"})
    line = assert_one_line_error(result, "FLASHGEN_ARCH=sm_75: not a supported arch", "sm_90a")
    assert "arch='sm_75'" not in line


@pytest.mark.parametrize("command", ["build", "inspect", "check"])
def test_a_garbage_flashgen_arch_is_one_line_naming_it(command: str, tmp_path: Path) -> None:
    """`FLASHGEN_ARCH=garbage flashgen build --d 64 --family wgmma` was a ValueError traceback."""
    args = [command, "--d", "64", "--family", "wgmma" if command != "check" else "mma"]
    result = run(*args, env={"FLASHGEN_ARCH": "garbage"})
    assert_one_line_error(result, "FLASHGEN_ARCH=garbage: not a supported arch")


def test_a_flashgen_arch_the_family_cannot_run_on_is_named() -> None:
    for args, env, needle in (
        (["--family", "wgmma", "--d", "64"], "sm_80", "family wgmma runs on sm_90a only"),
        (["--family", "mma", "--d", "256"], "sm_86", "sm_86 allows 101,376 B"),
    ):
        result = run("build", *args, env={"FLASHGEN_ARCH": env})
        assert_one_line_error(result, f"FLASHGEN_ARCH={env} (the arch when --arch is not given)",
                              needle, "unset it")  # fmt: skip


def test_a_bad_hypothesis_profile_names_the_variable_not_the_option() -> None:
    """`FLASHGEN_HYPOTHESIS_PROFILE=bogus flashgen fuzz` blamed `--profile`, never passed."""
    result = run("fuzz", env={"FLASHGEN_HYPOTHESIS_PROFILE": "bogus"})
    line = assert_one_line_error(
        result, "FLASHGEN_HYPOTHESIS_PROFILE=bogus:", "'bogus' is not one of"
    )
    assert "Invalid value for '--profile'" not in line


def test_a_bad_gpu_examples_count_is_one_line_naming_it() -> None:
    for value in ("x", "0"):
        result = run("fuzz", env={"FLASHGEN_GPU_EXAMPLES": value})
        assert_one_line_error(result, "FLASHGEN_GPU_EXAMPLES=")


# ---- 4. a refused build writes nothing -----------------------------------------------------------
REFUSED = {
    "unsupported arch": (["--d", "64"], {"FLASHGEN_ARCH": "sm_75"}),
    "garbage arch": (["--d", "64", "--family", "wgmma"], {"FLASHGEN_ARCH": "garbage"}),
    "wgmma off sm_90a": (["--d", "64", "--family", "wgmma", "--arch", "sm_80"], {}),
    "wgmma off sm_90a, no compile": (
        ["--d", "64", "--family", "wgmma", "--arch", "sm_80", "--no-compile"],
        {},
    ),
    "smem over the limit": (["--d", "256", "--family", "mma", "--arch", "sm_86"], {}),
    "bad nvcc timeout": (["--d", "64"], {"FLASHGEN_NVCC_TIMEOUT": "soon"}),
}


@pytest.mark.parametrize("bundle", [False, True], ids=["file", "bundle"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_build_writes_nothing(case: str, bundle: bool, sandbox: Path) -> None:  # noqa: F811
    """Refused builds printed `wrote generated/....cu` and left the file before exiting 2."""
    args, env = REFUSED[case]
    where = ["--bundle", "attn"] if bundle else []
    result = run("build", *args, *where, env=env)
    assert_one_line_error(result)
    assert files_under(sandbox) == []


# ---- 5. list --direction -------------------------------------------------------------------------
def test_list_direction_bwd_lists_the_shipped_backward_variants() -> None:
    bwd = shipped(direction="bwd")
    assert bwd
    result = run("list", "--direction", "bwd")
    assert result.exit_code == 0, result.output
    rows = [line.split()[0] for line in result.stdout.splitlines()[2:] if line.strip()][:-1]
    assert rows == [s.name for s in bwd]
    assert f"{len(bwd)} shipped backward variants (simt 0, mma" in result.stdout
    wgmma = run("list", "--direction", "bwd", "--family", "wgmma")
    assert f"{len(shipped('wgmma', direction='bwd'))} shipped backward variants (wgmma" in (
        wgmma.stdout
    )
    assert run("list").stdout == run("list", "--direction", "fwd").stdout
    assert "flash_bwd_" not in run("list").stdout
    assert_one_line_error(run("list", "--direction", "bwd", "--all"), "--all")


# ---- 6. a bundle takes any multiple of 8, chosen as flashgen.attention chooses ------------------
@pytest.mark.parametrize(
    ("extra", "d", "arch"),
    [
        ([], 80, "sm_80"),
        (["--family", "wgmma"], 80, "sm_90"),
        (["--dtype", "fp32"], 80, "sm_80"),
        (["--dtype", "fp32"], 208, "sm_80"),  # simt's default tile refuses d=208: a shipped one's
    ],
    ids=["default", "wgmma", "fp32", "fp32-d208"],
)
def test_bundle_generates_a_head_dim_nothing_ships(
    extra: list[str], d: int, arch: str, tmp_path: Path
) -> None:
    """`flashgen bundle --d 80` was refused although flashgen.attention generates d=80."""
    assert not any(s.d == d for s in shipped())
    result = run("bundle", str(tmp_path), "--d", str(d), *extra)
    assert result.exit_code == 0, result.output
    dtype = "fp32" if "fp32" in extra else "bf16"
    want = {f"{select(d, dtype, c, arch).name}.cu" for c in (False, True)}
    assert {p.name for p in (tmp_path / "kernels").glob("*.cu")} == want


@pytest.mark.parametrize("families", [(), ("wgmma", "mma")], ids=["default", "wgmma+mma"])
def test_a_bundle_variant_not_shipped_is_the_one_flashgen_attention_generates(
    families: tuple[str, ...],
) -> None:
    arch = "sm_90" if families else "sm_80"
    served = set(shipped())
    for dtype in ("bf16", "fp32"):
        for d in range(8, 257, 8):
            try:
                got = select_variants(families=families, ds=[d], dtypes=[dtype], causal=True)
            except BundleError:
                got = []
            if got and got[0] in served:
                continue  # a shipped variant of the families: taken first, as before
            try:
                want = [select(d, dtype, True, arch)]
            except ValueError:
                want = []
            if families and want and want[0].family not in families:
                continue
            assert got == want, (dtype, d)


def test_bundle_refuses_a_head_dim_that_is_no_multiple_of_8(tmp_path: Path) -> None:
    result = run("bundle", str(tmp_path / "b"), "--d", "81")
    assert_one_line_error(result, "d=81", "any other multiple of 8 up to 256, generated")
    assert not (tmp_path / "b").exists()


# ---- small: inspect names the SASS install command once ----------------------------------------
@requires_nvcc
def test_inspect_prints_the_cuobjdump_hint_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHGEN_CUOBJDUMP", raising=False)
    monkeypatch.setattr(sass, "_tool_candidates", lambda tool: [])
    result = run("inspect", "--d", "16", "--br", "16", "--bc", "16", "--arch", "sm_90")
    assert result.exit_code == 0, result.output
    assert "SASS           not available: cuobjdump not found" in result.stdout
    assert result.stdout.count(sass.INSTALL_HINT) == 1
    report = json.loads(run("inspect", "--d", "16", "--br", "16", "--bc", "16", "--arch",
                            "sm_90", "--json").stdout)  # fmt: skip
    assert report["sass"]["hint"] == sass.INSTALL_HINT  # the JSON keeps both fields
