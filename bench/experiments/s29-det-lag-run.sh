#!/bin/bash
# bench/experiments/s29-det-lag-run.sh: one GPU call (~6 min) for wgmma-bwd-det-release-lag.patch:
# the deterministic wgmma backward releases a query tile's semaphore DET_LAG reduces after its add
# (wait_group DET_LAG) instead of at the next reduce (main: DET_LAG 1), hypothesis (a) of
# s29-det-profile.sh (run that first: if its stall samples sit on the fences or the spin rather
# than on the bulk wait, this is the wrong lever). CPU: the protocol model at lags 1-3 (order kept,
# no deadlock), 0 spills at d 64/96/128 incl. softcap/ALiBi/window (168/240 registers).
#   1. tests/gpu/test_backward.py + test_torch_backward.py -k deterministic on the patched tree
#      (oracle, bit-identical runs), 8 shards: $OUT/lag-tests.txt; stops on a failure or hang.
#   2. bwd_ab.sh 3 rounds: base (lag 1) vs the patch (lag 2) vs lag 3 (the same patch, sed), the
#      four bf16 d 64/128 deterministic names beside the fast ones. Bar (issue 25's, for the
#      record): deterministic >= 0.9x fast. -> $OUT/ab-report.txt
set -u
E=bench/experiments
P=$E/wgmma-bwd-det-release-lag.patch
sed 's/^+DET_LAG = 2$/+DET_LAG = 3/' $P > $E/wgmma-bwd-det-release-lag3.patch
grep -q '^+DET_LAG = 3$' $E/wgmma-bwd-det-release-lag3.patch || echo "lag3 sed failed"
t0=$SECONDS
FLASHGEN_REQUIRE_GPU=1 timeout 200 bash scripts/dev/patch_run.sh lag $P -- bash scripts/dev/pytest_shards.sh 8 \
  /tmp/lagt tests/gpu/test_backward.py tests/gpu/test_torch_backward.py -k deterministic > "$OUT/lag-tests.txt" 2>&1
rc=$?
echo "tests rc=$rc at $((SECONDS - t0)) s"; tail -9 "$OUT/lag-tests.txt"
[ $rc -eq 0 ] || exit 1
EXTRA_NAMES="flash_bwd_wgmma_d64_br64_bc128_bf16_noncausal_deterministic_s3 flash_bwd_wgmma_d64_br64_bc128_bf16_causal_deterministic_s3 flash_bwd_wgmma_d128_br64_bc128_bf16_noncausal_deterministic_s2 flash_bwd_wgmma_d128_br64_bc128_bf16_causal_deterministic_s2" \
  timeout $((580 - (SECONDS - t0))) bash scripts/dev/bwd_ab.sh 3 $P $E/wgmma-bwd-det-release-lag3.patch > "$OUT/lag-ab.txt" 2>&1
echo "ab rc=$? at $((SECONDS - t0)) s"; tail -18 "$OUT/lag-ab.txt"
