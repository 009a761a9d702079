"""The cubin cache: hits and misses, corruption recovery, fallback dir, concurrent builders."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import queue
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import jinja2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashgen.generator import cache as cache_mod
from flashgen.generator import compile as compile_mod
from flashgen.generator import render as render_mod
from flashgen.generator import report as report_mod
from flashgen.generator.cache import (
    CubinCache,
    FlashgenWarning,
    UnsafeDirectory,
    atomic_write,
    cache_dir,
    cache_key,
    default_cache_dir,
    ensure_private_dir,
)
from flashgen.generator.compile import compile_kernel
from flashgen.generator.render import RenderedKernel, render
from flashgen.generator.spec import KernelSpec

KEY = cache_key("source", "flags", "sm_80", "nvcc 13.0", "0.1.0")
DATA = b"\x7fELF" + bytes(range(256)) * 4
SPEC = KernelSpec(family="simt", d=16, br=16, bc=16, dtype="bf16", causal=False)
SPEC90 = KernelSpec(family="simt", d=16, br=16, bc=16)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- entries without nvcc ------------------------------------------------------------------
def test_miss_then_put_then_hit(tmp_path: Path) -> None:
    c = CubinCache(tmp_path)
    assert c.get(KEY) is None
    assert c.entries() == []
    c.put(KEY, DATA, {"name": "k", "report": {"registers": 1}})
    hit = c.get(KEY)
    assert hit is not None
    data, meta = hit
    assert data == DATA
    assert meta["name"] == "k" and meta["report"] == {"registers": 1}
    assert meta["sha256"] == _sha(DATA)
    assert c.entries() == [c.paths(KEY)[0]]
    assert c.clear() == 1
    assert c.get(KEY) is None and c.entries() == []


def test_put_leaves_no_temporary_files(tmp_path: Path) -> None:
    c = CubinCache(tmp_path)
    c.put(KEY, DATA, {})
    leftovers = [p.name for p in tmp_path.rglob(".*") if not p.name.endswith(".lock")]
    assert leftovers == []


def test_a_failed_write_keeps_the_old_entry_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = CubinCache(tmp_path)
    c.put(KEY, DATA, {"v": 1})

    def boom(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)  # the cache writes through os.replace
    with pytest.raises(OSError, match="disk full"):
        c.put(KEY, b"new bytes", {"v": 2})
    monkeypatch.undo()
    assert [p.name for p in c.paths(KEY)[0].parent.glob(".*.cubin.*")] == []
    hit = c.get(KEY)
    assert hit is not None and hit[0] == DATA and hit[1]["v"] == 1


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip", "empty", "delete-cubin", "json-garbage", "json-list", "json-no-sha"],
)
def test_damaged_entries_are_misses(tmp_path: Path, damage: str) -> None:
    c = CubinCache(tmp_path)
    c.put(KEY, DATA, {"name": "k"})
    cubin_p, meta_p = c.paths(KEY)
    if damage == "truncate":
        cubin_p.write_bytes(DATA[: len(DATA) // 2])
    elif damage == "flip":  # same length, one bit: only the hash can tell
        cubin_p.write_bytes(DATA[:100] + bytes([DATA[100] ^ 1]) + DATA[101:])
    elif damage == "empty":
        cubin_p.write_bytes(b"")
    elif damage == "delete-cubin":
        cubin_p.unlink()
    elif damage == "json-garbage":
        meta_p.write_text('{"sha256": "' + _sha(DATA)[:20])
    elif damage == "json-list":
        meta_p.write_text("[]")
    elif damage == "json-no-sha":
        meta_p.write_text(json.dumps({"name": "k"}))
    assert c.get(KEY) is None
    # a rebuilt entry is served again
    c.put(KEY, DATA, {"name": "k"})
    hit = c.get(KEY)
    assert hit is not None and hit[0] == DATA


def test_a_hash_mismatch_removes_the_entry(tmp_path: Path) -> None:
    c = CubinCache(tmp_path)
    c.put(KEY, DATA, {})
    c.paths(KEY)[0].write_bytes(DATA[:-1])
    assert c.get(KEY) is None
    assert not c.paths(KEY)[0].exists() and not c.paths(KEY)[1].exists()


# ---- where the cache lives -----------------------------------------------------------------
def test_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "a"))
    assert default_cache_dir() == tmp_path / "a"
    assert CubinCache().root == tmp_path / "a"
    monkeypatch.delenv("FLASHGEN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "flashgen"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "flashgen"


def _expect_fallback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bad: Path) -> Path:
    """Point the cache at `bad`, check the one-line warning and the fallback, return it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # keep the fallback inside tmp_path
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(bad))
    with pytest.warns(FlashgenWarning) as record:
        root = cache_dir()
    [warning] = record
    msg = str(warning.message)
    assert "\n" not in msg
    assert msg.startswith(f"cache folder {bad} cannot be used (")
    assert f"caching in {root}" in msg
    # the user already set the variable: the fix is to point it elsewhere, not to set it
    assert "point FLASHGEN_CACHE_DIR at a folder you own and can write" in msg
    assert root.parent == tmp and root != bad
    assert os.access(root, os.W_OK)
    assert stat.S_IMODE(root.lstat().st_mode) == 0o700
    c = CubinCache(root)
    c.put(KEY, DATA, {})
    assert c.get(KEY) is not None
    return root


