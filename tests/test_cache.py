"""The cubin cache: hits and misses, corruption recovery, fallback dir, concurrent builders."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import queue
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashgen.generator import compile as compile_mod
from flashgen.generator.cache import CubinCache, cache_dir, cache_key, default_cache_dir
from flashgen.generator.compile import compile_kernel
from flashgen.generator.spec import KernelSpec

KEY = cache_key("source", "flags", "sm_80", "nvcc 13.0", "0.1.0")
DATA = b"\x7fELF" + bytes(range(256)) * 4
SPEC = KernelSpec(family="simt", d=16, br=16, bc=16, dtype="bf16", causal=False)


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
    """Point the cache at `bad`, check the warning and the fallback, return the fallback."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # keep the fallback inside tmp_path
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(bad))
    with pytest.warns(UserWarning, match="is not writable; using .*FLASHGEN_CACHE_DIR"):
        root = cache_dir()
    assert root.parent == tmp and root != bad
    assert os.access(root, os.W_OK)
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
    _expect_fallback(monkeypatch, tmp_path, blocker / "cache")


def test_compile_with_an_unwritable_cache_dir_still_works(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nvcc_required: Path
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    root = _expect_fallback(monkeypatch, tmp_path, blocker / "cache")
    with pytest.warns(UserWarning, match="not writable"):
        ck = compile_kernel(SPEC, "sm_80")
    assert ck.cubin.startswith(b"\x7fELF")
    assert any(p.suffix == ".cubin" for p in root.rglob("*"))


# ---- recovery through compile_kernel -------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncate", "flip", "json"])
def test_corrupted_entry_is_rebuilt_by_compile(
    tmp_path: Path, nvcc_required: Path, damage: str
) -> None:
    c = CubinCache(tmp_path)
    first = compile_kernel(SPEC, "sm_80", cache=c)
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


def test_compile_key_covers_nvcc_and_flashgen_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nvcc_required: Path
) -> None:
    c = CubinCache(tmp_path)
    assert compile_kernel(SPEC, "sm_80", cache=c).cached is False
    assert compile_kernel(SPEC, "sm_80", cache=c).cached is True
    monkeypatch.setattr(compile_mod, "nvcc_version", lambda nvcc: "release 99.9, V99.9.0")
    assert compile_kernel(SPEC, "sm_80", cache=c).cached is False, "nvcc version not in key"
    monkeypatch.setattr(compile_mod, "__version__", "999.0")
    assert compile_kernel(SPEC, "sm_80", cache=c).cached is False, "flashgen version not in key"
    assert len(c.entries()) == 3


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
