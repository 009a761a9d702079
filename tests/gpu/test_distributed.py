"""flashgen.distributed on one GPU: rings of 2 and 4 gloo ranks, every rank on this GPU, with
flashgen's kernels per step (FlashgenBlocks: strided query/key views, the backward with the
whole attention's O and LSE) -- scripts/ring_check.py's correctness rows (bf16, d 128, H 16,
H_kv 16 and 4, causal and not) against the float64 oracle, within twice the single-GPU
kernel's error. The NCCL rows and the timing need several GPUs (docs/distributed.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("world", [2, 4])
def test_ring_on_one_gpu_matches_the_oracle(world: int, tmp_path: Path) -> None:
    out = tmp_path / "ring.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={world}", str(ROOT / "scripts" / "ring_check.py"), str(out),
           "--backend", "gloo", "--skip-bench", "--t", "4096"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert out.exists(), r.stderr[-3000:]
    rows = json.loads(out.read_text())["correctness"]
    assert len(rows) == 4 * world
    bad = [row for row in rows if not row["pass"]]
    assert not bad, json.dumps(bad, indent=1)
    assert r.returncode == 0, r.stderr[-3000:]
