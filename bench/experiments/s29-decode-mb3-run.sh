#!/bin/bash
# bench/experiments/s29-decode-mb3-run.sh: one GPU call (~5 min) for decode-min-blocks-3.patch
# (issue 26's long-cache decode rows, 0.91-0.94x SDPA on the H200 in s24): the d <= 128, 16-row,
# 4-warp decode variants built for 3 blocks per SM (168 registers, 0 spills; main: 188, 2 blocks),
# so half again as many key tiles are in flight per SM, and the split count follows.
#   1. tests/gpu/test_decode.py + test_api_kvcache.py on the patched tree, 8 shards: stop on a failure.
#   2. 3 interleaved rounds of scripts/dev/decode_ab.sh on four long rows and two short ones,
#      contiguous and paged 16/256: $OUT/dab-*.json, the table last (x = patched / base).
set -u
P=bench/experiments/decode-min-blocks-3.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
FLASHGEN_REQUIRE_GPU=1 timeout 200 bash scripts/dev/patch_run.sh mb3 $P -- bash scripts/dev/pytest_shards.sh 8 /tmp/mb3t \
  tests/gpu/test_decode.py tests/gpu/test_api_kvcache.py > "$OUT/mb3-tests.txt" 2>&1
rc=$?
echo "tests rc=$rc at $((SECONDS - t0)) s"; tail -6 "$OUT/mb3-tests.txt"
[ $rc -eq 0 ] || exit 1
ROWS="32,32768,32,8,1;8,131072,32,8,1;32,131072,8,1,1;8,32768,32,8,1;1,32768,8,1,1;8,4096,32,8,1" \
  timeout 330 bash scripts/dev/decode_ab.sh 3 $P | tee "$OUT/mb3-ab.txt"
echo "done at $((SECONDS - t0)) s"
