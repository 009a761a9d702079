#!/bin/bash
# bench/experiments/s29-decode-sweep.sh: one GPU call (~4 min): issue 26's long-cache decode rows
# run 0.92-0.93x SDPA on the H200 (s24: B32 Tk32k 32/8 4189 vs 4479 GB/s) at ~97% of a device
# copy; the knob sweep written in session 23 (scripts/dev/decode_sweep.py: warps 2/4/8 x stages
# 2/3/4 x bc 16/32, the valid specs, x splits auto/2, SDPA beside, 2 rounds, graph-timed) never
# ran: read it for a knob that beats the default on all four rows. Precompile here first:
#   FLASHGEN_CACHE_DIR=$PWD/.fgcx/dsweep python3 scripts/dev/decode_sweep.py compile
# and carry .fgcx/dsweep (rebuilt in session 33 after the merge kernel; 0.25 s warm-ups). -> $OUT/dsweep.json, $OUT/dsweep.txt (a per-row table last)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=$PWD/.fgcx/dsweep FLASHGEN_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
DSWEEP_WARMUP_S=0.25 timeout 250 python3 scripts/dev/decode_sweep.py "$OUT/dsweep.json" > "$OUT/dsweep.txt" 2>&1
echo "sweep rc=$?"
# (the DSWEEP_MIN_BLOCKS=3 half was dropped: 3 blocks per SM measured 0.97-1.01x in session 29)
python3 - "$OUT/dsweep.json" "$OUT/dsweep-mb3.json" <<'PY' | tee -a "$OUT/dsweep.txt"
import json, statistics, sys
res = [r for f in sys.argv[1:] for r in (json.load(open(f)) if __import__("os").path.exists(f) else [])]
acc = {}
for r in res:
    acc.setdefault(tuple(r["row"]), {}).setdefault(r["impl"], []).append(r["gbs"])
for row, impls in acc.items():
    med = {k: statistics.median(v) for k, v in impls.items()}
    sd, de = med.get("sdpa", 0), med.get("default", 0)
    print(f"row {row}: sdpa {sd:.0f} default {de:.0f} GB/s ({de / sd if sd else 0:.3f}x sdpa)")
    for k, v in sorted(med.items(), key=lambda kv: -kv[1])[:6]:
        print(f"   {k:60s} {v:7.0f}  x{v / de if de else 0:.3f} default  x{v / sd if sd else 0:.3f} sdpa")
PY
