#!/bin/bash
# bench/experiments/s34-paged-whole-tiles-run.sh (carry .whl; ~4 min): decode-paged-whole-tiles.patch --
# a paged cache whose pages hold whole 16-key tiles (page_size % 16 == 0: 16, 32, ..., 256) takes
# the contiguous copy path after one page lookup per tile (every lane loads the same table word)
# instead of a lookup per row and 3 shuffles per copy. Why: paged decode runs 0.91-0.94x the
# contiguous one on the short rows (s33 grid), where each warp's instruction chain is the cost.
# CPU: 0 spills on sm_90 (d128 191 -> 197 registers, still 2 blocks an SM). 1. decode + kvcache
# tests, 8 shards (the property suite draws every page size, shuffled tables, bad pages);
# 2. memcheck on the paged tests; 3. 3 interleaved A/B rounds (paged16/paged256 columns).
set -u
P=bench/experiments/decode-paged-whole-tiles.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
t0=$SECONDS
FLASHGEN_REQUIRE_GPU=1 timeout 120 bash scripts/dev/patch_run.sh pwt $P -- bash scripts/dev/pytest_shards.sh 8 /tmp/pwt-t \
  tests/gpu/test_decode.py tests/gpu/test_api_kvcache.py tests/gpu/test_kvappend.py > $OUT/pwt-tests.txt 2>&1
rc=$?; echo "tests rc=$rc at $((SECONDS - t0)) s" | tee -a $OUT/pwt-tests.txt
grep -E "^shard|FAILED|ERROR" $OUT/pwt-tests.txt | tail -10
[ $rc -eq 0 ] || exit 1
FLASHGEN_REQUIRE_GPU=1 timeout 90 bash scripts/dev/patch_run.sh pwt $P -- compute-sanitizer --tool memcheck \
  --error-exitcode 3 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_decode.py -k "oracle or out_of_range or split_count" \
  > /tmp/pwt-memcheck.txt 2>&1
echo "memcheck rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/pwt-tests.txt
grep -E "ERROR SUMMARY| passed| failed" /tmp/pwt-memcheck.txt | head -3 | tee -a $OUT/pwt-tests.txt
ROWS="1,4096,8,1,1;1,4096,32,8,1;8,4096,8,1,1;1,32768,8,1,1;32,32768,32,8,1"
ROWS=$ROWS OUT=/tmp/dab timeout $((320 - (SECONDS - t0))) bash scripts/dev/decode_ab.sh 3 $P | tee $OUT/pwt-ab.txt
echo "done at $((SECONDS - t0)) s"
