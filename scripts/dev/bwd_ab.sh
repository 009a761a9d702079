#!/bin/bash
# scripts/dev/bwd_ab.sh ROUNDS PATCH...: interleaved A/B of the shipped wgmma backward, base vs each patch
set -u
rounds=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
here=$PWD; trees="base"
rm -rf /tmp/t; mkdir -p /tmp/t/base; cp -r flashgen scripts tests docs pyproject.toml /tmp/t/base/  # tests: patches may touch them
for p in "$@"; do
  l=$(basename $p .patch); trees="$trees $l"; cp -r /tmp/t/base /tmp/t/$l
  (cd /tmp/t/$l && patch -s -p1 < $here/$p) || { echo "patch $p failed"; exit 1; }
done
names="flash_bwd_wgmma_d64_br64_bc128_bf16_noncausal_s3 flash_bwd_wgmma_d64_br64_bc128_bf16_causal_s3 flash_bwd_wgmma_d128_br64_bc128_bf16_noncausal_s2 flash_bwd_wgmma_d128_br64_bc128_bf16_causal_s2 ${EXTRA_NAMES:-}"
t0=$SECONDS
for t in $trees; do  # compile every tree's kernels at once (16 cores)
  (cd /tmp/t/$t && PYTHONPATH=/tmp/site:/tmp/t/$t timeout 200 python3 scripts/bwd_sweep.py /dev/null $names --t 256 > $OUT/warm-$t.log 2>&1) &
done; wait; echo "compiled in $((SECONDS-t0)) s"
for r in $(seq 1 $rounds); do
  for t in $trees; do
    (cd /tmp/t/$t && PYTHONPATH=/tmp/site:/tmp/t/$t python3 scripts/bwd_sweep.py $OUT/ab-$t-$r.json $names ${SWEEP_ARGS:-} > $OUT/ab-$t-$r.log 2>&1) || tail -3 $OUT/ab-$t-$r.log
  done
done
echo "timed in $((SECONDS-t0)) s"
python3 scripts/dev/bwd_ab_report.py $OUT $trees | tee $OUT/ab-report.txt
