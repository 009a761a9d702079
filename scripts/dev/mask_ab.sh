#!/bin/bash
# scripts/dev/mask_ab.sh ROUNDS [--bwd] PATCH...: interleaved A/B of hook patches on the hooked
# mask rows (scripts/dev/mask_rows.py): the tree as it is ("base") and the tree plus each
# PATCH, each in its own process and compile cache, ROUNDS rounds (base, p1, p2, base, ...:
# the H200's clocks drift between processes, so only interleaved medians are compared). Run on
# the GPU host from the repo root after the wheel install line (PYTHONPATH holding the wheels'
# target). Writes $OUT/mask-ab-<tree>-<round>.json and prints each row's median per tree and
# its ratio to base (> 1: the patch is faster).
set -u
rounds=${1:?usage: mask_ab.sh ROUNDS [--bwd] PATCH...}; shift
flag=""
if [ "${1:-}" = "--bwd" ]; then flag="--bwd"; shift; fi
site=${PYTHONPATH:-}
root=/tmp/mask-ab
rm -rf "$root" && mkdir -p "$root/base"
cp -r flashgen scripts tests pyproject.toml "$root/base/"
trees=(base)
for p in "$@"; do
  name=$(basename "$p" .patch)
  cp -r "$root/base" "$root/$name"
  (cd "$root/$name" && git apply --exclude="docs/*" "$OLDPWD/$p") || { echo "$p does not apply"; exit 1; }
  trees+=("$name")
done
for r in $(seq 1 "$rounds"); do
  for t in "${trees[@]}"; do
    (cd "$root/$t" && PYTHONPATH="$site:$root/$t" FLASHGEN_CACHE_DIR="/tmp/mask-ab-cache-$t" \
      timeout 300 python3 scripts/dev/mask_rows.py $flag 2>"$root/$t-$r.err" | tail -1 \
      > "$OUT/mask-ab-$t-$r.json")
    echo "round $r $t done at $SECONDS s"
  done
done
python3 - "$OUT" "$rounds" "${trees[@]}" <<'PY'
import json, statistics, sys
out, rounds, trees = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows: dict[str, dict[str, list[float]]] = {}
for t in trees:
    for r in range(1, rounds + 1):
        try:
            data = json.load(open(f"{out}/mask-ab-{t}-{r}.json"))
        except (OSError, ValueError) as exc:
            print(f"{t} round {r}: no result ({exc})")
            continue
        for row, us in data.items():
            rows.setdefault(row, {}).setdefault(t, []).append(us)
for row, by in rows.items():
    base = statistics.median(by.get("base", [float("nan")]))
    cells = [f"base {base:8.1f} us"]
    for t in trees[1:]:
        m = statistics.median(by.get(t, [float("nan")]))
        cells.append(f"{t} {m:8.1f} ({base / m:.3f}x)")
    print(f"{row:28s} " + "  ".join(cells))
PY
