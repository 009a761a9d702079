"""Shared test setup: Hypothesis profiles and the nvcc requirement.

The cubin cache is deliberately *not* redirected here: the compile tests use the user's cache
(FLASHGEN_CACHE_DIR or ~/.cache/flashgen) so that a warm rerun takes seconds; tests about the
cache itself build their own `CubinCache` in a temporary directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _nvcc import require_nvcc  # tests/ is on sys.path (pytest's rootdir-relative import)
from hypothesis import settings

from flashgen.generator.strategies import profile_name, register_profiles

# Profiles named in DESIGN.md (dev, ci, thorough), defined once in flashgen's strategies module
# so the test suite and `flashgen fuzz` agree; deadline=None everywhere, since a first render or
# an nvcc call can take far longer than Hypothesis' default 200 ms without anything being wrong.
register_profiles()
try:
    _PROFILE = profile_name()
except ValueError as exc:
    raise pytest.UsageError(str(exc)) from None
settings.load_profile(_PROFILE)


@pytest.fixture(scope="session")
def nvcc_required() -> Path:
    """The nvcc to use; skip the test without one, or fail it under FLASHGEN_REQUIRE_NVCC=1.

    Session-scoped, so it is resolved once, before any test patches PATH to hide nvcc.
    """
    return require_nvcc()
