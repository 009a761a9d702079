"""nvcc compile: every shipped variant spill-free, ptxas report parsing, errors, cold/warm."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fakenvcc import REGISTERS, fake_nvcc
from _fakenvcc import VERSION as FAKE_VERSION

from flashgen.generator import cache as cache_mod
from flashgen.generator import compile as compile_mod
from flashgen.generator import nvcc as nvcc_mod
from flashgen.generator.arch import ARCHS, ArchError, check_target, runs_on
from flashgen.generator.batch_compile import BATCH, batch_source, check_compiles
from flashgen.generator.cache import CubinCache, FlashgenWarning
from flashgen.generator.compile import CompileError, compile_kernel
from flashgen.generator.families import FAMILIES
from flashgen.generator.nvcc import NvccNotFound, find_nvcc, have_nvcc
from flashgen.generator.render import RenderedKernel, environment, render
from flashgen.generator.report import ResourceReport, parse_ptxas
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec

ELF_MAGIC = b"\x7fELF"


def _has_template(family: str) -> bool:
    return FAMILIES[family].template in environment().list_templates()


# ---- every shipped variant -----------------------------------------------------------------
@pytest.mark.compile_all
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_shipped_variant_compiles_for_its_archs_without_spills(
    family: str, nvcc_required: Path
) -> None:
    """The headline guarantee: nvcc accepts every shipped variant and ptxas spills nothing.

    Marked `compile_all` (deselected by default; `python -m pytest -m compile_all`). Runs
    through the session's cache; nvcc runs as a subprocess, so threads keep every core busy.
    """
    if not _has_template(family):
        pytest.skip(f"templates/{FAMILIES[family].template} has not landed yet")
    jobs = [(s, a) for s in shipped(family) for a in s.archs]
    workers = os.cpu_count() or 2
    start = time.perf_counter()
    # batch_compile.BATCH variants per nvcc run (the CUDA headers parsed once per batch): the
    # same per-kernel ptxas reports as one run per variant (test below), 2-3x fewer seconds
    results = check_compiles(jobs, workers=workers)
    wall = time.perf_counter() - start
    failures = [msg for (spec, arch), out in results.items() if (msg := _judge(spec, arch, out))]
    reports = [r for r in results.values() if isinstance(r, ResourceReport)]
    max_regs = max((r.registers for r in reports), default=0)
    print(
        f"\n[compile-all] family={family}: {len(shipped(family))} variants, {len(jobs)} "
        f"compiles in batches of {BATCH} in {wall:.1f} s on {workers} workers; max registers "
        f"{max_regs}"
    )
    assert len(results) == len(jobs)
    assert not failures, f"{len(failures)} of {len(jobs)} compiles failed:\n" + "\n".join(failures)


def _judge(spec: KernelSpec, arch: str, out: ResourceReport | Exception) -> str | None:
    """A compile's outcome as a one-paragraph failure (error, spills, implausible report), or
    None when it passed."""
    if isinstance(out, Exception):
        return f"{spec.name} [{arch}]: {type(out).__name__}: {out}"
    if out.spill_bytes:
        return (
            f"{spec.name} [{arch}]: spills {out.spill_stores} B stores / {out.spill_loads} B loads "
            f"({out.registers} registers, {out.stack_frame} B stack frame)"
        )
    if out.arch != arch or out.registers <= 0:
        return f"{spec.name} [{arch}]: implausible report {out}"
    return None


@pytest.mark.compile_all  # nvcc-heavy: runs with the compile-everything check
def test_a_batched_compile_reports_what_single_compiles_report(nvcc_required: Path) -> None:
    """The compile-all check's premise: ptxas's registers, spills and stack of a kernel are the
    same whether it is compiled alone or in a batch (two variants of each family, their archs)."""
    jobs = [(s, a) for f in FAMILIES for s in shipped(f)[:2] for a in s.archs[:1]]
    batched = check_compiles(jobs, batch=2, workers=2)
    for (spec, arch), out in batched.items():
        assert isinstance(out, ResourceReport), f"{spec.name} [{arch}]: {out}"
        assert out == compile_kernel(spec, arch).report, spec.name


def test_batch_source_keeps_each_variant_apart() -> None:
    """Includes once at the top, every source in a namespace of its own (no nvcc needed)."""
    a = '#include <stdint.h>\nconstexpr int D = 64;\nextern "C" __global__ void ka() {}\n'
    b = "#include <stdint.h>\n#include <cuda_bf16.h>\nconstexpr int D = 128;\n"
    tu = batch_source([a, b])
    assert tu.count("#include <stdint.h>") == 1 and "#include <cuda_bf16.h>" in tu
    assert tu.index("#include <cuda_bf16.h>") < tu.index("namespace fg_batch_0")
    assert "namespace fg_batch_0 {\nconstexpr int D = 64;" in tu
    assert "namespace fg_batch_1 {\nconstexpr int D = 128;" in tu


# ---- ptxas report parsing ------------------------------------------------------------------
PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'flash_x' for 'sm_80'
ptxas info    : Function properties for flash_x
    152 bytes stack frame, 148 bytes spill stores, 156 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 5.425 ms
ptxas info    : Compiling entry function 'flash' for 'sm_80'
ptxas info    : Function properties for flash
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 256 bytes smem, 360 bytes cmem[0]
ptxas info    : Compile time = 0.829 ms
"""


