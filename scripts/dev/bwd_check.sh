#!/bin/bash
# scripts/dev/bwd_check.sh [PATCH]: the wgmma backward's GPU proof on this tree + PATCH (oracle tests,
# autograd tests, sanitizers, the wgmma backward bundle; GC_TIMEOUT: seconds for the sanitizers and
# the bundle, default 200). PATCH is relative to the tree; none (or "-"): the tree as it is.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1 FLASHGEN_HYPOTHESIS_PROFILE=ci FLASHGEN_REQUIRE_GPU=1 \
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
here=$PWD; p=${1:--}; t0=$SECONDS
rm -rf /tmp/c; mkdir -p /tmp/c $OUT/check; cp -r flashgen scripts tests docs pyproject.toml /tmp/c/
cd /tmp/c
if [ "$p" != - ]; then patch -s -p1 < "$here/$p" || exit 1; fi
export PYTHONPATH=/tmp/site:/tmp/c
n=12
for i in $(seq 0 $((n-1))); do
  FLASHGEN_GPU_SHARD=$i/$n timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_backward.py \
    tests/gpu/test_torch_backward.py -k "wgmma or torch_backward" > $OUT/check/pytest-$i.log 2>&1 &
done; wait
echo "tests: $((SECONDS-t0)) s"; for f in $OUT/check/pytest-*.log; do tail -1 $f; done
grep -h -E "^(FAILED|ERROR)" $OUT/check/pytest-*.log | head
BUNDLES=bwd-wgmma timeout ${GC_TIMEOUT:-200} bash scripts/gpu_check.sh $OUT/check/gc sanitize bundles > $OUT/check/gc.log 2>&1
cat $OUT/check/gc/summary.txt $OUT/check/gc/sanitize.txt 2>/dev/null | tail -20
echo "total: $((SECONDS-t0)) s"
