"""Tests that need nvcc: skipped with the reason when it is absent, a failure when
FLASHGEN_REQUIRE_NVCC=1 (CI sets it, so a broken nvcc install cannot turn the suite green).

Use `@requires_nvcc` on a test, call `require_nvcc()` inside one, or import the `nvcc`
fixture (`from _nvcc import nvcc  # noqa: F401`) and take it as an argument.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from flashgen.generator.nvcc import NvccNotFound, find_nvcc

REQUIRE_ENV = "FLASHGEN_REQUIRE_NVCC"

F = TypeVar("F", bound=Callable[..., Any])


def nvcc_is_required() -> bool:
    """True when the environment demands nvcc (FLASHGEN_REQUIRE_NVCC set, and not to 0)."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def require_nvcc() -> Path:
    """The nvcc flashgen would use; skip the calling test without one, or fail when required."""
    try:
        return find_nvcc()
    except NvccNotFound as exc:
        if nvcc_is_required():
            pytest.fail(f"{REQUIRE_ENV}=1 but nvcc is unusable: {exc}", pytrace=False)
        pytest.skip(f"needs nvcc ({exc}); set {REQUIRE_ENV}=1 to make this a failure")


def requires_nvcc(fn: F) -> F:
    """Decorator: run `require_nvcc()` before the test (fixture arguments pass through)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        require_nvcc()
        return fn(*args, **kwargs)

    return cast(F, wrapper)


@pytest.fixture
def nvcc() -> Path:
    """Fixture form of `require_nvcc()`: the path of nvcc."""
    return require_nvcc()
