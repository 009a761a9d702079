#!/usr/bin/env bash
# The wgmma backward on the GPU host, in one step: `scripts/wgmma_bwd_check.sh OUTDIR`
#   1. tests/gpu/test_backward.py -k wgmma: the WGMMA_PROBES against the float64 oracle
#      (FlashAttention's gradient rule; ragged, Tq != Tk, causal rows with no key, GQA, strided);
#   2. tests/gpu/test_torch_backward.py with FLASHGEN_WGMMA_BWD=1 (autograd through
#      flashgen.torch picks the wgmma backward where it applies);
#   3. compute-sanitizer memcheck, racecheck and synccheck on wgmma backward cases (short, ring-
#      wrapping, features) through scripts/bwd_sanitize.py;
#   4. scripts/bwd_sweep.py: TFLOP/s of wgmma backward variants beside the mma one and SDPA's
#      FA2 backward (bf16, d 64/128, causal and not, T 4096/16384).
# Writes OUTDIR/wgmma-bwd.txt (summary) and OUTDIR/bwd-sweep.json.
set -uo pipefail
out=${1:?usage: scripts/wgmma_bwd_check.sh OUTDIR}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py=${PYTHON:-python3}
mkdir -p "$out"
sum="$out/wgmma-bwd.txt"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" FLASHGEN_REQUIRE_GPU=1
cd "$root"
$py -m pytest -q -p no:cacheprovider tests/gpu/test_backward.py -k wgmma >/tmp/wb-tests.log 2>&1
echo "test_backward -k wgmma: $(tail -n1 /tmp/wb-tests.log)" | tee -a "$sum"
grep -h "^FAILED\|^ERROR\|Error" /tmp/wb-tests.log | head -8 | tee -a "$sum"
FLASHGEN_WGMMA_BWD=1 $py -m pytest -q -p no:cacheprovider tests/gpu/test_torch_backward.py >/tmp/wb-torch.log 2>&1
echo "test_torch_backward (FLASHGEN_WGMMA_BWD=1): $(tail -n1 /tmp/wb-torch.log)" | tee -a "$sum"
grep -h "^FAILED\|^ERROR" /tmp/wb-torch.log | head -5 | tee -a "$sum"
# outside pytest (scripts/bwd_sanitize.py): a short problem, one whose 20 steps per block wrap
# the Q/dO ring, and two feature cases
cases="wgmma_d128_br64_bc128_bf16_noncausal_s2&B2H2kv2q97k131 wgmma_d128_br64_bc128_bf16_noncausal_s2&B1H8kv2q257k129 wgmma_d128&window_softcap&257 wgmma_d64&alibi&257"
for tool in memcheck racecheck synccheck; do
  # shellcheck disable=SC2086
  compute-sanitizer --tool $tool --error-exitcode 3 $py scripts/bwd_sanitize.py $cases >/tmp/wb-$tool.log 2>&1
  echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/wb-$tool.log | tail -n1) $(tail -n1 /tmp/wb-$tool.log)" | tee -a "$sum"
done
names=""
for c in causal noncausal; do
  for d in 64 128; do
    names="$names flash_bwd_mma_d${d}_br64_bc64_bf16_${c}_w4_s$([ $d = 64 ] && echo 2 || echo 1)"
    names="$names flash_bwd_wgmma_d${d}_br64_bc128_bf16_${c}_s2 flash_bwd_wgmma_d${d}_br64_bc64_bf16_${c}_s2"
  done
done
$py scripts/bwd_sweep.py "$out/bwd-sweep.json" $names --peers >/tmp/wb-sweep.log 2>&1
grep -v '^{' /tmp/wb-sweep.log | tail -n 30 | tee -a "$sum"
