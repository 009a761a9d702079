#!/bin/bash
# bench/experiments/s28-d64-default-check.sh [PATCH]: one GPU call (~3 min) for the working tree where the
# wgmma backward's d 64 default is the 128 x 128 tile (wgmma_bwd.default_tile; fast, dense,
# unhooked, no softcap): bwd_check.sh on the tree as it is (oracle + autograd tests of every
# shipped variant, sanitizers, the wgmma backward bundle, now holding br 128 at d 64), the varlen
# and hooked gradient tests at d 64 (which keep br 64), then the d 64 bf16 backward rows beside
# SDPA's FA2/cuDNN. -> $OUT/check/, $OUT/d64-*.txt
# Run it on a working tree with the patch applied (`git apply
# bench/experiments/wgmma-bwd-d64-br128-default.patch`, uncommitted: the device copies the
# working tree), with no argument; land the patch on green and a bench at or above main's rows
# (d 64 bf16 backward on the H100 in session 28: 372.8-449.1 TFLOP/s).
set -u
t0=$SECONDS
GC_TIMEOUT=200 timeout 330 bash scripts/dev/bwd_check.sh "${1:-/dev/null}" > "$OUT/d64-check.txt" 2>&1
echo "check rc=$? at $((SECONDS - t0)) s"; grep -E "passed|failed|error|FAIL|PASS|hazard" "$OUT/d64-check.txt" | tail -24
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=/tmp/fgc FLASHGEN_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
timeout 120 bash scripts/dev/pytest_shards.sh 8 /tmp/d64v tests/gpu/test_varlen.py tests/gpu/test_hooks_torch.py \
  tests/gpu/test_torch_backward.py -k "grad or backward or d64" > "$OUT/d64-varlen-hooks.txt" 2>&1
echo "varlen/hooks rc=$? at $((SECONDS - t0)) s"; tail -8 "$OUT/d64-varlen-hooks.txt"
timeout 150 python3 -m flashgen bench --dtype bf16 --d 64 --t 4096 --t 16384 --no-features --no-serving \
  --no-memory --no-overhead --no-training --out "$OUT" > "$OUT/d64-bench.txt" 2>&1
echo "bench rc=$? at $((SECONDS - t0)) s"; grep -v "Warning\|exe_args" "$OUT/d64-bench.txt" | tail -16
