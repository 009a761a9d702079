"""examples/ring/train.py under torchrun on the CPU: two gloo ranks train a small model with
ring attention; the first step equals one process's whole-sequence step (loss and gradients),
and the loss falls."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[2]


def test_ring_example_trains_under_torchrun() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    script = str(ROOT / "examples" / "ring" / "train.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", script, "--check", "--steps", "25"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "check: one process's loss" in r.stdout
    m = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", r.stdout)
    assert m, r.stdout
    first, last = float(m.group(1)), float(m.group(2))
    assert last < 0.5 * first, r.stdout
