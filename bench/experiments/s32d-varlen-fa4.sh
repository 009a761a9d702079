#!/bin/bash
# bench/experiments/s32d-varlen-fa4.sh: after `bash .fa4/fa4-install.sh part1` (its own call), carry
# .whl .fa4/part2 .fa4/fa4-install.sh. (1) the order effect: varlen causal rows, no peers, the
# dtypes in both orders, warm-up 0 s (graph timing as before) and 1 s (the protocol);
# (2) varlen prefill with FA4's varlen in the same process, 1 s warm-up, 2 runs ->
# $OUT/vfa4-{1,2}.json/.txt, $OUT/vorder.txt
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
bash .fa4/fa4-install.sh part2 || exit 1
source /tmp/fa4/env.sh
export PYTHONPATH=$PWD:/tmp/site:$PYTHONPATH FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/vorder.txt
for w in 0 1; do
  for o in "fp16 bf16" "bf16 fp16"; do
    echo "warm-up $w s, order $o" >> $OUT/vorder.txt
    python3 - $w $o <<'PY' 2>&1 | grep -E "varlen" >> $OUT/vorder.txt
import sys, runpy
from flashgen.perf import bench
bench.WARMUP_S = float(sys.argv[1])
sys.argv = ["varlen_bench.py", "/tmp/x.json", "--dtype", *sys.argv[2:], "--causal", "1", "--rounds", "2", "--no-peers"]
runpy.run_path("scripts/varlen_bench.py", run_name="__main__")
PY
  done
done
cat $OUT/vorder.txt
for r in 1 2; do
  timeout 200 python3 scripts/varlen_bench.py $OUT/vfa4-$r.json --dtype bf16 fp16 --causal 1 0 \
    --rounds 1 > $OUT/vfa4-$r.txt 2>&1; echo "run $r rc=$?"; tail -6 $OUT/vfa4-$r.txt
done
