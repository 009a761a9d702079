#!/bin/bash
# bench/experiments/s30-decode-pdl-run.sh: one GPU call (~5 min) for decode-pdl.patch (issue 26's small
# decode rows, 0.69-0.94x SDPA on the H200: fixed latency, not bandwidth -- B1 Tk4k 8/1 9.8 us vs
# 7.3). The decode kernel is launched as a programmatic dependent (cuLaunchKernelEx with
# PROGRAMMATIC_STREAM_SERIALIZATION, sm_90) and waits at `griddepcontrol.wait` before its first
# global read, then triggers its dependents: a call's launch, block placement and prologue overlap
# the previous kernel's tail (in a serving loop: the QKV projection's; in the bench's graph of 20
# calls: the previous decode's). Registers 188 -> 191 at d 128 br 16, 0 spills.
#   1. tests/gpu/test_decode.py, test_api_kvcache.py and test_kvappend.py (graph replays with
#      changing lengths, append then attend) on the patched tree, 8 shards; compute-sanitizer
#      racecheck/memcheck of a few decode calls; a failure stops the script -> $OUT/pdl-tests.txt
#   2. 3 interleaved rounds of scripts/dev/decode_ab.sh on four small rows and two long ones,
#      contiguous and paged 16/256 (graph-timed) -> $OUT/pdl-ab.txt (x = patched / base)
set -u
P=bench/experiments/decode-pdl.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS
FLASHGEN_REQUIRE_GPU=1 timeout 200 bash scripts/dev/patch_run.sh pdl $P -- bash scripts/dev/pytest_shards.sh 8 /tmp/pdlt \
  tests/gpu/test_decode.py tests/gpu/test_api_kvcache.py tests/gpu/test_kvappend.py > "$OUT/pdl-tests.txt" 2>&1
rc=$?
echo "tests rc=$rc at $((SECONDS - t0)) s"; grep -E "^shard|^(FAILED|ERROR)" "$OUT/pdl-tests.txt" | tail -10
[ $rc -eq 0 ] || exit 1
if command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in memcheck racecheck; do
    FLASHGEN_REQUIRE_GPU=1 timeout 120 bash scripts/dev/patch_run.sh pdl $P -- compute-sanitizer --tool $tool \
      --error-exitcode 3 python3 -m pytest -q -x tests/gpu/test_decode.py -k "graph or split_count" \
      >> "$OUT/pdl-tests.txt" 2>&1
    echo "$tool rc=$? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY| passed| failed" "$OUT/pdl-tests.txt" | tail -2
  done
fi
ROWS="1,4096,8,1,1;1,32768,8,1,1;1,4096,32,8,1;8,4096,32,8,1;32,32768,32,8,1;8,131072,32,8,1" \
  timeout 300 bash scripts/dev/decode_ab.sh 3 $P | tee "$OUT/pdl-ab.txt"
echo "done at $((SECONDS - t0)) s"
