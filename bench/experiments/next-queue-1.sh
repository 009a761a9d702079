#!/bin/bash
# bench/experiments/next-queue-1.sh: the first GPU call of the session after the eighteenth
# (bench/NOTES.md): (1) the sinks test after its dsinks change; (2) the wgmma backward walk
# patch: hook_cost --bwd base vs patched (2 rounds each, interleaved) and its GPU tests;
# (3) memcheck over a few hooked wgmma cases. Run from the repo root (carry .whl):
#   bash bench/experiments/next-queue-1.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin FLASHGEN_REQUIRE_GPU=1
t0=$SECONDS
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_torch_sinks.py > "$OUT/sinks.txt" 2>&1
echo "sinks rc=$? at $((SECONDS - t0)) s"; tail -3 "$OUT/sinks.txt"
rm -rf /tmp/ab && mkdir -p /tmp/ab/base && cp -r flashgen scripts tests pyproject.toml bench /tmp/ab/base/
cp -r /tmp/ab/base /tmp/ab/walk && (cd /tmp/ab/walk && patch -s -p1 < bench/experiments/wgmma-bwd-hook-walk.patch) \
  || { echo "patch failed"; exit 1; }
(cd /tmp/ab/walk && PYTHONPATH=/tmp/site:/tmp/ab/walk bash scripts/dev/pytest_shards.sh 8 /tmp/walk-shards \
  tests/gpu/test_hooks.py -k wgmma_bwd > "$OUT/walk-tests.txt" 2>&1; echo "walk tests rc=$?")
tail -10 "$OUT/walk-tests.txt"
for r in 1 2; do for t in base walk; do
  (cd /tmp/ab/$t && PYTHONPATH=/tmp/site:/tmp/ab/$t timeout 150 python3 scripts/dev/hook_cost.py \
    "$OUT/bwd-$t-$r.json" --bwd --rounds 1 > "/tmp/ab/bwd-$t-$r.txt" 2>&1)
  echo "== $t $r"; grep median "/tmp/ab/bwd-$t-$r.txt"
done; done | tee "$OUT/bwd-ab.txt"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -x -p no:cacheprovider \
  tests/gpu/test_hooks.py -k "wgmma and (document_ragged or window) and not bwd" > "$OUT/memcheck.txt" 2>&1
echo "memcheck rc=$? at $((SECONDS - t0)) s"; tail -3 "$OUT/memcheck.txt"
