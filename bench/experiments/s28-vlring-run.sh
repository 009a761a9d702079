#!/bin/bash
# bench/experiments/s28-vlring-run.sh: one GPU call (~5 min) for wgmma-bwd-varlen-ld-ring.patch
# (issue 26's varlen backward, 0.86x the dense backward at 16k tokens in session 18): the varlen
# backward's D and LSE*log2(e) rows ride in the Q/dO ring by bulk copy, as the dense kernel's have
# since session 25 (+2..+8% there); the varlen kernel still loads them from global memory.
#   1. tests/gpu/test_varlen.py on the patched tree, 8 shards (oracle per sequence, zero-length and
#      ragged sequences, padded rows): $OUT/vlring-tests.txt. A failure: stop, nothing to time.
#   2. 3 interleaved rounds of scripts/varlen_bench.py --backward --no-peers (bf16 and fp16,
#      causal; the issue's 16 sequences, 64-4096 tokens, 16k in all) on base and patched trees:
#      $OUT/vl-{base,ring}-N.json/.log; a table of both trees' varlen and dense rows last.
#   bash bench/experiments/s28-vlring-run.sh
set -u
P=bench/experiments/wgmma-bwd-varlen-ld-ring.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
t0=$SECONDS
FLASHGEN_REQUIRE_GPU=1 timeout 200 bash scripts/dev/patch_run.sh ring $P -- \
  bash scripts/dev/pytest_shards.sh 8 /tmp/vlr tests/gpu/test_varlen.py > "$OUT/vlring-tests.txt" 2>&1
rc=$?
echo "tests rc=$rc at $((SECONDS - t0)) s"; tail -9 "$OUT/vlring-tests.txt"
[ $rc -eq 0 ] || exit 1
for r in 1 2 3; do
  for t in base ring; do
    if [ $t = base ]; then ps=(); else ps=($P); fi
    timeout 150 bash scripts/dev/patch_run.sh $t "${ps[@]}" -- python3 scripts/varlen_bench.py \
      "$OUT/vl-$t-$r.json" --backward --no-peers --dtype bf16 fp16 --rounds 1 > "$OUT/vl-$t-$r.log" 2>&1 \
      || tail -3 "$OUT/vl-$t-$r.log"
  done
done
echo "timed at $((SECONDS - t0)) s"
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
med = {}
for t in ("base", "ring"):
    acc = {}
    for f in glob.glob(f"{out}/vl-{t}-*.json"):
        for r in json.load(open(f))["rows"]:
            if r.get("tflops"):
                acc.setdefault((r["kernel"], r["dtype"], r["causal"]), []).append(r["tflops"])
    med[t] = {k: (statistics.median(v), len(v)) for k, v in acc.items()}
for k in sorted(set(med["base"]) | set(med["ring"])):
    b, g = med["base"].get(k, (None, 0)), med["ring"].get(k, (None, 0))
    ratio = f"{g[0] / b[0]:.3f}" if b[0] and g[0] else "-"
    print(f"{k[0][:60]:60s} {k[1]} causal={k[2]}  base {b[0] or 0:7.1f} n={b[1]}  ring {g[0] or 0:7.1f} n={g[1]}  x{ratio}")
PY
