#!/bin/bash
# bench/experiments/s28-d256-bc80.sh: one GPU call (~4 min): issue 28's d 256 rows (reported beside
# the bar: 0.93-0.97x FA4 in session 10, where FA4 runs 128 x 80 tiles and ours 128 x 64). The
# wgmma forward at bc 80 compiles for sm_90a with 168 registers, 0 spills and 230,480 B of shared
# memory (session 27, ptxas); the tuning space holds bc 64 only at d 256, so nothing has timed it.
# wgmma_dev.py checks each variant on ragged problems against the float64 oracle, then times
# bc 64 and bc 80, bf16 and fp16, causal and not, T 4096/16384, beside SDPA's FLASH and CUDNN.
# A win of more than the noise (>= 3%, repeat once) is worth a tuning entry for d 256.
# -> $OUT/d256.json, $OUT/d256.txt
#   bash bench/experiments/s28-d256-bc80.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=/tmp/fgc FLASHGEN_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
names=()
for dt in bf16 fp16; do for c in noncausal causal; do for bc in 64 80; do
  names+=(flash_fwd_wgmma_d256_br128_bc${bc}_${dt}_${c}_s2)
done; done; done
timeout 570 python3 scripts/dev/wgmma_dev.py "$OUT/d256.json" "${names[@]}" --bench-t 4096,16384 \
  > "$OUT/d256.txt" 2>&1
echo "rc=$? "; tail -30 "$OUT/d256.txt"
