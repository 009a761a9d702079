#!/bin/bash
# bench/experiments/s32e-decode-bulk-run.sh (carry .whl; ~5.5 min): decode-bulk-kv.patch -- on sm_90
# the decode ring's K/V rows land by one cp.async.bulk per row (the lane that owns the row),
# counted on a per-slot mbarrier, instead of 16-byte cp.async (whose LSU split read 1.5x the L2
# sectors). 1. decode tests (test_decode, test_api_kvcache, test_kvappend), 8 shards;
# 2. memcheck + racecheck on the oracle/paged/graph tests; 3. 3 interleaved A/B rounds.
set -u
P=bench/experiments/decode-bulk-kv.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/bulk-tests.txt
FLASHGEN_REQUIRE_GPU=1 timeout 110 bash scripts/dev/patch_run.sh bulk $P -- bash scripts/dev/pytest_shards.sh 8 /tmp/bulk-t \
  tests/gpu/test_decode.py tests/gpu/test_api_kvcache.py tests/gpu/test_kvappend.py >> $OUT/bulk-tests.txt 2>&1
rc=$?; echo "tests rc=$rc at $((SECONDS - t0)) s" | tee -a $OUT/bulk-tests.txt
grep -E "^shard|FAILED|ERROR" $OUT/bulk-tests.txt | tail -12
[ $rc -eq 0 ] || { tar czf $OUT/bulk-raw.tgz /tmp/bulk-t* 2>/dev/null; exit 1; }
for tool in memcheck racecheck; do
  FLASHGEN_REQUIRE_GPU=1 timeout 60 bash scripts/dev/patch_run.sh bulk $P -- compute-sanitizer --tool $tool \
    --error-exitcode 3 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_decode.py -k "oracle or graph or out_of_range" \
    > /tmp/bulk-$tool.txt 2>&1
  echo "$tool rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/bulk-tests.txt
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY| passed| failed|Error:" /tmp/bulk-$tool.txt | head -4 | tee -a $OUT/bulk-tests.txt
done
ROWS="1,4096,8,1,1;1,32768,8,1,1;1,4096,32,8,1;8,4096,32,8,1;32,32768,32,8,1;8,32768,8,1,4"
ROWS=$ROWS OUT=/tmp/dab timeout $((330 - (SECONDS - t0))) bash scripts/dev/decode_ab.sh 3 $P | tee $OUT/bulk-ab.txt
echo "done at $((SECONDS - t0)) s"