def test_parse_ptxas_reads_the_named_kernel() -> None:
    assert parse_ptxas(PTXAS_LOG, "flash", "sm_80") == ResourceReport(
        arch="sm_80", registers=96, static_smem=256, stack_frame=0, spill_stores=0, spill_loads=0
    )


def test_parse_ptxas_reads_spills_and_does_not_confuse_prefixes() -> None:
    r = parse_ptxas(PTXAS_LOG, "flash_x", "sm_90")
    assert (r.arch, r.registers, r.static_smem) == ("sm_90", 255, 0)
    assert (r.stack_frame, r.spill_stores, r.spill_loads) == (152, 148, 156)
    assert r.spill_bytes == 304
    assert r.to_dict()["registers"] == 255


@pytest.mark.parametrize("kernel", ["flash_y", "flas", "missing"])
def test_parse_ptxas_without_the_kernel_raises(kernel: str) -> None:
    with pytest.raises(ValueError, match=f"no report for kernel '{kernel}'"):
        parse_ptxas(PTXAS_LOG, kernel, "sm_80")


def test_parse_ptxas_on_empty_output_raises() -> None:
    with pytest.raises(ValueError, match="'flash'"):
        parse_ptxas("", "flash", "sm_80")


# ---- errors --------------------------------------------------------------------------------
def test_broken_source_raises_compile_error_with_command_and_first_errors(
    nvcc_required: Path, tmp_path: Path
) -> None:
    broken = "".join(f"not_a_type_{i} x{i};\n" for i in range(40))
    rk = RenderedKernel(spec=KernelSpec(), source=broken)
    cache = CubinCache(tmp_path / "cache")
    with pytest.raises(CompileError) as info:
        compile_kernel(rk, "sm_80", cache=cache)
    msg = str(info.value)
    head, *errors = msg.splitlines()
    assert head.startswith("nvcc failed (exit ")
    assert str(nvcc_required) in head, "the message carries the nvcc that ran"
    assert "-cubin" in head and "arch=compute_80" in head, "the message carries the command"
    assert errors and "error" in errors[0] and "not_a_type_0" in errors[0], errors[:2]
    assert len(errors) <= 12, "only the first error lines, not the whole log"
    assert cache.entries() == [], "a failed compile must not leave a cache entry"


def test_bad_nvcc_flag_raises_compile_error_naming_it(nvcc_required: Path, tmp_path: Path) -> None:
    with pytest.raises(CompileError) as info:
        compile_kernel(
            KernelSpec(), "sm_80", extra_flags=("--no-such-flag",), cache=CubinCache(tmp_path)
        )
    head, *rest = str(info.value).splitlines()
    assert "--no-such-flag" in head
    assert rest and "no-such-flag" in "\n".join(rest), "nvcc's own complaint is quoted"


def test_unknown_arch_is_rejected_before_nvcc_runs() -> None:
    with pytest.raises(ValueError, match=r"arch='sm_61': not supported; choose one of sm_80"):
        compile_kernel(KernelSpec(), "sm_61")


