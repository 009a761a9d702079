#!/bin/bash
# bench/experiments/s25-bwd-desc64-run.sh: one GPU call (~9 min) for wgmma-bwd-desc64.patch (issue 25).
# Found on the CPU: the lean step still re-moves both descriptor high words into uniform registers at
# every wgmma (UMOV 90 of the d128 causal step's 702 instructions; FA4: 20). The patch holds every
# descriptor as 64-bit: one descriptor of the aligned base plus constants, so ptxas moves a wgmma's
# operands with one UIADD3.64 each. Loop bodies (ptxas 13.0): d64 causal 671 -> 623, d64 non-causal
# 574 -> 525, 0 spills; d128 causal 702 -> 672, non-causal 598 -> 568, but d128 spills 64 / 28 B
# (four to six LDL a step, L1 hits). The A/B says whether either side pays; land per d if it does.
# Run from the repo root, .whl carried:  bash bench/experiments/s25-bwd-desc64-run.sh
# 1. scripts/dev/bwd_ab.sh 3: base vs patch, the four bf16 rows, 3 interleaved rounds: $OUT/ab.txt.
# 2. scripts/dev/bwd_check.sh on the patch (oracle tests, sanitizers, bundle) while time is left.
set -u
P=bench/experiments/wgmma-bwd-desc64.patch
t0=$SECONDS
timeout 330 bash scripts/dev/bwd_ab.sh 3 $P > "$OUT/ab.txt" 2>&1
echo "ab rc=$? at $((SECONDS - t0)) s"; tail -15 "$OUT/ab.txt"
timeout $((575 - (SECONDS - t0))) bash scripts/dev/bwd_check.sh $P > "$OUT/check.txt" 2>&1
echo "check rc=$? at $((SECONDS - t0)) s"; tail -25 "$OUT/check.txt"
