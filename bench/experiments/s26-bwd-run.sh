#!/bin/bash
# bench/experiments/s26-bwd-run.sh [ab|tests|br128]: three GPU calls (~6-9 min each) for the backward patches
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
#   br128: wgmma-bwd-d64-br128.patch (d 64 at 128 x 128, FA3/FA4's tile; a helper's port, CPU only:
#          0 spills, 674 instructions per 128 queries unmasked vs ~916 for two 64-row steps):
#          tests/gpu/test_backward.py -k br128 (its two probes and window/ALiBi feature probes vs
#          the float64 oracle, 8 shards), racecheck + synccheck on one probe,
#          then bwd_ab.sh 3 with the br128 names beside the shipped ones (base has no br128:
#          read the patched tree's br128 rows against its br64 rows): $OUT/br128-tests.txt, ab-br128.txt.
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
br128)
  FLASHGEN_REQUIRE_GPU=1 timeout 260 bash scripts/dev/patch_run.sh br128 $E/wgmma-bwd-d64-br128.patch -- \
    bash scripts/dev/pytest_shards.sh 8 /tmp/br128t tests/gpu/test_backward.py -k br128 > "$OUT/br128-tests.txt" 2>&1
  echo "br128 tests rc=$? at $((SECONDS - t0)) s"; tail -12 "$OUT/br128-tests.txt"
  # racecheck and synccheck on the 128-row tile (a review's ask: per-consumer dQ halves, a 16 KB
  # reduce and bar 2 + c every step; q257 x GQA 4 wraps the ring and both dS^T buffers)
  for tool in racecheck synccheck; do
    FLASHGEN_REQUIRE_GPU=1 timeout 120 bash scripts/dev/patch_run.sh br128 $E/wgmma-bwd-d64-br128.patch -- \
      compute-sanitizer --tool $tool --error-exitcode 3 python3 scripts/bwd_sanitize.py 'd64_br128&q257k129' \
      > "$OUT/br128-$tool.txt" 2>&1
    echo "br128 $tool rc=$?"; tail -2 "$OUT/br128-$tool.txt"
  done
  EXTRA_NAMES="flash_bwd_wgmma_d64_br128_bc128_bf16_causal_s2 flash_bwd_wgmma_d64_br128_bc128_bf16_noncausal_s2" \
    timeout $((585 - (SECONDS - t0))) bash scripts/dev/bwd_ab.sh 3 $E/wgmma-bwd-d64-br128.patch > "$OUT/ab-br128.txt" 2>&1
  echo "ab rc=$? at $((SECONDS - t0)) s"; tail -12 "$OUT/ab-br128.txt" ;;
esac
