#!/bin/bash
# bench/experiments/s33f-no-few-blocks-run.sh (carry .whl; ~4 min): decode-no-few-blocks-with-combine.patch
# -- with the merge kernel (sm_90, splits > 1) the call keeps the default 4-warp variant instead of
# the 8-warp few-blocks one (s33e: the default with automatic splits beat the automatic choice by
# x1.04-1.19 on five short rows). 1. decode tests, 8 shards, patched; 2. 3 interleaved A/B rounds.
set -u
P=bench/experiments/decode-no-few-blocks-with-combine.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
t0=$SECONDS
FLASHGEN_REQUIRE_GPU=1 timeout 110 bash scripts/dev/patch_run.sh nfb $P -- bash scripts/dev/pytest_shards.sh 8 /tmp/nfb-t \
  tests/gpu/test_decode.py tests/gpu/test_api_kvcache.py > $OUT/nfb-tests.txt 2>&1
echo "tests rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/nfb-tests.txt
grep -E "^shard|FAILED|ERROR" $OUT/nfb-tests.txt | tail -10
ROWS="1,4096,8,1,1;1,32768,8,1,1;1,4096,32,8,1;8,4096,8,1,1;8,4096,32,8,1;32,4096,8,1,1;8,32768,8,1,4"
ROWS=$ROWS OUT=/tmp/dab timeout $((330 - (SECONDS - t0))) bash scripts/dev/decode_ab.sh 3 $P | tee $OUT/nfb-ab.txt
echo "done at $((SECONDS - t0)) s"
