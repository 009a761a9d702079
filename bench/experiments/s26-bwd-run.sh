#!/bin/bash
# bench/experiments/s26-bwd-run.sh: one GPU call (~9.5 min) for the two backward patches readied in
# session 25 (issue 25; bench/NOTES.md, twenty-fifth session). Run from the repo root, .whl carried:
#   bash bench/experiments/s26-bwd-run.sh
# 1. wgmma-bwd-varlen-ld-ring.patch (the varlen backward's D/LSE rows in the ring, as the dense
#    kernels' since 09e37d8): tests/gpu/test_varlen.py (forward + gradients vs the float64 oracle),
#    8 shards: $OUT/varlen-tests.txt. Land if green (then a varlen backward A/B, scripts/varlen_bench.py).
# 2. wgmma-bwd-dk-carry.patch (d 64 only: dK in flight into the next step): bwd_ab.sh 3 rounds on the
#    four bf16 rows (d128 renders are unchanged: their ratios are the noise), $OUT/ab.txt; then its
#    bwd_check (oracle tests, sanitizers, bundle) while time is left. Land if d64 still gains.
set -u
E=bench/experiments
t0=$SECONDS
FLASHGEN_REQUIRE_GPU=1 timeout 200 bash scripts/dev/patch_run.sh vlring $E/wgmma-bwd-varlen-ld-ring.patch -- \
  bash scripts/dev/pytest_shards.sh 8 /tmp/vlring tests/gpu/test_varlen.py > "$OUT/varlen-tests.txt" 2>&1
echo "varlen tests rc=$? at $((SECONDS - t0)) s"; tail -10 "$OUT/varlen-tests.txt"
timeout 240 bash scripts/dev/bwd_ab.sh 3 $E/wgmma-bwd-dk-carry.patch > "$OUT/ab.txt" 2>&1
echo "ab rc=$? at $((SECONDS - t0)) s"; tail -10 "$OUT/ab.txt"
timeout $((585 - (SECONDS - t0))) bash scripts/dev/bwd_check.sh $E/wgmma-bwd-dk-carry.patch > "$OUT/check.txt" 2>&1
echo "check rc=$? at $((SECONDS - t0)) s"; tail -12 "$OUT/check.txt"
