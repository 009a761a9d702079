#!/bin/bash
# bench/experiments/s29-det-profile.sh: one GPU call (~3 min): where the deterministic wgmma backward
# loses half its speed (session 28, H100: 0.46-0.65x the fast rows, bench/results/
# nvidia-h100-2026-12-05-s28-bwd-combo-ab.txt, where a model of the grid order had predicted
# 1.03-1.05x). ncu on one main kernel of each, d 128 non-causal T 4096 bf16 (B 4, H 16: 32 key
# tiles x 64 (batch, head) blocks, 132 at once): warp states and per-SASS stall samples, then
# scripts/dev/sass_stalls.py side by side. Read: samples on the semaphore spin (LDG + ISETP loop
# after the dQ staging barrier), on `fence.acq_rel.gpu` / `fence.proxy.async` (MEMBAR, FENCE),
# on the bulk wait (`cp.async.bulk.wait_group 1`: SYNCS) and on the warpgroup's next HGMMA (the
# other three warps waiting on warp 0). Hypotheses: (a) the completion wait of the previous
# reduce costs about a step; (b) the gpu-scope fences cost ~1 us each; (c) the chain is longer
# than modelled (blocks not started in the linear order).
# -> $OUT/det/{fast,det}-details.txt, -sass.csv, stalls.txt
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
out=$OUT/det; mkdir -p "$out"
fast=flash_bwd_wgmma_d128_br64_bc128_bf16_noncausal_s2
det=flash_bwd_wgmma_d128_br64_bc128_bf16_noncausal_deterministic_s2
sections="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --section LaunchStats --section MemoryWorkloadAnalysis"
for r in fast det; do
  name=${!r}
  timeout 200 ncu $sections -k "regex:${name}\$" -s 1 -c 1 -o "$out/$r" \
    python3 scripts/dev/profile_bwd.py "$name" 4096 > "$out/ncu-$r.log" 2>&1
  [ -f "$out/$r.ncu-rep" ] || { echo "$r: no report"; tail -5 "$out/ncu-$r.log"; continue; }
  ncu --import "$out/$r.ncu-rep" --page details > "$out/$r-details.txt" 2>&1
  ncu --import "$out/$r.ncu-rep" --page source --csv --print-source sass > "$out/$r-sass.csv" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|No Eligible|Issue Slots Busy|L2 Cache Throughput|DRAM Throughput" \
    "$out/$r-details.txt" | sed "s/^/$r: /"
done
python3 scripts/dev/sass_stalls.py "$out/fast-sass.csv" "$out/det-sass.csv" --top 25 > "$out/stalls.txt" 2>&1
head -80 "$out/stalls.txt"
