#!/bin/bash
# bench/experiments/s31-fwd-timeline.sh: one GPU call (~2 min): where a wgmma forward item's time
# goes (issue 28's window bar: 0.885-0.908x the plain causal kernel, 0.95 wanted). With
# wgmma-fwd-timeline.patch consumer 0 records %globaltimer and clock64 at each point of every item
# (start, first K landed, first tile done, steady steps done, last P V done, epilogue done);
# scripts/dev/fwd_timeline.py prints per row (d 128 T 16k causal / window 4096 / non-causal, d 64
# T 4k causal) the stage medians in cycles, cycles per steady step, the fixed cost per item in
# steps, the consumers' busy share and the gaps between items on an SM. Instrumented kernels: 0
# spills (compiled on the CPU in session 30); read shares, not absolute times.
#   -> $OUT/fwd-timeline.json, $OUT/fwd-timeline.txt
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/fwd-timeline.txt"
timeout 400 bash scripts/dev/patch_run.sh ftl bench/experiments/wgmma-fwd-timeline.patch -- \
  python3 scripts/dev/fwd_timeline.py "$OUT/fwd-timeline.json" >> "$OUT/fwd-timeline.txt" 2>&1
echo "rc=$?"; tail -50 "$OUT/fwd-timeline.txt"
