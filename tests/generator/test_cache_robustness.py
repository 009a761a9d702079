"""The cubin cache under stress: checksummed metadata, a full disk, `cache clear` beside
builds, bounded comparison of output files (split from test_cache.py)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from _fakenvcc import REGISTERS, fake_nvcc

from flashgen.generator import cache as cache_mod
from flashgen.generator import compile as compile_mod
from flashgen.generator import nvcc as nvcc_mod
from flashgen.generator.cache import (
    CubinCache,
    FlashgenWarning,
    cache_dir,
    cache_key,
)
from flashgen.generator.compile import compile_kernel
from flashgen.generator.spec import KernelSpec

KEY = cache_key("source", "flags", "sm_80", "nvcc 13.0", "0.1.0")
DATA = b"\x7fELF" + bytes(range(256)) * 4
SPEC = KernelSpec(family="simt", d=16, br=16, bc=16, dtype="bf16", causal=False)
SPEC90 = KernelSpec(family="simt", d=16, br=16, bc=16)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()



# ---- metadata is checksummed ---------------------------------------------------------------------
KEY2 = cache_key("another")
REPORT = {"arch": "sm_90", "registers": 40, "static_smem": 0, "stack_frame": 0,
          "spill_stores": 0, "spill_loads": 0}  # fmt: skip


@pytest.mark.parametrize(
    "edit", ["registers", "no-report", "name", "added-field", "no-checksum", "another-key"]
)
def test_edited_metadata_is_a_miss_and_removed(tmp_path: Path, edit: str) -> None:
    """The reported bug: an edited register count was believed (only the cubin was hashed)."""
    c = CubinCache(tmp_path)
    c.put(KEY, DATA, {"name": "k", "report": dict(REPORT)})
    cubin_p, meta_p = c.paths(KEY)
    meta = json.loads(meta_p.read_text())
    if edit == "registers":
        meta["report"]["registers"] = 7
    elif edit == "no-report":
        del meta["report"]
    elif edit == "name":
        meta["name"] = "other"
    elif edit == "added-field":
        meta["note"] = "hand-written"
    elif edit == "no-checksum":
        del meta[cache_mod.ENTRY_SUM]
    meta_p.write_text(json.dumps(meta))
    key = KEY
    if edit == "another-key":  # an intact entry under another key's name
        key = KEY2
        c.paths(KEY2)[0].parent.mkdir(exist_ok=True)
        os.rename(cubin_p, c.paths(KEY2)[0])
        os.rename(meta_p, c.paths(KEY2)[1])
    assert c.get(key) is None
    assert not any(p.exists() for p in c.paths(key)), "a doubtful entry is removed"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fast fake nvcc (FLASHGEN_NVCC) and a system temp folder of this test's own."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("FLASHGEN_NVCC", str(fake_nvcc(tmp_path / "bin")))
    monkeypatch.setattr(compile_mod, "_work_fallback", None)
    nvcc_mod.nvcc_version.cache_clear()
    yield tmp
    nvcc_mod.nvcc_version.cache_clear()


@pytest.mark.parametrize("edit", ["registers", "no-report"])
def test_compile_rebuilds_an_entry_whose_metadata_was_edited(
    tmp_path: Path, fake: Path, edit: str
) -> None:
    c = CubinCache(tmp_path / "cache")
    first = compile_kernel(SPEC90, "sm_90", cache=c)
    [cubin_p] = c.entries()
    meta_p = cubin_p.with_suffix(".json")
    meta = json.loads(meta_p.read_text())
    if edit == "registers":
        meta["report"]["registers"] = 7
    else:
        del meta["report"]  # was a KeyError traceback
    meta_p.write_text(json.dumps(meta))
    again = compile_kernel(SPEC90, "sm_90", cache=c)
    assert again.cached is False and again.report == first.report
    assert again.report.registers == REGISTERS
    assert compile_kernel(SPEC90, "sm_90", cache=c).cached is True


@pytest.mark.parametrize(
    "report",
    [{}, dict(REPORT, registers="40"), dict(REPORT, arch="sm_80"), dict(REPORT, extra=1)],
)
def test_compile_rebuilds_a_checksummed_entry_whose_report_it_cannot_read(
    tmp_path: Path, fake: Path, report: dict[str, Any]
) -> None:
    """An entry written by another flashgen (or by hand, checksum and all): any doubt about its
    report means a rebuild, never a traceback or a wrong number."""
    c = CubinCache(tmp_path / "cache")
    compile_kernel(SPEC90, "sm_90", cache=c)
    key = c.entries()[0].stem
    data, meta = c.get(key) or (b"", {})
    c.put(key, data, {k: v for k, v in meta.items() if k not in ("sha256", cache_mod.ENTRY_SUM)}
          | {"report": report})  # fmt: skip
    again = compile_kernel(SPEC90, "sm_90", cache=c)
    assert again.cached is False and again.report.registers == REGISTERS


# ---- a full disk costs the cache, not the build --------------------------------------------------
def test_a_full_cache_disk_keeps_the_cubin_and_warns_once_with_the_path(
    tmp_path: Path, fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reported bug: `[Errno 28]` (no path) failed the whole call after nvcc succeeded."""
    root = tmp_path / "cache"
    c = CubinCache(root)

    def full(path: Path, data: bytes, **kw: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod, "atomic_write", full)
    with pytest.warns(FlashgenWarning) as record:
        one = compile_kernel(SPEC90, "sm_90", cache=c)
        two = compile_kernel(SPEC90, "sm_90", extra_flags=("-DX=1",), cache=c)
    assert (one.cached, two.cached) == (False, False)
    assert one.cubin.startswith(b"\x7fELF") and one.report.registers == REGISTERS
    [warning] = [w for w in record if "cubin cache" in str(w.message)]  # once per folder
    msg = str(warning.message)
    assert f"cannot write the cubin cache at {root} (no space left on device)" in msg
    assert "FLASHGEN_CACHE_DIR" in msg and "\n" not in msg
    assert c.entries() == []


