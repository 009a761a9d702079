#!/bin/bash
# bench/experiments/next-queue-3.sh: the second GPU call of the session after the nineteenth:
# A/B (3 interleaved rounds, forward and forward + backward) of the three hook patches on the
# mask rows, then each patched tree's GPU tests while the call has time (the rest: a second
# call of the test loop below). Run from the repo root (carry .whl):
#   bash bench/experiments/next-queue-3.sh
set -u
E=bench/experiments
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
t0=$SECONDS
timeout 420 bash scripts/dev/mask_ab.sh 3 --bwd $E/wgmma-bwd-producer-warp-walk.patch \
  $E/wgmma-br192-mask-hooks.patch $E/wgmma-hook-mask-bits-early.patch > "$OUT/ab.txt" 2>&1; echo "A/B rc=$? at $((SECONDS - t0)) s"
grep -v "done at" "$OUT/ab.txt"
for p in wgmma-hook-mask-bits-early wgmma-bwd-producer-warp-walk wgmma-br192-mask-hooks; do
  left=$((570 - (SECONDS - t0))); [ $left -lt 60 ] && { echo "$p: no time for tests"; continue; }
  (cd /tmp/mask-ab/$p && FLASHGEN_REQUIRE_GPU=1 PYTHONPATH=/tmp/site:/tmp/mask-ab/$p \
    FLASHGEN_CACHE_DIR=/tmp/mask-ab-cache-$p timeout $left bash scripts/dev/pytest_shards.sh 8 \
    /tmp/q3-$p tests/gpu/test_hooks.py tests/gpu/test_hooks_torch.py -k "wgmma or torch" \
    > "$OUT/tests-$p.txt" 2>&1); echo "$p tests rc=$? at $((SECONDS - t0)) s"; tail -9 "$OUT/tests-$p.txt"
done
