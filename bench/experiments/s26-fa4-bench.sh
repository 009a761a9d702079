#!/bin/bash
# bench/experiments/s26-fa4-bench.sh DTYPE: issue 25's and 28's tables under one session's clocks, FA4
# in the same process (bench/NOTES.md, twenty-fifth session's queue). Two device calls:
#   1. bash .fa4/fa4-install.sh part1             (carry .fa4/part1 .fa4/fa4-install.sh)
#   2. bash bench/experiments/s26-fa4-bench.sh bf16 (carry .whl .fa4/part2 .fa4/fa4-install.sh)
#      then the same with fp16 while the machine is warm (the install is kept in /tmp/fa4).
# Forward and backward rows (d 64/128, T 4096/16384, causal and not) and the training-step rows
# (bf16 only), FA4 and SDPA's FA2/cuDNN as peers: $OUT/bench.txt and the JSON under $OUT/.
set -u
dtype=${1:?bf16 or fp16}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
[ -f /tmp/fa4/env.sh ] || bash .fa4/fa4-install.sh part2 || exit 1
# shellcheck disable=SC1091
source /tmp/fa4/env.sh
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
training=--no-training; [ "$dtype" = bf16 ] && training=--training
timeout 570 python3 -m flashgen bench --dtype "$dtype" --d 64 --d 128 --t 4096 --t 16384 \
  --no-features --no-serving --no-memory --no-overhead $training --out "$OUT" > "$OUT/bench.txt" 2>&1
echo "bench rc=$?"; tail -60 "$OUT/bench.txt"
