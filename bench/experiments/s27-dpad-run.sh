#!/bin/bash
# bench/experiments/s27-dpad-run.sh check|bench: the wgmma backward at head dims that are not a
# multiple of 64 (d a multiple of 8 up to 128, run at d rounded up to 64; issue 25's "d 96" bar
# item; bench/experiments/wgmma-bwd-head-dims.patch, CPU-proven only: bench/NOTES.md, twenty-sixth
# session). Two device calls, from the repo root with .whl carried:
#   check: bwd_check.sh on the patch (test_backward + test_torch_backward, wgmma ids: the probes at
#          d 96/72/40 and the feature probes at d 96/80, torch rows at d 72/96 through wgmma;
#          sanitizers (initcheck too) with a d 96 case; the bundle), then test_varlen's gradient
#          cases (d 72/96 added) and test_hooks_torch's d 72 case (a hooked wgmma backward now)
#          on the patch, 8 shards. -> $OUT/check/, $OUT/dpad-check.txt, $OUT/dpad-varlen.txt
#   bench: scripts/bwd_sweep.py --peers at d 96, T 4096/16384, causal and not, bf16 and fp16, FA2
#          through SDPA beside each row (`flashgen bench --d` takes only 64/128/256): the bar is
#          >= 1.0x FA2 in every row. -> $OUT/bench.txt, $OUT/bench96.json
set -u
E=bench/experiments
t0=$SECONDS
case ${1:?check or bench} in
check)
  timeout 420 bash scripts/dev/bwd_check.sh $E/wgmma-bwd-head-dims.patch > "$OUT/dpad-check.txt" 2>&1
  echo "check rc=$? at $((SECONDS - t0)) s"; tail -20 "$OUT/dpad-check.txt"
  FLASHGEN_REQUIRE_GPU=1 timeout $((580 - (SECONDS - t0))) bash scripts/dev/patch_run.sh dpad \
    $E/wgmma-bwd-head-dims.patch -- bash scripts/dev/pytest_shards.sh 8 /tmp/dpadv \
    tests/gpu/test_varlen.py tests/gpu/test_hooks_torch.py -k "grad or d72" > "$OUT/dpad-varlen.txt" 2>&1
  echo "varlen rc=$? at $((SECONDS - t0)) s"; tail -8 "$OUT/dpad-varlen.txt" ;;
bench)
  N=flash_bwd_wgmma_d96_br64_bc128  # `flashgen bench --d` takes only 64/128/256: the sweep script
  FLASHGEN_REQUIRE_GPU=1 timeout 570 bash scripts/dev/patch_run.sh dpadb $E/wgmma-bwd-head-dims.patch -- \
    python3 scripts/bwd_sweep.py "$OUT/bench96.json" ${N}_bf16_noncausal_s2 ${N}_bf16_causal_s2 \
    ${N}_fp16_noncausal_s2 ${N}_fp16_causal_s2 --t 4096,16384 --peers > "$OUT/bench.txt" 2>&1
  echo "bench rc=$? at $((SECONDS - t0)) s"; tail -30 "$OUT/bench.txt" ;;
esac