def test_read_only_cache_dir_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("chmod does not stop this user from writing (root); see the test below")
        _expect_fallback(monkeypatch, tmp_path, ro)
    finally:
        ro.chmod(0o700)


def test_uncreatable_cache_dir_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A regular file where a directory should be: unwritable even for root."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    root = _expect_fallback(monkeypatch, tmp_path, blocker / "cache")
    assert root.name == f"flashgen-cache-{os.getuid()}"


def test_unset_cache_variable_warning_says_to_set_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    monkeypatch.delenv("FLASHGEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.warns(FlashgenWarning, match="set FLASHGEN_CACHE_DIR to a folder you own"):
        cache_dir()


def test_compile_with_an_unwritable_cache_dir_still_works(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nvcc_required: Path
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    root = _expect_fallback(monkeypatch, tmp_path, blocker / "cache")
    ck = compile_kernel(SPEC, "sm_80")  # the same folder again: warned once per process
    assert ck.cubin.startswith(b"\x7fELF")
    assert any(p.suffix == ".cubin" for p in root.rglob("*"))


# ---- private folders -----------------------------------------------------------------------
def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def test_cache_folders_are_created_private(tmp_path: Path) -> None:
    root = tmp_path / "a" / "cache"
    c = CubinCache(root)
    assert not root.exists(), "constructing a cache creates nothing"
    c.put(KEY, DATA, {})
    assert _mode(root) == 0o700 and _mode(c.paths(KEY)[0].parent) == 0o700


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_cache_entries_follow_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        c = CubinCache(tmp_path / "cache")
        c.put(KEY, DATA, {})
    finally:
        os.umask(old)
    cubin_p, meta_p = c.paths(KEY)
    assert (_mode(cubin_p), _mode(meta_p)) == (mode, mode)


def test_atomic_write_replaces_a_planted_symlink_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "out.cu"
    link.symlink_to(victim)
    atomic_write(link, b"new")
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_bytes() == b"new"


@pytest.mark.parametrize("mode", [0o1777, 0o2775, 0o0775])
def test_a_folder_flashgen_did_not_create_keeps_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    """The reported bug: FLASHGEN_CACHE_DIR=<a shared 1777 or setgid 2775 folder> was chmod'ed
    to 0700, losing its sticky / setgid bit and its group's access. A folder flashgen did not
    create is never changed: one that others may write is not used, and the warning says so
    and how to fix it."""
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, mode)
    before = d.lstat()
    with pytest.raises(UnsafeDirectory, match=rf"has mode {mode:04o}, so others may write it"):
        ensure_private_dir(d, private=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(d))
    with pytest.warns(FlashgenWarning, match=rf"run `chmod go-w {d}` or choose another folder"):
        root = cache_dir()
    assert root != d and root.parent == tmp
    after = d.lstat()
    assert (after.st_mode, after.st_uid, after.st_gid) == (
        before.st_mode, before.st_uid, before.st_gid
    )  # fmt: skip


def test_a_folder_flashgen_creates_is_private(tmp_path: Path) -> None:
    made = ensure_private_dir(tmp_path / "new")
    assert _mode(made) == 0o700


def test_a_symlinked_cache_folder_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "cache").symlink_to(target)
    with pytest.raises(UnsafeDirectory, match="is a symlink"):
        CubinCache(tmp_path / "cache").put(KEY, DATA, {})
    assert list(target.iterdir()) == []


