"""`cache clear` and concurrent compiles: a work folder in use is never pulled from under nvcc."""

from __future__ import annotations

import fcntl
import os

import pytest

from flashgen.generator import compile as comp


@pytest.fixture
def private_root(tmp_path, monkeypatch):
    monkeypatch.setattr(comp, "shared_temp_dir", lambda name: tmp_path / name)
    monkeypatch.setattr(comp, "_work_fallback", None)
    return comp.nvcc_work_root()


def test_a_folder_whose_compile_holds_the_lock_survives_clear(private_root) -> None:
    busy = private_root / "ab0123"
    busy.mkdir()
    fd = os.open(private_root / "lock-ab", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what _work_folder holds while nvcc runs
    try:
        leftover = private_root / "cd4567"  # left by a killed run: nobody holds lock-cd
        leftover.mkdir()
        comp.clear_work_root()
        assert busy.is_dir() and not leftover.exists()
    finally:
        os.close(fd)
    comp.clear_work_root()
    assert not private_root.exists()  # once nothing is in use, clear leaves nothing


def test_a_compile_after_a_concurrent_clear_recreates_the_root(private_root) -> None:
    comp.clear_work_root()
    assert not private_root.exists()
    with comp._work_folder("ef" + "0" * 18) as work:
        assert work.is_dir() and work.parent == private_root
