#!/bin/bash
# bench/experiments/s25-bwd-run.sh: one GPU call (~9.5 min) for two backward patches (issue 25), each
# from main, found on the CPU (bench/NOTES.md, twenty-fifth session):
# - wgmma-bwd-desc64.patch: every wgmma descriptor held as 64-bit (one descriptor of the aligned
#   base plus constants), so ptxas moves each with one UIADD3.64 instead of re-moving both high
#   words (UMOV 90 -> 7 a step). Loops: d64 causal 671 -> 623, non-causal 574 -> 525 (0 spills);
#   d128 causal 702 -> 672, non-causal 598 -> 568 but d128 spills 64 / 28 B.
# - wgmma-bwd-dk-carry.patch: the step no longer ends with wgmma.wait_group 0 (FA3 and FA4 drain
#   there): dK stays in flight while the next step's S^T is issued behind it, then a wait for dK
#   alone frees its Q slot (as early as before); dO's slot is freed at the step's end (dV has
#   landed). dK reads dS^T from shared memory (SS: the buffer dQ reads) so ds_frag is free under it
#   (with dS^T in registers ptxas serialized every wgmma at d128, C7512). 0 spills, no C75xx,
#   loops +5..+24 instructions.
# Run from the repo root, .whl carried:  bash bench/experiments/s25-bwd-run.sh
# 1. scripts/dev/bwd_ab.sh 3: base vs both patches, the four bf16 rows, 3 interleaved rounds: $OUT/ab.txt.
# 2. scripts/dev/bwd_check.sh on dk-carry (oracle tests, sanitizers, bundle) while time is left.
set -u
E=bench/experiments
t0=$SECONDS
timeout 330 bash scripts/dev/bwd_ab.sh 3 $E/wgmma-bwd-desc64.patch $E/wgmma-bwd-dk-carry.patch > "$OUT/ab.txt" 2>&1
echo "ab rc=$? at $((SECONDS - t0)) s"; tail -15 "$OUT/ab.txt"
timeout $((585 - (SECONDS - t0))) bash scripts/dev/bwd_check.sh $E/wgmma-bwd-dk-carry.patch > "$OUT/check.txt" 2>&1
echo "check rc=$? at $((SECONDS - t0)) s"; tail -25 "$OUT/check.txt"
