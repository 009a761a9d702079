#!/bin/bash
# bench/experiments/decode-trace-run.sh: one GPU call (~8 min, guarded to finish by 9) for the
# small-cache decode question (bench/NOTES.md, eighteenth session: SMs idle half the kernel).
#   1. timelines (%globaltimer stamps per block, scripts/dev/decode_timeline.py) of main and of
#      main + decode-combo, warm and cold L2: $OUT/timeline.txt, $OUT/timeline-combo.txt
#   2. decode_ab.sh 3 rounds, base vs each fix patch: $OUT/ab.txt
#   3. tests/gpu/test_decode.py (8 shards) on the combo tree, then the single patches while
#      time is left: $OUT/tests.txt
# Raw JSON and logs go to $OUT/raw.tgz (only 8 files come back from a call).
# Run from the repo root:  bash bench/experiments/decode-trace-run.sh
set -u
E=bench/experiments
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/usr/local/cuda/bin FLASHGEN_CACHE_DIR=/tmp/fgc \
  PYTHONUNBUFFERED=1
rm -rf /tmp/raw && mkdir -p /tmp/raw/ab
t0=$SECONDS
left() { echo $((520 - (SECONDS - t0))); }  # seconds of the call's budget still free

for t in timeline timeline-combo; do
  timeout 140 bash scripts/dev/patch_run.sh "tl-$t" "$E/decode-$t.patch" -- \
    python3 scripts/dev/decode_timeline.py --reps 10 --json "/tmp/raw/$t.json" \
    > "$OUT/$t.txt" 2>&1 || echo "$t: rc $?" | tee -a "$OUT/$t.txt"
done
echo "timelines done at $((SECONDS - t0)) s"

ROWS="1,4096,8,1,1;1,32768,8,1,1;8,4096,32,8,1;32,32768,32,8,1;1,65536,32,8,1" OUT=/tmp/raw/ab \
  timeout $(($(left) - 120)) bash scripts/dev/decode_ab.sh 3 \
  $E/decode-merge-parallel.patch $E/decode-start-q-first.patch $E/decode-loader-contig.patch \
  $E/decode-few-s4.patch $E/decode-few-w8.patch $E/decode-combo.patch > "$OUT/ab.txt" 2>&1 \
  || echo "decode_ab: rc $?" >> "$OUT/ab.txt"
echo "A/B done at $((SECONDS - t0)) s"

for p in combo few-s4 merge-parallel loader-contig start-q-first; do
  if [ "$(left)" -lt 70 ]; then echo "$p: not tested (time)" >> "$OUT/tests.txt"; continue; fi
  echo "== $p" >> "$OUT/tests.txt"
  FLASHGEN_REQUIRE_GPU=1 timeout "$(left)" bash scripts/dev/patch_run.sh "t-$p" \
    "$E/decode-$p.patch" -- bash scripts/dev/pytest_shards.sh 8 "/tmp/raw/tests-$p" \
    tests/gpu/test_decode.py >> "$OUT/tests.txt" 2>&1
  echo "$p: rc $?" >> "$OUT/tests.txt"
done
echo "tests done at $((SECONDS - t0)) s"
tar czf "$OUT/raw.tgz" -C /tmp raw
