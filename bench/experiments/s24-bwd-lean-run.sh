#!/bin/bash
# bench/experiments/s24-bwd-lean-run.sh: one GPU call (~8 min) for wgmma-bwd-lean-step.patch (issue 25,
# the backward's gap to FA4). Found on the CPU (bench/results/cpu-2026-12-05-s24-fa4-sass-side-by-side.txt):
# one step of our wgmma backward was 888 instructions to FA4's 440 at the same 64x128 tile -- R2UR moves
# and descriptor rebuilds at every wgmma (the warpgroup index not known warp-uniform), two run-time
# divisions a step, 64-bit address math per D/LSE load, dQ scaled per step. The patch brings the step to
# 549 (unhooked kernels; the hooked ones take the counting and the dQ scale only: their consumers sit at
# the register limit). Run from the repo root, .whl carried:
#   bash bench/experiments/s24-bwd-lean-run.sh
# 1. scripts/dev/bwd_check.sh: the oracle tests of the wgmma backward and the torch backward (12 shards),
#    memcheck/racecheck and the wgmma-backward bundle, on the patched tree: $OUT/check/.
# 2. scripts/dev/bwd_ab.sh 3: base vs patch, the four bf16 rows (d64/d128 x causal or not), 3 interleaved
#    rounds: $OUT/ab-report.txt (TFLOP/s and the ratio). Issue 25's rows were 0.70-0.77x FA4.
# 3. tests/gpu/test_hooks.py -k wgmma_bwd on the patch, if the call has time left.
set -u
P=bench/experiments/wgmma-bwd-lean-step.patch
t0=$SECONDS
timeout 330 bash scripts/dev/bwd_check.sh $P > "$OUT/check.txt" 2>&1
echo "check rc=$? at $((SECONDS - t0)) s"; tail -25 "$OUT/check.txt"
timeout $((520 - (SECONDS - t0))) bash scripts/dev/bwd_ab.sh 3 $P > "$OUT/ab.txt" 2>&1
echo "ab rc=$? at $((SECONDS - t0)) s"; tail -15 "$OUT/ab.txt"
# 3. The hooked backward (the patch gives it the counting and the post-kernel dQ scale), while time is
#    left; otherwise the next call: tests/gpu/test_hooks.py -k wgmma_bwd on the patched tree.
if [ $((SECONDS - t0)) -lt 470 ]; then
  timeout $((575 - (SECONDS - t0))) bash scripts/dev/patch_run.sh lean $P -- bash scripts/dev/pytest_shards.sh 8 \
    /tmp/s24hb tests/gpu/test_hooks.py -k wgmma_bwd > "$OUT/hooks.txt" 2>&1
  echo "hooked bwd tests rc=$? at $((SECONDS - t0)) s"; tail -10 "$OUT/hooks.txt"
else
  echo "no time left for the hooked backward tests: run them next"
fi
