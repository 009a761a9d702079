"""`cache clear` and concurrent compiles: a work folder in use is never pulled from under nvcc."""

from __future__ import annotations

import fcntl
import os
import threading
import warnings

import pytest

from flashgen.generator import compile as comp
from flashgen.generator.cache import FlashgenWarning, ensure_private_dir


@pytest.fixture
def private_root(tmp_path, monkeypatch):
    monkeypatch.setattr(comp, "shared_temp_dir", lambda name: tmp_path / name)
    monkeypatch.setattr(comp, "_work_fallback", None)
    return comp.nvcc_work_root()


def test_a_folder_whose_compile_holds_the_lock_survives_clear(private_root) -> None:
    busy = private_root / "ab0123"
    busy.mkdir()
    fd = os.open(private_root / "ab0123.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what _work_folder holds while nvcc runs
    try:
        leftover = private_root / "cd4567"  # left by a killed run: nobody holds its lock
        leftover.mkdir()
        comp.clear_work_root()
        assert busy.is_dir() and not leftover.exists()
        assert (private_root / "ab0123.lock").exists()
    finally:
        os.close(fd)
    comp.clear_work_root()
    assert not private_root.exists()  # once nothing is in use, clear leaves nothing


def test_a_compile_after_a_concurrent_clear_recreates_the_root(private_root) -> None:
    comp.clear_work_root()
    assert not private_root.exists()
    with comp._work_folder("ef" + "0" * 30) as (work, waited):
        assert work.is_dir() and work.parent == private_root
        assert waited < 1


def test_runs_of_other_content_never_share_a_lock(private_root) -> None:
    """One lock per content digest (there were 256 shared ones: a hung run held up every
    run whose digest began with the same two hex digits)."""
    waits = []

    def other_run() -> None:
        with comp._work_folder("ab" + "1" * 30) as (_, waited):
            waits.append(waited)

    with comp._work_folder("ab" + "0" * 30):  # a run that takes long
        t = threading.Thread(target=other_run, daemon=True)
        t.start()
        t.join(timeout=10)
        assert waits and waits[0] < 1, "a run of other content waited for this one"


def test_a_work_root_removed_mid_check_is_made_again_not_replaced(
    private_root, monkeypatch
) -> None:
    """A `cache clear` removed the root between its mkdir and its check: that used to move the
    process to a random work folder (and non-reproducible cubins) for good."""
    calls = []

    def vanishing(path, **kw):
        calls.append(path)
        if len(calls) == 1:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return ensure_private_dir(path, **kw)

    monkeypatch.setattr(comp, "ensure_private_dir", vanishing)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlashgenWarning)
        assert comp.nvcc_work_root() == private_root
    assert comp._work_fallback is None and len(calls) == 2