def _hide_nvcc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Make every place find_nvcc looks empty: env vars, PATH, /usr/local/cuda, the wheel."""
    for var in ("FLASHGEN_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(nvcc_mod, "_wheel_candidates", lambda: [])
    real_access = os.access
    system = {Path("/usr/local/cuda/bin/nvcc")}

    def access(path: object, mode: int, **kw: object) -> bool:
        if isinstance(path, (str, os.PathLike)) and Path(path) in system:
            return False
        return real_access(path, mode, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", access)  # find_nvcc checks os.access


def test_missing_nvcc_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _hide_nvcc(monkeypatch, tmp_path)
    assert not have_nvcc()
    with pytest.raises(NvccNotFound) as info:
        find_nvcc()
    msg = str(info.value)
    assert "nvcc not found" in msg
    for place in ("PATH", "CUDA_HOME", "/usr/local/cuda", "nvidia-cuda-nvcc"):
        assert place in msg, f"the message should say it looked at {place}"
    assert "pip install 'flashgen[nvcc]'" in msg and "CUDA toolkit" in msg
    # compile_kernel surfaces the same error, not a FileNotFoundError from subprocess
    with pytest.raises(NvccNotFound, match="pip install"):
        compile_kernel(KernelSpec(), "sm_80", cache=CubinCache(tmp_path / "cache"))


def test_flashgen_nvcc_pointing_nowhere_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLASHGEN_NVCC", str(tmp_path / "no-nvcc"))
    with pytest.raises(NvccNotFound, match="FLASHGEN_NVCC=.*no such file"):
        find_nvcc()


def test_flashgen_nvcc_wins_over_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nvcc_required: Path
) -> None:
    _hide_nvcc(monkeypatch, tmp_path)
    monkeypatch.setenv("FLASHGEN_NVCC", str(nvcc_required))
    assert find_nvcc() == nvcc_required


def test_nvcc_on_cuda_home_is_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nvcc_required: Path
) -> None:
    _hide_nvcc(monkeypatch, tmp_path)
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").symlink_to(nvcc_required)
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert find_nvcc() == home / "bin" / "nvcc"


# ---- cold and warm -------------------------------------------------------------------------
def test_second_compile_comes_from_the_cache(
    nvcc_required: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = CubinCache(tmp_path / "cache")
    spec = KernelSpec(family="simt", d=32, br=16, bc=16, dtype="fp16", causal=True)
    t0 = time.perf_counter()
    cold = compile_kernel(spec, "sm_80", cache=cache)
    t1 = time.perf_counter()
    warm = compile_kernel(render(spec), "sm_80", cache=cache)
    t2 = time.perf_counter()
    assert (cold.cached, warm.cached) == (False, True)
    assert warm.cubin == cold.cubin and warm.report == cold.report
    assert warm.spec == spec and warm.arch == "sm_80" and warm.name == spec.name
    assert len(cache.entries()) == 1
    print(f"\n[cold/warm] {spec.name}: cold {t1 - t0:.2f} s, warm {t2 - t1:.3f} s")
    # another arch is another entry
    assert compile_kernel(spec, "sm_90", cache=cache).cached is False
    assert len(cache.entries()) == 2
    # the default arch comes from FLASHGEN_ARCH (else the local GPU, else sm_90)
    monkeypatch.setenv("FLASHGEN_ARCH", "sm_90")
    dflt = compile_kernel(spec, cache=cache)
    assert (dflt.arch, dflt.cached) == ("sm_90", True)
    # extra flags change the key: the cubin is rebuilt, not served from the sm_90 entry
    assert (
        compile_kernel(spec, "sm_90", extra_flags=("-DFLASHGEN_X=1",), cache=cache).cached is False
    )


@pytest.mark.compile_all  # two cold nvcc runs a second apart: CI's compile check (cold/warm above)
def test_two_cold_builds_of_one_source_give_identical_cubins(
    nvcc_required: Path, tmp_path: Path
) -> None:
    # -lineinfo records the build folder and the source's mtime: neither may vary (a second
    # apart, a fresh timestamp would show up in the bytes)
    spec = KernelSpec(family="simt", d=16, br=16, bc=16, dtype="fp32", causal=False)
    one = compile_kernel(spec, "sm_90", cache=CubinCache(tmp_path / "a"))
    time.sleep(1.1)
    two = compile_kernel(spec, "sm_90", cache=CubinCache(tmp_path / "b"))
    assert (one.cached, two.cached) == (False, False)
    assert one.cubin == two.cubin


# ---- nvcc's work folder ----------------------------------------------------------------------
@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A system temp folder of this test's own (other processes share the real one)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_nvcc_work_folders_are_private_and_removed_after_each_compile(
    nvcc_required: Path, tmp_path: Path, private_tmp: Path
) -> None:
    cache = CubinCache(tmp_path / "cache")
    compile_kernel(KernelSpec(family="simt", d=16, br=16, bc=16), "sm_90", cache=cache)
    with pytest.raises(CompileError):
        compile_kernel(RenderedKernel(KernelSpec(), "broken;"), "sm_90", cache=cache)
    root = private_tmp / f"flashgen-work-{os.getuid()}"
    assert stat.S_IMODE(root.lstat().st_mode) == 0o700
    left = sorted(p.name for p in root.iterdir())
    assert all(name.endswith(".lock") for name in left), left
    assert all((root / name).is_file() for name in left)


@pytest.mark.parametrize("plant", ["symlink", "foreign"])
def test_a_planted_nvcc_work_folder_is_never_used(
    nvcc_required: Path,
    tmp_path: Path,
    private_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    plant: str,
) -> None:
    """The reported attack: a symlink planted at the work folder's guessable path made a
    compile write through it. Now the folder is ours and private, or it is not used."""
    planted = private_tmp / f"flashgen-work-{os.getuid()}"
    victim = tmp_path / "victim"
    victim.mkdir()
    if plant == "symlink":
        planted.symlink_to(victim)
    else:
        planted.mkdir(mode=0o755)
        real = cache_mod._why_unsafe  # someone else's folder: judged as if it belonged to them

        def foreign(path: Path, st: os.stat_result, *, private: bool) -> str | None:
            return "belongs to uid 4242" if path == planted else real(path, st, private=private)

        monkeypatch.setattr(cache_mod, "_why_unsafe", foreign)
    monkeypatch.setattr(compile_mod, "_work_fallback", None)
    with pytest.warns(FlashgenWarning, match=f"nvcc work folder {planted} is not safe"):
        ck = compile_kernel(
            KernelSpec(family="simt", d=16, br=16, bc=16), "sm_90", cache=CubinCache(tmp_path / "c")
        )
    assert ck.cubin.startswith(ELF_MAGIC)
    assert list(victim.iterdir()) == [] and sorted(planted.iterdir()) == []


# ---- nvcc that hangs ---------------------------------------------------------------------------
HANGING_NVCC = """\
#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0
fi
sleep 300 &
echo $! > "{pids}"
sleep 300
"""


def test_a_hung_nvcc_is_stopped_reported_in_one_line_and_releases_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_tmp: Path
) -> None:
    fake = tmp_path / "nvcc"
    pids = tmp_path / "child.pid"
    fake.write_text(HANGING_NVCC.format(pids=pids))
    fake.chmod(0o755)
    monkeypatch.setenv("FLASHGEN_NVCC", str(fake))
    monkeypatch.setenv("FLASHGEN_NVCC_TIMEOUT", "1.5")
    nvcc_mod.nvcc_version.cache_clear()
    cache = CubinCache(tmp_path / "cache")
    spec = KernelSpec(family="simt", d=16, br=16, bc=16)
    t0 = time.perf_counter()
    with pytest.raises(CompileError) as info:
        compile_kernel(spec, "sm_90", cache=cache)
    assert time.perf_counter() - t0 < 30
    msg = str(info.value)
    assert "\n" not in msg
    assert f"nvcc did not finish {spec.name} for sm_90 within 1.5 s" in msg
    assert "FLASHGEN_NVCC_TIMEOUT" in msg
    # the lock is free again: a non-blocking attempt on every lock file succeeds
    for lock in [*(tmp_path / "cache").rglob("*.lock"), *private_tmp.rglob("*.lock")]:
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    # nvcc's own children were stopped with it
    child = int(pids.read_text())
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split()[2] == "Z":  # a zombie waiting for init: it is dead
                break
        time.sleep(0.05)
    else:
        pytest.fail(f"nvcc's child {child} still runs after the timeout")
    assert cache.entries() == []


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan", "inf"])
def test_a_bad_nvcc_timeout_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("FLASHGEN_NVCC_TIMEOUT", value)
    with pytest.raises(ValueError, match=r"FLASHGEN_NVCC_TIMEOUT=.*positive number of seconds"):
        nvcc_mod.nvcc_timeout()


def test_nvcc_timeout_defaults_and_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLASHGEN_NVCC_TIMEOUT", raising=False)
    assert nvcc_mod.nvcc_timeout() == nvcc_mod.DEFAULT_TIMEOUT_S
    monkeypatch.setenv("FLASHGEN_NVCC_TIMEOUT", "42")
    assert nvcc_mod.nvcc_timeout() == 42.0


# ---- every GPU ---------------------------------------------------------------------------------
NEW_ARCHS = ["sm_86", "sm_89", "sm_100", "sm_120"]


@pytest.mark.compile_all  # nvcc-heavy: runs with the compile-everything check
@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_kernels_compile_for_gpus_beyond_sm80_and_sm90(
    nvcc_required: Path, tmp_path: Path, arch: str
) -> None:
    cache = CubinCache(tmp_path)
    for spec in (
        KernelSpec(family="simt", d=16, br=16, bc=16),
        KernelSpec(family="mma", d=32, br=16, bc=16, dtype="fp16"),
    ):
        ck = compile_kernel(spec, arch, cache=cache)
        assert ck.arch == arch and ck.report.arch == arch
        assert ck.cubin.startswith(ELF_MAGIC) and ck.report.spill_bytes == 0


def test_the_default_arch_follows_flashgen_arch(
    nvcc_required: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHGEN_ARCH", "sm_89")
    ck = compile_kernel(KernelSpec(family="simt", d=16, br=16, bc=16), cache=CubinCache(tmp_path))
    assert ck.arch == "sm_89"


def test_a_variant_whose_smem_does_not_fit_the_arch_is_refused_in_one_line() -> None:
    big = max(shipped("mma"), key=lambda s: s.smem_bytes)
    assert big.smem_bytes > ARCHS["sm_86"].smem_per_block
    with pytest.raises(ArchError) as info:
        compile_kernel(big, "sm_86")
    msg = str(info.value)
    assert "\n" not in msg and big.name in msg and "sm_86 allows 101,376 B" in msg
    assert "choose smaller tiles" in msg


@pytest.mark.parametrize(
    ("archs", "target", "ok"),
    [
        (("sm_80", "sm_90"), "sm_86", True),
        (("sm_80", "sm_90"), "sm_120", True),
        (("sm_80", "sm_90"), "sm_90a", True),
        (("sm_90a",), "sm_90a", True),
        (("sm_90a",), "sm_90", False),
        (("sm_90a",), "sm_100", False),
        (("sm_90",), "sm_86", False),
    ],
)
def test_which_archs_a_family_runs_on(archs: tuple[str, ...], target: str, ok: bool) -> None:
    assert runs_on(archs, target) is ok


def test_a_family_that_cannot_run_on_the_arch_is_refused_in_one_line() -> None:
    with pytest.raises(ArchError) as info:
        check_target("flash_fwd_wgmma_x", "wgmma", ("sm_90a",), 0, "sm_90")
    assert str(info.value) == (
        "arch=sm_90: family wgmma runs on sm_90a only; choose another --arch or another --family"
    )


# ---- a hung nvcc blocks nothing else; waiting is not compiling -----------------------------------
REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
SIMT16 = KernelSpec(family="simt", d=16, br=16, bc=16)

# a process that compiles one kernel: `python -c BUILD_ONE <name> [extra flag...]`
BUILD_ONE = """
import signal, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a login shell's child has it (not nohup's)
from flashgen.generator.compile import compile_kernel
from flashgen.generator.spec import KernelSpec
compile_kernel(KernelSpec.from_name(sys.argv[1]), "sm_90", extra_flags=tuple(sys.argv[2:]))
"""


def _wait_for(path: Path, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {seconds:g} s")
        time.sleep(0.05)


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie: dead, not yet reaped


def _assert_dies(pid: int) -> None:
    for _ in range(200):
        if _dead(pid):
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} still runs")


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts (each in a session of its own): killed, by pid, if still alive."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _kill_nvcc(pids: Path) -> None:
    """Stop a hanging fake nvcc (its own session: its group is its pid) and its child."""
    if pids.exists():
        for pid in pids.read_text().split():
            with contextlib.suppress(OSError):
                os.killpg(int(pid), signal.SIGKILL)


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, env={**os.environ, "PYTHONPATH": str(REPO), **env}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _old_shard(spec: KernelSpec, extra: tuple[str, ...]) -> str:
    """The lock file a run of `spec` took before locks were per content: one of 256 shards."""
    gencode = check_target(spec.name, spec.family, spec.archs, spec.smem_bytes, "sm_90").gencode
    flags = compile_mod.cubin_flags(gencode, extra)
    return cache_mod.cache_key(render(spec).source, compile_mod.nvcc_flags_seen(flags), ".cu")[:2]


def _sharing_an_old_shard_with(spec: KernelSpec) -> tuple[str, ...]:
    """Extra flags that make another kernel build whose old lock shard is `spec`'s."""
    want = _old_shard(spec, ())
    for i in range(10_000):
        extra = (f"-DFLASHGEN_PROBE={i}",)
        if _old_shard(spec, extra) == want:
            return extra
    raise AssertionError("no flags found")  # pragma: no cover: 256 shards


