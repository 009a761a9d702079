#!/bin/bash
# scripts/dev/decode_ab.sh ROUNDS PATCH...: interleaved A/B of the decode kernel, base vs each patch
# (scripts/decode_bench.py --no-peers on ROWS, default a short/long, GQA 32/8 and 8/1 mix)
set -u
rounds=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
rows=${ROWS:-"1,4096,8,1,1;1,65536,32,8,1;8,8192,32,8,1;32,4096,32,8,1;8,32768,8,1,4;32,32768,32,8,1"}
here=$PWD; trees="base"
mkdir -p "$OUT"; rm -rf /tmp/d; mkdir -p /tmp/d/base; cp -r flashgen scripts tests docs pyproject.toml /tmp/d/base/  # tests, docs: patches may touch them
for p in "$@"; do
  l=$(basename $p .patch); trees="$trees $l"; cp -r /tmp/d/base /tmp/d/$l
  (cd /tmp/d/$l && patch -s -p1 < $here/$p) || { echo "patch $p failed"; exit 1; }
done
t0=$SECONDS
for r in $(seq 1 $rounds); do
  for t in $trees; do
    (cd /tmp/d/$t && PYTHONPATH=/tmp/site:/tmp/d/$t python3 scripts/decode_bench.py $OUT/dab-$t-$r.json \
      --rows "$rows" --no-peers > $OUT/dab-$t-$r.log 2>&1) || tail -3 $OUT/dab-$t-$r.log
  done
done
echo "timed in $((SECONDS-t0)) s"
python3 - $OUT $trees <<'PY'
import json, statistics, sys, glob
out, trees = sys.argv[1], sys.argv[2:]
res = {}
for t in trees:
    for f in glob.glob(f"{out}/dab-{t}-*.json"):
        for r in json.load(open(f))["rows"]:
            key = (r["b"], r["tk"], r["h"], r["h_kv"], r["tq"])
            for m in ("flashgen_gbs", "paged16_gbs", "paged256_gbs"):
                res.setdefault((key, m, t), []).append(r[m])
keys = sorted({k for k, _, _ in res})
print(f"{'row':<24}{'metric':<14}" + "".join(f"{t:>22}" for t in trees))
for k in keys:
    for m in ("flashgen_gbs", "paged16_gbs", "paged256_gbs"):
        base = statistics.median(res[(k, m, "base")])
        cells = []
        for t in trees:
            v = res.get((k, m, t))
            cells.append(f"{statistics.median(v):8.0f} ({statistics.median(v) / base:.3f}) n={len(v)}" if v else "-")
        print(f"{str(k):<24}{m:<14}" + "".join(f"{c:>22}" for c in cells))
PY
