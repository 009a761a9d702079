"""The GPU tier's own machinery, on a CPU: FLASHGEN_REQUIRE_GPU's values, pinned failures."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashgen.generator.features import SOFTCAP
from flashgen.generator.space import shipped
from flashgen.runtime import gpu as runtime
from flashgen.verify.cases import feature_pairs
from flashgen.verify.strategies import PINNED_FAILURES, pinned_cases

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"


def _conftest():
    spec = importlib.util.spec_from_file_location("gpu_conftest", GPU_DIR / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("value", "required"),
    [
        ("1", True), ("true", True), ("TRUE", True), ("Yes", True), ("on", True), (" 1 ", True),
        ("0", False), ("false", False), ("no", False), ("off", False), ("", False),
    ],
)  # fmt: skip
def test_require_gpu_accepts_the_usual_true_values(
    monkeypatch: pytest.MonkeyPatch, value: str, required: bool
) -> None:
    monkeypatch.setenv("FLASHGEN_REQUIRE_GPU", value)
    assert _conftest().gpu_required() is required


@pytest.mark.skipif(runtime.gpu_status() is None, reason="a GPU is present: nothing to refuse")
def test_require_gpu_true_stops_a_run_without_a_gpu() -> None:
    env = {**os.environ, "FLASHGEN_REQUIRE_GPU": "True"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
         str(GPU_DIR / "test_cai.py")],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]  # a usage error
    assert "FLASHGEN_REQUIRE_GPU is set but no GPU is usable" in proc.stdout + proc.stderr


def test_every_variant_runs_the_pinned_thorough_failure() -> None:
    case = PINNED_FAILURES[0]
    assert (case.b, case.h, case.tq, case.tk, case.scale, case.seed) == (1, 1, 1, 1, 0.5, 11242)
    for spec in shipped():
        # a softcap variant runs it with a cap (its tanh has no "off"); the problem is the same
        capped = dataclasses.replace(case, features=feature_pairs(softcap=SOFTCAP.check_value))
        want = capped if "softcap" in spec.features else case
        assert want in pinned_cases(spec)