@pytest.mark.parametrize(
    "other",
    [
        "another-kernel",  # the reported case: the old lock shard of the hung key
        # the same check against another fake nvcc, with process A started again (a second of
        # flashgen's imports): with CI's compile check
        pytest.param("same-source-another-nvcc", marks=pytest.mark.compile_all),
    ],
)
def test_a_hung_nvcc_in_one_process_does_not_hold_up_another_key_in_another(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    private_tmp: Path,
    started: list[subprocess.Popen[bytes]],
    other: str,
) -> None:
    """The reported bug: a hanging nvcc for key A made a build of key B, in another process
    with another cache, wait (all runs shared 256 lock files), and that wait was reported as
    nvcc time. Key B here is either another kernel build whose lock shard used to be A's, or
    A's very source compiled by another nvcc (another key: the nvcc version is in it)."""
    pids = tmp_path / "hung.pids"
    hung = fake_nvcc(tmp_path / "hung", sleep=300, pids=pids)
    a = _spawn(
        [sys.executable, "-c", BUILD_ONE, SIMT16.name],
        {"FLASHGEN_NVCC": str(hung), "FLASHGEN_NVCC_TIMEOUT": "40", "TMPDIR": str(private_tmp),
         "FLASHGEN_CACHE_DIR": str(tmp_path / "cache-a")},
    )  # fmt: skip
    started.append(a)
    try:
        _wait_for(pids)  # A holds its locks and its nvcc hangs
        extra: tuple[str, ...] = ()
        version = FAKE_VERSION
        if other == "another-kernel":
            extra = _sharing_an_old_shard_with(SIMT16)
        else:
            version = FAKE_VERSION.replace("(fake)", "(another fake)")
        monkeypatch.setenv("FLASHGEN_NVCC", str(fake_nvcc(tmp_path / "fast", version=version)))
        nvcc_mod.nvcc_version.cache_clear()
        t0 = time.perf_counter()
        ck = compile_kernel(SIMT16, "sm_90", extra_flags=extra, cache=CubinCache(tmp_path / "b"))
        elapsed = time.perf_counter() - t0
        assert elapsed < 15, f"key B waited {elapsed:.1f} s for key A's hung nvcc"
        assert (ck.cached, ck.report.registers) == (False, REGISTERS)
        assert ck.waited_seconds < 1 and ck.nvcc_seconds < elapsed
        assert a.poll() is None, "A is still stuck in its nvcc: B did not wait for it"
    finally:
        _kill_nvcc(pids)