def test_a_cache_whose_lock_cannot_be_made_still_builds(
    tmp_path: Path, fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder should be")
    with pytest.warns(FlashgenWarning, match=f"cannot write the cubin cache at {blocker}"):
        ck = compile_kernel(SPEC90, "sm_90", cache=CubinCache(blocker))
    assert ck.cubin.startswith(b"\x7fELF") and ck.cached is False


# ---- `cache clear` while others build ------------------------------------------------------------
def test_cache_clear_alongside_builds_fails_none_and_moves_nothing(
    tmp_path: Path, fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reported bug: `cache clear` beside 24 builds made 4 fail (no such file or folder) and
    moved the process to a temporary cache for good. Builds must all succeed, in the
    configured cache and the fixed work folder, however the clears fall."""
    root = tmp_path / "cache"
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(root))
    monkeypatch.setattr(cache_mod, "_fallbacks", {})
    done = threading.Event()
    errors: list[BaseException] = []

    def clear_in_a_loop() -> None:
        while not done.is_set():
            CubinCache().clear()
            compile_mod.clear_work_root()

    def build(i: int) -> None:
        try:
            compile_kernel(SPEC90, "sm_90", extra_flags=(f"-DFLASHGEN_N={i}",))
        except BaseException as exc:  # collected: the test fails on any
            errors.append(exc)

    clearer = threading.Thread(target=clear_in_a_loop)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        clearer.start()
        try:
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(build, range(24)))
        finally:
            done.set()
            clearer.join()
    assert errors == [], [f"{type(e).__name__}: {e}" for e in errors]
    flashgen_warnings = [str(w.message) for w in record if w.category is FlashgenWarning]
    assert flashgen_warnings == []
    assert cache_mod._fallbacks == {} and compile_mod._work_fallback is None
    assert cache_dir() == root


def test_a_cache_folder_removed_mid_check_is_made_again_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A concurrent clear removed the folder between its mkdir and the write probe."""
    root = tmp_path / "cache"
    real = tempfile.NamedTemporaryFile
    calls: list[int] = []

    def vanishing(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            shutil.rmtree(root)
        return real(*args, **kw)

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", vanishing)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a fallback, if any, stays here
    monkeypatch.setattr(cache_mod, "_fallbacks", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlashgenWarning)
        assert cache_mod.usable_cache_dir(root) == root
    assert len(calls) == 2 and root.is_dir()


def _try_flock(path: Path) -> int | None:
    """A descriptor holding `path`'s lock (the file created when missing), or None if held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def test_a_lock_file_removed_while_waited_for_is_replaced_not_shared(tmp_path: Path) -> None:
    """`cache clear` unlinks a lock file under its lock; a builder that was waiting on the old
    file must not hold it, or a later builder would hold the new one at the same time."""
    lock = tmp_path / "k.lock"
    fd = _try_flock(lock)
    assert fd is not None
    got: list[object] = []
    release = threading.Event()

    def waiter() -> None:
        with cache_mod.locked(lock) as waited:
            got.append(waited)
            release.wait(30)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)  # the waiter has opened the old file and waits for it
    lock.unlink()  # what clear does, holding the lock
    os.close(fd)
    for _ in range(100):
        if got:
            break
        time.sleep(0.05)
    try:
        assert got, "the waiter never got the lock"
        assert _try_flock(lock) is None, "two holders of one lock"
    finally:
        release.set()
        t.join()


def test_cache_clear_leaves_an_entry_being_built(tmp_path: Path) -> None:
    c = CubinCache(tmp_path / "cache")
    c.put(KEY, DATA, {})
    c.put(KEY2, DATA, {})
    with c.lock(KEY):
        assert c.clear() == 1
    assert c.get(KEY) is not None and c.get(KEY2) is None


# ---- comparing an output file -----------------------------------------------------------------
def test_holds_bytes_reads_only_regular_files_and_never_more_than_needed(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    assert cache_mod.holds_bytes(f, b"abc")
    assert not cache_mod.holds_bytes(f, b"abd") and not cache_mod.holds_bytes(f, b"ab")
    assert not cache_mod.holds_bytes(tmp_path / "missing", b"")
    link = tmp_path / "link"
    link.symlink_to(f)
    assert not cache_mod.holds_bytes(link, b"abc"), "a symlink is replaced, never compared"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    assert not cache_mod.holds_bytes(fifo, b"")
    assert time.perf_counter() - t0 < 5
