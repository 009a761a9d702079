#!/bin/bash
# bench/experiments/s31-decode-swizzle-run.sh: one GPU call (~6 min) for decode-swizzle.patch (issue 26's
# long decode rows, 0.91-0.94x SDPA). ncu (session 31, H100): our decode kernel reads 1.5x the L2
# sectors of the same K and V (201M vs SDPA's 134M at B32 Tk32k 32/8; the extra all L2 hits;
# 2.6x the requests). Cause, by the layout: each shared-memory row is padded by 16 bytes, so
# every other copied row starts off a 128-byte line and a cp.async phase goes out in more
# wavefronts, which fetch their lines' shared sectors again. The patch stores rows of 64 and
# 128 elements unpadded with their 16-byte chunks XOR-swizzled by row % 8 (ldmatrix stays
# conflict-free); other widths keep the pad (their kernels render as before).
#   1. tests/gpu/test_decode.py, test_api_kvcache.py, test_kvappend.py on the patched tree, 8 shards;
#      memcheck + racecheck of decode calls; a failure stops the script -> $OUT/swz-tests.txt
#   2. ncu L2 read sectors/requests of the patched kernel on B8 Tk4k 32/8 (main: 6.32M sectors,
#      2.76M requests; SDPA 4.20M / 1.05M) -> $OUT/swz-ncu.txt
#   3. 3 interleaved rounds of scripts/dev/decode_ab.sh, small and long rows, contiguous and paged
#      -> $OUT/swz-ab.txt (x = patched / base)
set -u
mkdir -p /tmp/dab
P=bench/experiments/decode-swizzle.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS
FLASHGEN_REQUIRE_GPU=1 timeout 200 bash scripts/dev/patch_run.sh swz $P -- bash scripts/dev/pytest_shards.sh 8 /tmp/swzt \
  tests/gpu/test_decode.py tests/gpu/test_api_kvcache.py tests/gpu/test_kvappend.py > "$OUT/swz-tests.txt" 2>&1
rc=$?
echo "tests rc=$rc at $((SECONDS - t0)) s"; grep -E "^shard|^(FAILED|ERROR)" "$OUT/swz-tests.txt" | tail -10
[ $rc -eq 0 ] || exit 1
if command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in memcheck racecheck; do
    FLASHGEN_REQUIRE_GPU=1 timeout 100 bash scripts/dev/patch_run.sh swz $P -- compute-sanitizer --tool $tool \
      --error-exitcode 3 python3 -m pytest -q -x tests/gpu/test_decode.py -k "graph or split_count" \
      >> "$OUT/swz-tests.txt" 2>&1
    echo "$tool rc=$? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY| passed| failed" "$OUT/swz-tests.txt" | tail -2
  done
fi
m=lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,dram__bytes_read.sum,gpu__time_duration.sum
for t in base swz; do
  if [ $t = base ]; then ps=(); else ps=($P); fi
  echo "== $t" >> "$OUT/swz-ncu.txt"
  timeout 90 bash scripts/dev/patch_run.sh $t "${ps[@]}" -- ncu --metrics $m --nvtx --nvtx-include "timed/" \
    python3 scripts/dev/profile_decode.py flashgen 8 4096 32 8 1 2>&1 | grep -E "^ +(lts|dram|gpu)__" >> "$OUT/swz-ncu.txt"
done
echo "ncu at $((SECONDS - t0)) s"; cat "$OUT/swz-ncu.txt"
ROWS="1,4096,8,1,1;1,32768,8,1,1;8,4096,32,8,1;32,32768,32,8,1;8,131072,32,8,1;8,32768,8,1,4" \
  OUT=/tmp/dab timeout 330 bash scripts/dev/decode_ab.sh 3 $P | tee "$OUT/swz-ab.txt"  # its JSON and logs stay there
echo "done at $((SECONDS - t0)) s"