def test_a_wait_for_another_build_of_the_key_is_reported_apart_from_compile_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_tmp: Path
) -> None:
    """Two builds of one key: the second waits for the first (which runs nvcc for 3 s) and gets
    a cache hit; its seconds are waiting, not nvcc time, and the wait is announced once."""
    pids = tmp_path / "slow.pids"
    monkeypatch.setenv("FLASHGEN_NVCC", str(fake_nvcc(tmp_path, sleep=3, pids=pids)))
    nvcc_mod.nvcc_version.cache_clear()
    cache = CubinCache(tmp_path / "cache")
    first: list[compile_mod.CompiledKernel] = []
    builder = threading.Thread(
        target=lambda: first.append(compile_kernel(SIMT16, "sm_90", cache=cache))
    )
    builder.start()
    try:
        _wait_for(pids)
        with pytest.warns(FlashgenWarning, match="waiting for another build of the same kernel"):
            second = compile_kernel(SIMT16, "sm_90", cache=cache)
    finally:
        builder.join(timeout=60)
        _kill_nvcc(pids)
    assert (first[0].cached, second.cached) == (False, True)
    assert first[0].nvcc_seconds >= 3 and first[0].waited_seconds < 1
    assert second.nvcc_seconds == 0 and 1.5 < second.waited_seconds < 30


