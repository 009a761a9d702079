#!/bin/bash
# bench/experiments/s28-bwd-combo-run.sh check|varlen|ab|bench: the two CPU-proven wgmma backward
# patches merged (bench/experiments/wgmma-bwd-head-dims-deterministic.patch = head-dims "dpad": d a
# multiple of 8 up to 128, run at DP = d rounded up to 64; + deterministic "det": int32 semaphores
# after the dQ accumulator order its bulk reduces, key tiles from the last down). Neither has run on
# a GPU; this is s27-det-run.sh and s27-dpad-run.sh on the merge (where the semaphores sit after a
# DP-wide accumulator and their index is tile / (BR * DP)). One device call each, from the repo
# root with .whl carried; each stays under 580 s.
#   check:  bwd_check.sh on the merge (timeout 560): test_backward + test_torch_backward, wgmma ids,
#           12 shards of 300 s -- the 8 shipped deterministic variants and the det probes (bc 64,
#           d 96 at DP 128) against the oracle and bit-identical on three runs; the padded probes
#           (d 96/72/40/24) with NaN in dO's pad columns and no gradient column past d written;
#           window/softcap det and d 96/80 feature probes; torch rows at d 64/96/128/72, fast and
#           deterministic (on sm_90 the d 96/72 deterministic rows now run wgmma's det variant at
#           DP 128); the two-process bit-identity test -- then memcheck/racecheck/synccheck/
#           initcheck on 7 cases (the old four, d 96, two deterministic) and the bundle (one
#           gpu_check.sh call, 240 s). If >= 150 s are left: test_varlen's gradient cases (d 72/96)
#           and test_hooks_torch's d 72 case, 8 shards, as `varlen` below; else run `varlen`.
#           -> $OUT/check/, $OUT/combo-check.txt (, $OUT/combo-varlen.txt)
#   varlen: that second step alone (timeout 560): dpad's varlen and hooked paths (det refuses both,
#           so only dpad's code runs there; the merge must leave them as dpad had them).
#           -> $OUT/combo-varlen.txt
#   ab:     bwd_ab.sh 3 rounds, base vs the merge, the four bf16 d 64/128 deterministic names beside
#           the shipped fast ones (~6 min, as s27-det ab). The bar: the merged tree's deterministic
#           rows over its fast rows >= 0.9 at T 4096 and 16384; base vs merge on the fast names is
#           the control (their renders are byte-identical to dpad's, and at d 64/128 dpad's SASS is
#           main's). -> $OUT/combo-ab.txt, $OUT/ab-*.json, $OUT/ab-report.txt
#   bench:  d 96 through scripts/bwd_sweep.py --peers in the merged tree (`flashgen bench --d` takes
#           only 64/128/256, so s27-dpad-run.sh's `bench` stops at click's usage error): fast bf16
#           and fp16, causal and not, and bf16 deterministic, at T 4096/16384 (B*T 16384, H 21),
#           FA2 through SDPA beside each (d, dtype, causal). Bars: fast >= 1.0x FA2 in every row
#           (issue 25's d 96 item); deterministic >= 0.9x the fast row. -> $OUT/bench96.json, .txt
# Reading a timeout: a test shard that ends at its 300 s timeout (pytest-N.log with no summary line;
# `check` prints each shard's last line) is, in a deterministic test, a semaphore wait that never
# ended (a wrong index or `want`, or a block waiting on one dispatched after it): read that log's
# last test id before anything else. rc 124 for a whole step means its own cap (560 s) hit:
# compare the shards' `tests: N s` line and summaries. bwd_check.sh gives the sanitizers and the
# bundle one gpu_check.sh call, 240 s here (GC_TIMEOUT; 7 cases x 4 tools, 5 x 4 or 6 x 3 in s27): if
# it is cut off, sanitize.txt / sanitize-bwd-*.log stop at the case that was running -- a
# deterministic case there may be a hang as above, any other one compute-sanitizer's cost.
set -u
E=bench/experiments
P=$E/wgmma-bwd-head-dims-deterministic.patch
t0=$SECONDS
varlen_step() {  # $1: seconds it may take
  FLASHGEN_REQUIRE_GPU=1 timeout "$1" bash scripts/dev/patch_run.sh combo $P -- \
    bash scripts/dev/pytest_shards.sh 8 /tmp/combov tests/gpu/test_varlen.py \
    tests/gpu/test_hooks_torch.py -k "grad or d72" > "$OUT/combo-varlen.txt" 2>&1
  echo "varlen rc=$? at $((SECONDS - t0)) s"; tail -8 "$OUT/combo-varlen.txt"
}
case ${1:?check, varlen, ab or bench} in
check)
  GC_TIMEOUT=240 timeout 560 bash scripts/dev/bwd_check.sh $P > "$OUT/combo-check.txt" 2>&1
  echo "check rc=$? at $((SECONDS - t0)) s"; tail -25 "$OUT/combo-check.txt"
  left=$((575 - (SECONDS - t0)))
  if [ "$left" -ge 150 ]; then varlen_step "$left"
  else echo "varlen: skipped ($left s left); run: bash $E/s28-bwd-combo-run.sh varlen"; fi ;;
varlen)
  varlen_step 560 ;;
ab)
  EXTRA_NAMES="flash_bwd_wgmma_d64_br64_bc128_bf16_noncausal_deterministic_s3 flash_bwd_wgmma_d64_br64_bc128_bf16_causal_deterministic_s3 flash_bwd_wgmma_d128_br64_bc128_bf16_noncausal_deterministic_s2 flash_bwd_wgmma_d128_br64_bc128_bf16_causal_deterministic_s2" \
    timeout 570 bash scripts/dev/bwd_ab.sh 3 $P > "$OUT/combo-ab.txt" 2>&1
  echo "ab rc=$? at $((SECONDS - t0)) s"; tail -25 "$OUT/combo-ab.txt" ;;
bench)
  N=flash_bwd_wgmma_d96_br64_bc128
  FLASHGEN_REQUIRE_GPU=1 timeout 570 bash scripts/dev/patch_run.sh combob $P -- \
    python3 scripts/bwd_sweep.py "$OUT/bench96.json" ${N}_bf16_noncausal_s2 ${N}_bf16_causal_s2 \
    ${N}_fp16_noncausal_s2 ${N}_fp16_causal_s2 ${N}_bf16_noncausal_deterministic_s2 \
    ${N}_bf16_causal_deterministic_s2 --t 4096,16384 --peers > "$OUT/bench96.txt" 2>&1
  echo "bench rc=$? at $((SECONDS - t0)) s"; tail -22 "$OUT/bench96.txt" ;;
esac
