#!/bin/bash
# bench/experiments/s31-fa4-fwd-bar.sh: issue 28's bar in one call (~4 min) after
# `bash .fa4/fa4-install.sh part1` (its own call, carrying .fa4/part1 .fa4/fa4-install.sh only).
# Carry .whl .fa4/part2 .fa4/fa4-install.sh. `flashgen bench` forward rows (bf16 and fp16, d 64/128,
# T 4096/16384, causal and not) and the feature rows (GQA; the causal window 4096 back, d 128,
# T 16k, FA4's window beside), FA4 and SDPA in the same process: the first run of the bar on the
# H200 since O went through TMA (session 30: d 128 x1.014-1.039 on an H100).
#   -> $OUT/bar.txt and the bench JSON under $OUT
# shellcheck disable=SC1091
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
[ -f /tmp/fa4/env.sh ] || bash .fa4/fa4-install.sh part2 || exit 1
source /tmp/fa4/env.sh
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/bar.txt"
timeout 560 python3 -m flashgen bench --d 64 --d 128 --t 4096 --t 16384 --no-backward \
  --no-serving --no-memory --no-overhead --no-training --out "$OUT" 2>&1 \
  | grep -v -E "UserWarning|exe_args" >> "$OUT/bar.txt"
echo "bench rc=${PIPESTATUS[0]}"; tail -45 "$OUT/bar.txt"
