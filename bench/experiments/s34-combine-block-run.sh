#!/bin/bash
# bench/experiments/s34-combine-block-run.sh (carry .whl; ~5 min): decode-combine-256.patch and
# decode-combine-512.patch -- the merge kernel's block at 256 / 512 threads instead of 128 (more
# subs over a row's splits: at 256 splits a 128-thread block walks 32 splits per thread in 8
# dependent rounds of L2 loads; the combine has one block per row, 8 blocks at B1 8/1), and the
# final sum over subs bounded by the split count. CPU: 60-64 registers, 17/33 KB static shared
# memory, no local memory. 1. tests/gpu/test_decode.py for each tree (8 shards); 2. 3 interleaved
# A/B rounds vs main on the rows with many splits, B8 Tk4k 32/8 (4 splits) as the control.
set -u
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
t0=$SECONDS
for n in 256 512; do
  FLASHGEN_REQUIRE_GPU=1 timeout 100 bash scripts/dev/patch_run.sh cb$n bench/experiments/decode-combine-$n.patch -- \
    bash scripts/dev/pytest_shards.sh 8 /tmp/cb$n-t tests/gpu/test_decode.py > $OUT/cb$n-tests.txt 2>&1
  echo "tests $n rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/cb-tests.txt
  grep -E "^shard|FAILED|ERROR" $OUT/cb$n-tests.txt | tail -9 | tee -a $OUT/cb-tests.txt
done
ROWS="1,131072,8,1,1;1,32768,8,1,1;1,4096,8,1,1;1,4096,32,8,1;8,32768,8,1,4;8,4096,32,8,1"
ROWS=$ROWS OUT=/tmp/dab timeout $((560 - (SECONDS - t0))) bash scripts/dev/decode_ab.sh 3 \
  bench/experiments/decode-combine-256.patch bench/experiments/decode-combine-512.patch | tee $OUT/cb-ab.txt
echo "done at $((SECONDS - t0)) s"
