#!/bin/bash
# bench/experiments/s29-arch-table-check.sh: one GPU call (~3 min) for select-arch-table.patch (a GPU
# without its own tuning table reads the table of a GPU of the same compute capability: on an H100,
# the H200's). Session 28 measured on an H100 with no table: d 64 forward at the families' default
# 128 x 128 tile, 0.83-0.91x FA4 (bench/results/nvidia-h100-2026-12-05-s28-fa4-bench-*.txt), where
# the H200 table's 192 x 128 was 0.93-1.00x FA4 on the H200. Run it on an H100 (kind
# nvidia-h100-x1): wgmma_dev.py checks and times d 64 br 128 and br 192 (bc 128), bf16 and fp16,
# causal and not, T 4096/16384, beside SDPA's FLASH and CUDNN. Land the patch if br 192 wins
# (>= 3%, or equal everywhere and better somewhere); record the rows either way.
# -> $OUT/d64-tiles.json, $OUT/d64-tiles.txt
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=/tmp/fgc FLASHGEN_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
names=()
for dt in bf16 fp16; do for c in noncausal causal; do for br in 128 192; do
  names+=(flash_fwd_wgmma_d64_br${br}_bc128_${dt}_${c}_s2)
done; done; done
timeout 400 python3 scripts/dev/wgmma_dev.py "$OUT/d64-tiles.json" "${names[@]}" --bench-t 4096,16384 \
  > "$OUT/d64-tiles.txt" 2>&1
echo "rc=$? "; grep -v "^PASS" "$OUT/d64-tiles.txt" | tail -20
