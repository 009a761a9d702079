"""Shared test setup: Hypothesis profiles and the nvcc requirement.

The cubin cache is deliberately *not* redirected here: the compile tests use the user's cache
(FLASHGEN_CACHE_DIR or ~/.cache/flashgen) so that a warm rerun takes seconds; tests about the
cache itself build their own `CubinCache` in a temporary directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _nvcc import require_nvcc  # tests/ is on sys.path (pytest's rootdir-relative import)
from hypothesis import settings

# Profiles named in DESIGN.md. deadline=None everywhere: a first render or an nvcc call can
# take far longer than Hypothesis' default 200 ms without anything being wrong.
settings.register_profile("dev", max_examples=25, deadline=None)
settings.register_profile("ci", max_examples=50, deadline=None, derandomize=True, print_blob=True)
settings.register_profile("thorough", max_examples=500, deadline=None)

_PROFILE = os.environ.get("FLASHGEN_HYPOTHESIS_PROFILE", "dev")
if _PROFILE not in ("dev", "ci", "thorough"):
    raise pytest.UsageError(
        f"FLASHGEN_HYPOTHESIS_PROFILE={_PROFILE!r}: unknown profile; use dev, ci or thorough"
    )
settings.load_profile(_PROFILE)


@pytest.fixture(scope="session")
def nvcc_required() -> Path:
    """The nvcc to use; skip the test without one, or fail it under FLASHGEN_REQUIRE_NVCC=1.

    Session-scoped, so it is resolved once, before any test patches PATH to hide nvcc.
    """
    return require_nvcc()
