#!/bin/bash
# bench/experiments/s27-det-run.sh check|ab: the deterministic wgmma backward (issue 25's bar item;
# bench/experiments/wgmma-bwd-deterministic.patch, CPU-proven only: bench/NOTES.md, twenty-sixth
# session). Two device calls, from the repo root with .whl carried:
#   check: bwd_check.sh on the patch (~4 min): test_backward + test_torch_backward, wgmma ids (the
#          eight shipped deterministic variants against the oracle and bit-identical on three runs,
#          window/softcap probes, the two-process test), then memcheck/racecheck/synccheck on two
#          deterministic cases (d 128 non-causal, d 64 causal) beside the old four, and the
#          bundle. A shard that times out (300 s) is a semaphore wait that never ended: read its
#          log before anything else. -> $OUT/check/, $OUT/det-check.txt
#   ab:    bwd_ab.sh 3 rounds, base vs the patch, the four bf16 deterministic names beside the
#          shipped ones (~6 min). The bar is the patched tree's deterministic rows over its fast
#          rows (>= 0.9 each, T 4096 and 16384); base vs patch on the fast names is the control
#          (their renders are byte-identical). -> $OUT/det-ab.txt, $OUT/ab-*.json
set -u
E=bench/experiments
t0=$SECONDS
case ${1:?check or ab} in
check)
  timeout 560 bash scripts/dev/bwd_check.sh $E/wgmma-bwd-deterministic.patch > "$OUT/det-check.txt" 2>&1
  echo "check rc=$? at $((SECONDS - t0)) s"; tail -25 "$OUT/det-check.txt" ;;
ab)
  EXTRA_NAMES="flash_bwd_wgmma_d64_br64_bc128_bf16_noncausal_deterministic_s3 flash_bwd_wgmma_d64_br64_bc128_bf16_causal_deterministic_s3 flash_bwd_wgmma_d128_br64_bc128_bf16_noncausal_deterministic_s2 flash_bwd_wgmma_d128_br64_bc128_bf16_causal_deterministic_s2" \
    timeout 585 bash scripts/dev/bwd_ab.sh 3 $E/wgmma-bwd-deterministic.patch > "$OUT/det-ab.txt" 2>&1
  echo "ab rc=$? at $((SECONDS - t0)) s"; tail -25 "$OUT/det-ab.txt" ;;
esac
