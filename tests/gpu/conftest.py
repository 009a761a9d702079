"""The GPU tier: skipped cleanly without PyCUDA or a CUDA device, compiled up front.

Every test here is marked `gpu`. Without a usable GPU each one is reported as skipped with the
reason (never errored); with FLASHGEN_REQUIRE_GPU=1 (or true, yes, on in any case) a missing
GPU stops the run instead, so a broken PyCUDA on the GPU host cannot pass for a green suite.
The variants the selected tests need are compiled in parallel once, before the first test, so
the suite is bound by the GPU.

FLASHGEN_GPU_SUMMARY=path writes a JSON summary of the property run (GPU, variants, examples,
worst error/bound per variant) at the end of the session.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flashgen.generator.compile import CompiledKernel
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.verify.checks import VariantResult, compile_all
from flashgen.verify.strategies import gpu_examples, profile_name

HERE = Path(__file__).parent
RESULTS: list[VariantResult] = []


def _in_gpu_tier(item: pytest.Item) -> bool:
    return HERE in Path(str(item.path)).parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this folder's tests `gpu`; skip them (or stop, if required) without a GPU."""
    mine = [item for item in items if _in_gpu_tier(item)]
    if not mine:
        return
    for item in mine:
        item.add_marker(pytest.mark.gpu)
    shard = _shard()
    if shard is not None:
        # FLASHGEN_GPU_SHARD=i/n keeps every n-th test (from the i-th): parallel processes on
        # one GPU split the suite (scripts/gpu_check.sh), each writing its own summary.
        i, n = shard
        keep = [it for j, it in enumerate(mine) if j % n == i]
        dropped = [it for it in mine if it not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [it for it in items if it not in dropped]
        mine = keep
    reason = runtime.gpu_status()
    if reason is None:
        return
    if gpu_required():
        raise pytest.UsageError(f"FLASHGEN_REQUIRE_GPU is set but no GPU is usable: {reason}")
    skip = pytest.mark.skip(reason=f"no usable GPU: {reason}")
    for item in mine:
        item.add_marker(skip)


TRUE_VALUES = ("1", "true", "yes", "on")


def gpu_required() -> bool:
    """FLASHGEN_REQUIRE_GPU holds one of the usual true values (1/true/yes/on, any case)."""
    return os.environ.get("FLASHGEN_REQUIRE_GPU", "").strip().lower() in TRUE_VALUES


def _shard() -> tuple[int, int] | None:
    raw = os.environ.get("FLASHGEN_GPU_SHARD")
    if not raw:
        return None
    try:
        i, n = (int(x) for x in raw.split("/"))
    except ValueError:
        raise pytest.UsageError(f"FLASHGEN_GPU_SHARD={raw!r}: expected i/n, e.g. 0/8") from None
    if not 0 <= i < n:
        raise pytest.UsageError(f"FLASHGEN_GPU_SHARD={raw!r}: need 0 <= i < n")
    return i, n


@pytest.fixture(scope="session")
def compiled(request: pytest.FixtureRequest) -> dict[KernelSpec, CompiledKernel | Exception]:
    """Every variant the selected tests use, compiled in parallel for this GPU."""
    specs = []
    for item in request.session.items:
        spec = getattr(item, "callspec", None) and item.callspec.params.get("spec")
        if isinstance(spec, KernelSpec) and spec not in specs:
            specs.append(spec)
    return compile_all(specs)


@pytest.fixture(scope="session")
def record() -> Any:
    """Collects each variant's property result for the end-of-session summary."""
    return RESULTS.append


def _summary() -> dict[str, Any]:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE, check=False
        ).stdout.strip()
    except OSError:
        sha = ""
    gpu = runtime.gpu()
    passed = [r for r in RESULTS if r.passed]
    finite = [r.worst_ratio for r in RESULTS if math.isfinite(r.worst_ratio)]
    return {
        "commit": sha,
        "gpu": str(gpu.device.name()),
        "arch": gpu.arch,
        "driver": gpu.drv.get_driver_version(),
        "profile": profile_name(),
        "random_examples_per_variant": gpu_examples(),
        "variants": len(RESULTS),
        "passed": len(passed),
        "failed": len(RESULTS) - len(passed),
        "examples": sum(r.examples for r in RESULTS),
        "worst_ratio": max(finite, default=0.0),
        "per_variant": [
            {
                "variant": r.spec.name,
                "examples": r.examples,
                "worst_ratio": r.worst_ratio if math.isfinite(r.worst_ratio) else None,
                "passed": r.passed,
                "failure": r.failure,
            }
            for r in RESULTS
        ],
    }


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per family: variants, examples and the worst error/bound of the property run."""
    if not RESULTS:
        return
    terminalreporter.section("flashgen property suite")
    for family in sorted({r.spec.family for r in RESULTS}):
        rs = [r for r in RESULTS if r.spec.family == family]
        worst = max(rs, key=lambda r: r.worst_ratio)
        terminalreporter.write_line(
            f"{family}: {len(rs)} variants, {sum(r.passed for r in rs)} passed, "
            f"{sum(r.examples for r in rs)} examples, worst error/bound "
            f"{worst.worst_ratio:.3f} ({worst.spec.name})"
        )
    path = os.environ.get("FLASHGEN_GPU_SUMMARY")
    if path:
        Path(path).write_text(json.dumps(_summary(), indent=1) + "\n")
        terminalreporter.write_line(f"summary written to {path}")
