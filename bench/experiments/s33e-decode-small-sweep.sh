#!/bin/bash
# bench/experiments/s33e-decode-small-sweep.sh (carry .whl; ~4 min): the small decode rows' split
# count again now that sm_90 merges splits in a kernel of its own (session 24's sweep, with the
# in-kernel merge, found the automatic count within 0-3% of the best): num_splits auto / 8 / 16 /
# 32 / 64 / 128 x the default, w4_s2 and w8_s2 variants, SDPA beside, 2 rounds, 0.25 s warm-ups.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=/tmp/fgc FLASHGEN_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
DSWEEP_WARMUP_S=0.25 timeout 420 python3 scripts/dev/decode_sweep.py "$OUT/dsmall.json" small > "$OUT/dsmall.txt" 2>&1
echo "sweep rc=$?"
python3 - "$OUT/dsmall.json" <<'PY' | tee -a "$OUT/dsmall.txt"
import json, statistics, sys
acc = {}
for r in json.load(open(sys.argv[1])):
    acc.setdefault(tuple(r["row"]), {}).setdefault(r["impl"], []).append(r["us"])
for row, impls in acc.items():
    med = {k: statistics.median(v) for k, v in impls.items()}
    sd, de = med.get("sdpa", 0), med.get("default/ns0", 0)
    print(f"row {row}: sdpa {sd:.2f} us, auto {de:.2f} us ({sd / de if de else 0:.3f}x sdpa)")
    for k, v in sorted(med.items(), key=lambda kv: kv[1])[:6]:
        print(f"   {k:24s} {v:7.2f} us  x{de / v if v else 0:.3f} auto  x{sd / v if v else 0:.3f} sdpa")
PY
