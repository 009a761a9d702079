"""The test suite itself: a temporary cubin cache, and the compile-everything check kept to CI."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from flashgen.generator.cache import CubinCache

REPO = Path(__file__).resolve().parents[2]


def test_the_session_caches_in_a_temporary_folder_not_the_users() -> None:
    if os.environ.get("FLASHGEN_TEST_CACHE_DIR"):
        assert os.environ["FLASHGEN_CACHE_DIR"] == os.environ["FLASHGEN_TEST_CACHE_DIR"]
        return
    root = Path(os.environ["FLASHGEN_CACHE_DIR"])
    assert root.name.startswith("flashgen-test-cache-")
    assert root.parent == Path(tempfile.gettempdir())
    assert CubinCache().root == root
    assert root != Path.home() / ".cache" / "flashgen"


def _collect(*runs: tuple[str, ...]) -> list[str]:
    """`pytest --collect-only -q tests/generator/test_compile.py ARGS` for each ARGS of `runs`,
    in processes started together (their interpreter start-ups overlap); their outputs."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q"]
    procs = [
        subprocess.Popen(
            [*collect, "tests/generator/test_compile.py", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        for args in runs
    ]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, out + err
            outs.append(out)
    finally:
        for proc in procs:  # after a timeout or a failure: none is left running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outs


def test_compile_all_is_deselected_by_default_and_selected_by_its_marker() -> None:
    default, selected = _collect((), ("-m", "compile_all"))
    assert "test_every_shipped_variant_compiles" not in default
    assert "deselected" in default
    lines = [ln for ln in selected.splitlines() if "::" in ln]
    assert any("test_every_shipped_variant_compiles" in ln for ln in lines), lines
    # the nvcc-heavy tests marked beside it leave the default run
    assert not [ln for ln in lines if ln.strip() in default.splitlines()]


def test_ci_runs_the_default_suite_and_the_compile_all_check() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert 'step "python -m pytest -q" python -m pytest -q\n' in ci
    assert "python -m pytest -q -m compile_all" in ci
    assert "FLASHGEN_REQUIRE_NVCC=1" in ci
