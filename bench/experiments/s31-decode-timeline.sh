#!/bin/bash
# bench/experiments/s31-decode-timeline.sh: one GPU call (~2 min): where a decode call's ~10 us go
# (issue 26's small rows, 0.69-0.94x SDPA at a fixed latency). decode-timeline.patch makes every
# decode kernel record %globaltimer and clock64 at each point of its chain (entry, past the PDL
# wait, first tiles issued, Q landed, first tile landed, tiles done, warps merged, counted in, group
# merged, final merge); scripts/dev/decode_timeline.py reads them back per block on five rows (B1
# Tk4k 8/1, B1 Tk32k 8/1, B1 Tk4k 32/8, B8 Tk4k 32/8, B32 Tk32k 32/8) and prints each stage's
# median and max cycles over the blocks, the kernel's span and the spread of block starts, and the
# time per call of 50 back-to-back calls beside SDPA's. Instrumented kernels run 10-13 more
# registers (w8 s2 191 -> 201, 0 spills): read stage shares, not absolute times.
#   -> $OUT/timeline.json, $OUT/timeline.txt
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/timeline.txt"
timeout 400 bash scripts/dev/patch_run.sh tl bench/experiments/decode-timeline.patch -- \
  python3 scripts/dev/decode_timeline.py "$OUT/timeline.json" >> "$OUT/timeline.txt" 2>&1
echo "rc=$?"; tail -70 "$OUT/timeline.txt"
