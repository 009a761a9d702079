#!/bin/bash
# bench/experiments/s26-bwd-run.sh [ab|tests]: two GPU calls (~6 and ~8 min) for the backward patches
# readied in session 25 (issue 25; bench/NOTES.md, twenty-fifth session). Run from the repo root,
# .whl carried:  bash bench/experiments/s26-bwd-run.sh ab; then: bash bench/experiments/s26-bwd-run.sh tests
#   ab:    bwd_ab.sh 3 rounds, base vs wgmma-bwd-dk-carry (d 64 only: dK in flight into the next
#          step; the d128 rows are unchanged renders: their ratios are the noise) vs
#          wgmma-bwd-causal-lpt (causal blocks longest first in L2 sections; a list-scheduling
#          model: +6.6% at T 4096, +0.9% at 16384; non-causal SASS identical): $OUT/ab.txt
#   tests: bwd_check.sh on both patches together (wgmma-bwd-carry-lpt.patch: the two, merged;
#          oracle tests, sanitizers, bundle), then
#          tests/gpu/test_varlen.py on wgmma-bwd-varlen-ld-ring (the varlen backward's D/LSE rows in
#          the ring), 8 shards: $OUT/check.txt, $OUT/varlen-tests.txt. Land what is green and faster.
set -u
E=bench/experiments
t0=$SECONDS
case ${1:?ab or tests} in
ab)
  timeout 560 bash scripts/dev/bwd_ab.sh 3 $E/wgmma-bwd-dk-carry.patch $E/wgmma-bwd-causal-lpt.patch > "$OUT/ab.txt" 2>&1
  echo "ab rc=$? at $((SECONDS - t0)) s"; tail -10 "$OUT/ab.txt" ;;
tests)
  timeout 330 bash scripts/dev/bwd_check.sh $E/wgmma-bwd-carry-lpt.patch > "$OUT/check.txt" 2>&1
  echo "check rc=$? at $((SECONDS - t0)) s"; tail -12 "$OUT/check.txt"
  FLASHGEN_REQUIRE_GPU=1 timeout $((580 - (SECONDS - t0))) bash scripts/dev/patch_run.sh vlring \
    $E/wgmma-bwd-varlen-ld-ring.patch -- bash scripts/dev/pytest_shards.sh 8 /tmp/vlring \
    tests/gpu/test_varlen.py > "$OUT/varlen-tests.txt" 2>&1
  echo "varlen tests rc=$? at $((SECONDS - t0)) s"; tail -10 "$OUT/varlen-tests.txt" ;;
esac