def test_someone_elses_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    monkeypatch.setattr(cache_mod, "_my_uid", lambda: d.stat().st_uid + 4242)
    with pytest.raises(UnsafeDirectory, match="belongs to uid"):
        ensure_private_dir(d)


@pytest.mark.parametrize("plant", ["symlink", "foreign"])
def test_a_planted_fallback_cache_is_not_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plant: str
) -> None:
    """The fallback lives at a guessable path in the shared temp folder: whatever someone
    planted there (a symlink, their own folder holding a cubin for our key) is never used."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    planted = tmp / f"flashgen-cache-{os.getuid()}"
    victim = tmp_path / "victim"
    CubinCache(victim).put(KEY, b"planted cubin", {})
    if plant == "symlink":
        planted.symlink_to(victim)
    else:
        planted.mkdir(mode=0o700)
        CubinCache(planted).put(KEY, b"planted cubin", {})
        real = cache_mod._why_unsafe  # someone else's folder: judged as if it belonged to them

        def foreign(path: Path, st: os.stat_result, *, private: bool) -> str | None:
            return "belongs to uid 4242" if path == planted else real(path, st, private=private)

        monkeypatch.setattr(cache_mod, "_why_unsafe", foreign)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(FlashgenWarning, match=f"{planted} is not safe to use"):
        root = cache_dir()
    assert root not in (planted, victim) and root.parent == tmp
    assert CubinCache(root).get(KEY) is None, "a planted cubin must never be served"
    assert _mode(root) == 0o700


def test_cache_clear_leaves_nothing_behind(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    c = CubinCache(root)
    for i in range(3):
        key = cache_key(str(i))
        with c.lock(key):
            c.put(key, DATA, {})
    assert c.clear() == 3
    assert not root.exists(), sorted(p.name for p in root.rglob("*"))


def test_cache_clear_keeps_files_it_did_not_write(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    c = CubinCache(root)
    c.put(KEY, DATA, {})
    (root / "notes.txt").write_text("mine")
    assert c.clear() == 1
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]


# ---- recovery through compile_kernel -------------------------------------------------------
@pytest.fixture(scope="module")
def spec_built(tmp_path_factory: pytest.TempPathFactory, nvcc_required: Path) -> Path:
    """A cache holding SPEC's sm_80 cubin, compiled once (in this session's environment). The
    tests below start from a copy of it instead of each running nvcc for that same first build
    (what they check is the build after it: a rebuild, or a cache hit)."""
    root = tmp_path_factory.mktemp("spec-built") / "cache"
    compile_kernel(SPEC, "sm_80", cache=CubinCache(root))
    return root


def _copy_of(built: Path, tmp_path: Path, env_var: str | None = None) -> CubinCache:
    """A cache of this test's own holding the entries of `built`; an empty one when the
    session's environment sets `env_var` (the shared build then carries that variable's flags,
    not the plain build the test starts from)."""
    if env_var is not None and os.environ.get(env_var):
        return CubinCache(tmp_path / "cache")
    return CubinCache(Path(shutil.copytree(built, tmp_path / "cache")))


@pytest.mark.parametrize("damage", ["truncate", "flip", "json"])
def test_corrupted_entry_is_rebuilt_by_compile(
    tmp_path: Path, spec_built: Path, damage: str
) -> None:
    c = _copy_of(spec_built, tmp_path)
    first = compile_kernel(SPEC, "sm_80", cache=c)
    assert first.cached is True, "the copied entry is served as it is"
    [cubin_p] = c.entries()
    meta_p = cubin_p.with_suffix(".json")
    if damage == "truncate":
        cubin_p.write_bytes(first.cubin[:100])
    elif damage == "flip":
        cubin_p.write_bytes(first.cubin[:-1] + bytes([first.cubin[-1] ^ 0xFF]))
    else:
        meta_p.write_text("{not json")
    again = compile_kernel(SPEC, "sm_80", cache=c)
    assert again.cached is False, "a damaged entry must be rebuilt, not served"
    # same report; not byte-compared: -lineinfo records nvcc's temporary directory
    assert again.report == first.report and again.cubin.startswith(b"\x7fELF")
    assert len(again.cubin) == len(first.cubin)
    assert compile_kernel(SPEC, "sm_80", cache=c).cached is True


# ---- keys ----------------------------------------------------------------------------------
def test_cache_key_changes_with_every_part() -> None:
    parts = ["src", "-O3 -cubin", "sm_80", "release 13.0, V13.0.88", "0.1.0"]
    base = cache_key(*parts)
    assert len(base) == 64 and int(base, 16) >= 0
    assert cache_key(*parts) == base
    for i in range(len(parts)):
        changed = list(parts)
        changed[i] += "x"
        assert cache_key(*changed) != base, f"part {i} is not in the key"


def test_cache_key_parts_do_not_run_together() -> None:
    assert cache_key("ab", "c") != cache_key("a", "bc")
    assert cache_key("a", "") != cache_key("a")


@given(st.lists(st.text(max_size=8), max_size=4), st.lists(st.text(max_size=8), max_size=4))
def test_cache_keys_are_equal_only_for_equal_parts(a: list[str], b: list[str]) -> None:
    assert (cache_key(*a) == cache_key(*b)) == (a == b)


# ---- what the compile key covers: one test per ingredient ---------------------------------------
FAKE_NVCC = Path("/opt/fake/nvcc")


@pytest.fixture
def key_of(monkeypatch: pytest.MonkeyPatch) -> Any:
    """compile_key of SPEC for sm_80 with the base flags (nvcc's version faked: no nvcc)."""
    monkeypatch.setattr(compile_mod, "nvcc_version", lambda nvcc: "release 13.0, V13.0.88")
    for var in compile_mod.NVCC_ENV_FLAGS:
        monkeypatch.delenv(var, raising=False)

    def key(rendered: RenderedKernel | None = None, flags: list[str] | None = None) -> str:
        flags = flags if flags is not None else [*compile_mod.BASE_FLAGS, "-cubin"]
        return compile_mod.compile_key(rendered or render(SPEC), "sm_80", flags, FAKE_NVCC)

    return key


def test_key_covers_the_template_text(key_of: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    base = key_of()
    env = render_mod.environment()
    name = SPEC.fam.template
    text = env.loader.get_source(env, name)[0]  # type: ignore[union-attr]
    edited = jinja2.Environment(
        loader=jinja2.ChoiceLoader(
            [jinja2.DictLoader({name: text.replace("{", "// edited\n{", 1)}), env.loader]
        ),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True,
    )  # fmt: skip
    monkeypatch.setattr(render_mod, "environment", lambda: edited)
    assert key_of(render(SPEC)) != base


def test_key_covers_the_command_line_flags(key_of: Any) -> None:
    base = key_of()
    assert key_of(flags=[*compile_mod.BASE_FLAGS, "-cubin", "-DX=1"]) != base
    assert key_of(flags=[*compile_mod.BASE_FLAGS, "-cubin"]) == base


@pytest.mark.parametrize(
    "var",
    [
        "NVCC_APPEND_FLAGS",
        "NVCC_PREPEND_FLAGS",
        "NVCC_CCBIN",  # nvcc's host compiler, which preprocesses the device code too
        "PTXAS_FLAGS",  # nvcc.profile's: appended to ptxas' flags
        "CUDAFE_FLAGS",
        "INCLUDES",
        "SYSTEM_INCLUDES",
        "CPATH",  # the host preprocessor's include path
        "CPLUS_INCLUDE_PATH",
    ],
)
def test_key_covers_nvcc_environment_flags(
    key_of: Any, monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    base = key_of()
    monkeypatch.setenv(var, "-Xptxas=-O0")
    assert key_of() != base


def test_key_covers_the_arch(key_of: Any) -> None:
    flags = [*compile_mod.BASE_FLAGS, "-cubin"]
    a = compile_mod.compile_key(render(SPEC), "sm_80", flags, FAKE_NVCC)
    assert compile_mod.compile_key(render(SPEC), "sm_90", flags, FAKE_NVCC) != a


def test_key_covers_the_nvcc_version(key_of: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    base = key_of()
    monkeypatch.setattr(compile_mod, "nvcc_version", lambda nvcc: "release 13.0, V13.0.89")
    assert key_of() != base


def test_key_covers_the_report_parser_version(
    key_of: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = key_of()
    monkeypatch.setattr(compile_mod, "PARSER_VERSION", "another parser")
    assert key_of() != base


def test_key_covers_the_flashgen_version(key_of: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    base = key_of()
    monkeypatch.setattr(compile_mod, "flashgen_version", lambda: "0.1.0+another")
    assert key_of() != base


def test_flashgen_version_is_a_digest_of_the_code_not_a_constant(tmp_path: Path) -> None:
    pkg = Path(compile_mod.__file__).resolve().parents[1]
    assert re.fullmatch(
        rf"{re.escape(compile_mod.__version__)}\+[0-9a-f]{{16}}", compile_mod.flashgen_version()
    )
    copy = tmp_path / "flashgen"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = compile_mod._tree_digest(copy)
    (copy / "generator" / "__pycache__").mkdir(exist_ok=True)
    (copy / "generator" / "__pycache__" / "x.pyc").write_bytes(b"bytecode")
    assert compile_mod._tree_digest(copy) == before, "bytecode is not code"
    tpl = copy / "templates" / "simt.cu.j2"
    tpl.write_text(tpl.read_text() + "\n")
    assert compile_mod._tree_digest(copy) != before


def test_parser_version_is_a_digest_of_the_parser() -> None:
    source = Path(report_mod.__file__).read_bytes()
    assert hashlib.sha256(source).hexdigest()[:16] == report_mod.PARSER_VERSION


def test_appended_nvcc_flags_rebuild_instead_of_serving_the_old_cubin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec_built: Path
) -> None:
    """The reported bug: with -Xptxas=-O0 appended, the cache returned the -O3 cubin."""
    c = _copy_of(spec_built, tmp_path, "NVCC_APPEND_FLAGS")
    monkeypatch.delenv("NVCC_APPEND_FLAGS", raising=False)
    optimized = compile_kernel(SPEC, "sm_80", cache=c)
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-Xptxas=-O0")
    plain = compile_kernel(SPEC, "sm_80", cache=c)
    assert plain.cached is False and plain.cubin != optimized.cubin
    assert compile_kernel(SPEC, "sm_80", cache=c).cached is True
    assert len(c.entries()) == 2


def test_ptxas_flags_from_the_environment_rebuild_instead_of_serving_the_old_cubin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec_built: Path
) -> None:
    """The reported bug: nvcc.profile appends $PTXAS_FLAGS to ptxas' flags, and PTXAS_FLAGS=-O0
    builds were served to plain runs and back."""
    c = _copy_of(spec_built, tmp_path, "PTXAS_FLAGS")
    monkeypatch.delenv("PTXAS_FLAGS", raising=False)
    plain = compile_kernel(SPEC, "sm_80", cache=c)
    monkeypatch.setenv("PTXAS_FLAGS", "-O0")
    o0 = compile_kernel(SPEC, "sm_80", cache=c)
    assert o0.cached is False and o0.cubin != plain.cubin
    monkeypatch.delenv("PTXAS_FLAGS")
    assert compile_kernel(SPEC, "sm_80", cache=c).cubin == plain.cubin


# ---- concurrent builders -------------------------------------------------------------------
N_PROCS = 8


def _build_in_process(name: str, barrier: Any, out: Any) -> None:
    """Child process: wait for every sibling, then compile into FLASHGEN_CACHE_DIR."""
    try:
        barrier.wait(timeout=120)
        ck = compile_kernel(KernelSpec.from_name(name), "sm_80")
        out.put((ck.cached, ck.cubin, ck.report.to_dict()))
    except BaseException as exc:  # reported to the parent, which fails the test
        out.put(("error", f"{type(exc).__name__}: {exc}", None))


@pytest.mark.compile_all  # nvcc-heavy: runs with the compile-everything check
def test_eight_processes_build_once_and_all_get_the_same_cubin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nvcc_required: Path
) -> None:
    root = tmp_path / "shared-cache"
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(root))  # inherited by the spawned children
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(N_PROCS)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_build_in_process, args=(SPEC.name, barrier, out))
        for _ in range(N_PROCS)
    ]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in range(N_PROCS):
            results.append(out.get(timeout=300))
    except queue.Empty:
        pytest.fail(f"only {len(results)} of {N_PROCS} builders answered within 300 s")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    errors = [r[1] for r in results if r[0] == "error"]
    assert not errors, errors
    assert [r[0] for r in results].count(False) == 1, "exactly one process may run nvcc"
    cubins = {r[1] for r in results}
    assert len(cubins) == 1, "every process must get the same bytes"
    cubin = cubins.pop()
    assert cubin.startswith(b"\x7fELF") and SPEC.name.encode() in cubin
    assert all(r[2] == results[0][2] for r in results)
    c = CubinCache(root)
    assert len(c.entries()) == 1
    hit = c.get(c.entries()[0].stem)  # an entry's file stem is its key
    assert hit is not None and hit[0] == cubin
