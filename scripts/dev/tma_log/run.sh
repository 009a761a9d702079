#!/bin/bash
# GPU host (repo root, .whl and the .fa4 parts carried; after `bash .fa4/fa4-install.sh part2 &&
# source /tmp/fa4/env.sh`): build tma_log.so and compare FA4's tensor maps with flashgen's.
#   bash scripts/dev/tma_log/run.sh [D] [T] [CAUSAL]
set -u
here=$(cd "$(dirname "$0")" && pwd)
so=/tmp/tma_log.so
cc -O2 -shared -fPIC -o $so "$here/tma_log.c" -ldl 2>/dev/null \
  || gcc -O2 -shared -fPIC -o $so "$here/tma_log.c" -ldl \
  || { echo "tma_log.c: no C compiler"; exit 1; }
export TMA_LOG=${OUT:-/tmp}/tma.log
rm -f "$TMA_LOG"
LD_PRELOAD=$so python3 "$here/compare.py" "${1:-128}" "${2:-16384}" "${3:-1}"
