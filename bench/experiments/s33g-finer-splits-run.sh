#!/bin/bash
# bench/experiments/s33g-finer-splits-run.sh (carry .whl; ~3 min): decode-finer-splits.patch -- with the
# merge kernel (sm_90) and automatic splits, 2 key tiles per warp instead of 4 when every block
# still has an SM to itself (s33e: B1 Tk4k 8/1 best at 32-64 splits, auto took 16). 1. decode
# tests, 8 shards, patched; 2. 3 interleaved A/B rounds on the short rows.
set -u
P=bench/experiments/decode-finer-splits.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
t0=$SECONDS
FLASHGEN_REQUIRE_GPU=1 timeout 110 bash scripts/dev/patch_run.sh fs $P -- bash scripts/dev/pytest_shards.sh 8 /tmp/fs-t \
  tests/gpu/test_decode.py tests/gpu/test_api_kvcache.py > $OUT/fs-tests.txt 2>&1
echo "tests rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/fs-tests.txt
grep -E "^shard|FAILED|ERROR" $OUT/fs-tests.txt | tail -10
ROWS="1,4096,8,1,1;1,32768,8,1,1;1,4096,32,8,1;8,4096,8,1,1;32,4096,8,1,1"
ROWS=$ROWS OUT=/tmp/dab timeout $((280 - (SECONDS - t0))) bash scripts/dev/decode_ab.sh 3 $P | tee $OUT/fs-ab.txt
echo "done at $((SECONDS - t0)) s"