# ---- SIGTERM and SIGHUP stop nvcc like Ctrl-C does -----------------------------------------------
# the `flashgen` command in a process of its own: `python -c CLI build ...`
CLI = """
import signal
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from flashgen.cli.app import main
main()
"""


@pytest.mark.parametrize(
    ("sig", "via"),
    [
        (signal.SIGTERM, "cli"),  # the reported case (`timeout 3 flashgen build`)
        # each case starts flashgen in a process of its own (a second of imports before its
        # nvcc starts): the other signal and the library path run with CI's compile check
        pytest.param(signal.SIGHUP, "cli", marks=pytest.mark.compile_all),
        pytest.param(signal.SIGTERM, "library", marks=pytest.mark.compile_all),
    ],
)
def test_sigterm_and_sighup_stop_nvcc_and_remove_its_work_folder(
    tmp_path: Path,
    private_tmp: Path,
    started: list[subprocess.Popen[bytes]],
    sig: signal.Signals,
    via: str,
) -> None:
    """The reported bug: `timeout 3 flashgen build ...` (SIGTERM) left nvcc running in its
    work folder; only Ctrl-C stopped it. Now every stop signal does, and the folder goes."""
    pids = tmp_path / "hung.pids"
    env = {"FLASHGEN_NVCC": str(fake_nvcc(tmp_path, sleep=300, pids=pids)),
           "TMPDIR": str(private_tmp), "FLASHGEN_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    if via == "cli":
        argv = [sys.executable, "-c", CLI, "build", "--family", "simt", "--d", "16", "--br",
                "16", "--bc", "16", "--arch", "sm_90", "--out", str(tmp_path / "out")]  # fmt: skip
    else:
        argv = [sys.executable, "-c", BUILD_ONE, SIMT16.name]
    proc = _spawn(argv, env)
    started.append(proc)
    try:
        _wait_for(pids)
        nvcc_pid, child_pid = (int(p) for p in pids.read_text().split())
        proc.send_signal(sig)
        proc.wait(timeout=60)
        assert proc.returncode == 128 + sig, (proc.returncode, proc.stderr.read())  # type: ignore[union-attr]
        _assert_dies(nvcc_pid)
        _assert_dies(child_pid)
        root = private_tmp / f"flashgen-work-{os.getuid()}"
        assert [p.name for p in root.iterdir() if p.is_dir()] == [], "work folder left behind"
    finally:
        _kill_nvcc(pids)


def test_stop_signals_are_given_back_after_a_compile() -> None:
    """Handlers are flashgen's only while it compiles; a program's own stay untouched."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with compile_mod.stop_nvcc_on_signals():
        assert signal.getsignal(signal.SIGTERM) is compile_mod._on_stop_signal
        with compile_mod.stop_nvcc_on_signals():  # nested: still flashgen's
            pass
        assert signal.getsignal(signal.SIGTERM) is compile_mod._on_stop_signal
    assert {s: signal.getsignal(s) for s in before} == before


# ---- an nvcc that prints no version --------------------------------------------------------------
def test_an_nvcc_that_prints_no_version_is_named_as_such(tmp_path: Path) -> None:
    """`FLASHGEN_NVCC=/bin/true` used to be reported as "--version failed (exit 0)": what is
    wrong is that no nvcc version was printed."""
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nexit 0\n")
    silent.chmod(0o755)
    nvcc_mod.nvcc_version.cache_clear()
    try:
        for tool, shown in ((silent, "printed nothing"), (Path("/bin/true"), "printed ")):
            with pytest.raises(NvccNotFound) as info:
                nvcc_mod.nvcc_version(tool)
            msg = str(info.value)
            assert f"{tool} --version {shown}" in msg and "not nvcc's version" in msg
            assert "exit 0" not in msg and "point FLASHGEN_NVCC at a working nvcc" in msg
    finally:
        nvcc_mod.nvcc_version.cache_clear()
