#!/bin/bash
# bench/experiments/s33d-decode-grid.sh (carry .whl; ~5 min): issue 26's whole decode grid
# (scripts/decode_bench.py, every row that fits) with the combine kernel on main.
set -u
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 560 python3 scripts/decode_bench.py $OUT/decode-grid.json 2>&1 | tee $OUT/decode-grid.txt
