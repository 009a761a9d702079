#!/bin/bash
# bench/experiments/next-queue-3.sh: the second GPU call of the session after the nineteenth:
# A/B (3 interleaved rounds, forward and forward + backward) of the four hook patches on the
# mask rows (scripts/dev/mask_rows.py; ~8 min). Their GPU tests: next-queue-4.sh. Run from the
# repo root (carry .whl):
#   bash bench/experiments/next-queue-3.sh
set -u
E=bench/experiments
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
timeout 570 bash scripts/dev/mask_ab.sh 3 --bwd $E/wgmma-hook-mask-bits-early.patch \
  $E/wgmma-bwd-hook-mask-bits-early.patch $E/wgmma-bwd-producer-warp-walk.patch \
  $E/wgmma-br192-mask-hooks.patch > "$OUT/ab.txt" 2>&1; echo "A/B rc=$? at $SECONDS s"
grep -v "done at" "$OUT/ab.txt"
