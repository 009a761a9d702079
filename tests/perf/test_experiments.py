"""bench/experiments/ keeps only template patches that still apply to the tree (an experiment
that no longer applies is history: git keeps it, bench/NOTES.md keeps its result)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCHES = sorted((ROOT / "bench" / "experiments").glob("*.patch"))


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_experiment_patch_still_applies(patch: Path) -> None:
    done = subprocess.run(
        ["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, (
        f"{patch.name} no longer applies ({done.stderr.strip()}); port it to the tree or "
        "delete it (its result stays in bench/NOTES.md)"
    )
