#!/usr/bin/env bash
# Issue 6's GPU evidence, on the GPU host (project importable: PYTHONPATH=checkout, PyCUDA):
#   scripts/robustness_check.sh OUTDIR
# 1. tests/gpu/test_robustness.py: NaN/inf inputs against the float64 oracle, extreme scales,
#    more than 2**31 elements in one tensor, ten bitwise-equal runs   -> OUTDIR/robustness.log
# 2. scripts/largest_t.py: the longest K/V one launch handles (d=128 bf16), rows checked
#                                                                   -> OUTDIR/largest-t.json
# The summary (last lines of stdout, also OUTDIR/robustness-summary.txt) says what passed;
# the exit status is nonzero when anything failed.
set -uo pipefail
out=${1:?usage: scripts/robustness_check.sh OUTDIR}
py=${PYTHON:-python3}
mkdir -p "$out"
summary=$out/robustness-summary.txt
: >"$summary"
export FLASHGEN_REQUIRE_GPU=1 FLASHGEN_HYPOTHESIS_PROFILE=${FLASHGEN_HYPOTHESIS_PROFILE:-ci}
status=0

t0=$(date +%s)
$py -m pytest -q -p no:cacheprovider tests/gpu/test_robustness.py >"$out/robustness.log" 2>&1
rc=$?
[ $rc = 0 ] || status=1
grep -E "^(FAILED|ERROR)" "$out/robustness.log" | head -40 >>"$summary"
echo "robustness tests: rc=$rc $(tail -n1 "$out/robustness.log") ($(($(date +%s) - t0)) s)" >>"$summary"

t0=$(date +%s)
$py scripts/largest_t.py "$out/largest-t.json" >"$out/largest-t.log" 2>&1
rc=$?
[ $rc = 0 ] || status=1
echo "largest T: rc=$rc $(tail -n1 "$out/largest-t.log") ($(($(date +%s) - t0)) s)" >>"$summary"

echo "robustness_check status=$status" >>"$summary"
cat "$summary"
exit $status
