#!/bin/bash
# bench/experiments/s31-decode-ncu.sh: one GPU call (~4 min): ncu of our decode call and SDPA's on the
# same K/V (scripts/dev/decode_ncu.sh: B32 Tk32k 32/8, B1 Tk4k 8/1, B1 Tk32k 8/1, B8 Tk4k 32/8), now
# with L2 reads by outcome (lookup hit / miss), DRAM bytes read and the sectors the SMs receive.
# Session 30's run (H100) found our long row at 91% DRAM vs SDPA's 95% with 34% L2 hits vs 2% on
# what should be a pure stream: read whether our K/V reads are requested twice (hits ~ a third of
# the reads, DRAM bytes = K + V) or DRAM reads exceed K + V (an over-read), on the long row.
#   -> $OUT/decode-ncu.tgz, $OUT/decode-ncu-summary.txt
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 500 bash scripts/dev/decode_ncu.sh /tmp/dncu > "$OUT/decode-ncu-summary.txt" 2>&1
echo "rc=$?"
tar czf "$OUT/decode-ncu.tgz" -C /tmp dncu
grep -v "^$" "$OUT/decode-ncu-summary.txt" | cut -c1-240 | tail -40
