"""Shared test setup: a temporary cubin cache, Hypothesis profiles and the nvcc requirement.

The suite never writes into the user's cubin cache: each session gets a fresh temporary
FLASHGEN_CACHE_DIR, removed at the end. FLASHGEN_TEST_CACHE_DIR=<folder> uses that folder
instead (kept; e.g. a warm cache for the GPU tier, which compiles every variant it runs).

`compile_all` tests (every shipped variant through nvcc, minutes of CPU) are deselected by
the default addopts in pyproject.toml; `python -m pytest -m compile_all` runs them.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from _nvcc import require_nvcc  # tests/ is on sys.path (pytest's rootdir-relative import)
from hypothesis import settings

from flashgen.verify.strategies import profile_name, register_profiles

# Profiles named in docs/design.md (dev, ci, thorough), defined once in flashgen's strategies module
# so the test suite and `flashgen fuzz` agree; deadline=None everywhere, since a first render or
# an nvcc call can take far longer than Hypothesis' default 200 ms without anything being wrong.
register_profiles()
try:
    _PROFILE = profile_name()
except ValueError as exc:
    raise pytest.UsageError(str(exc)) from None
settings.load_profile(_PROFILE)

TEST_CACHE_ENV = "FLASHGEN_TEST_CACHE_DIR"
_session_cache: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Point FLASHGEN_CACHE_DIR at this session's cache before any test runs."""
    global _session_cache
    chosen = os.environ.get(TEST_CACHE_ENV)
    if chosen:
        os.environ["FLASHGEN_CACHE_DIR"] = chosen
        return
    _session_cache = tempfile.mkdtemp(prefix="flashgen-test-cache-")
    os.environ["FLASHGEN_CACHE_DIR"] = _session_cache


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built out of the cyclic garbage collector.

    The modules, their imports (torch, NumPy, Hypothesis) and the ~3,600 collected items live
    until the session ends, yet every full collection walked all of them again: the default
    run's full collections took ~9 s, ~4 s with them frozen. Objects the tests create afterwards
    are collected as before.
    """
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the session's temporary cache."""
    if _session_cache is not None:
        shutil.rmtree(_session_cache, ignore_errors=True)


@pytest.fixture(scope="session")
def nvcc_required() -> Path:
    """The nvcc to use; skip the test without one, or fail it under FLASHGEN_REQUIRE_NVCC=1.

    Session-scoped, so it is resolved once, before any test patches PATH to hide nvcc.
    """
    return require_nvcc()


@pytest.fixture
def no_pycuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make PyCUDA unimportable (also on a GPU host) and forget any GPU state: flashgen's
    front doors must validate first, then raise one GpuUnavailable."""
    import sys
    import threading

    from flashgen.runtime import gpu as runtime

    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    monkeypatch.setattr(runtime, "_gpu", None)
    monkeypatch.setattr(runtime, "_pushed", threading.local())
