#!/bin/bash
# bench/experiments/s30-decode-ncu.sh: one GPU call (~4 min): ncu of our decode call and SDPA's on the
# same K/V (scripts/dev/decode_ncu.sh: B32 Tk32k 32/8, B1 Tk4k 8/1, B1 Tk32k 8/1, B8 Tk4k 32/8).
# Issue 26's long rows run 0.91-0.94x SDPA's bandwidth, and session 29 ruled out bytes in flight
# (3 blocks per SM: 0.97-1.01x). Read the two long-row pages side by side: DRAM throughput and
# bytes read (an over-read?), L2 hit rate and sectors per request, warp stall reasons, grid and
# waves; SDPA's kernel names say which backend it runs. The pages come back as one tarball (the
# device returns at most 8 files; session 18's SDPA pages were lost that way).
#   -> $OUT/decode-ncu.tgz, $OUT/decode-ncu-summary.txt
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 500 bash scripts/dev/decode_ncu.sh /tmp/dncu > "$OUT/decode-ncu-summary.txt" 2>&1
echo "rc=$?"
tar czf "$OUT/decode-ncu.tgz" -C /tmp dncu
grep -v "^$" "$OUT/decode-ncu-summary.txt" | cut -c1-240 | tail -40
