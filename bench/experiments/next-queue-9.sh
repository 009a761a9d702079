#!/bin/bash
# bench/experiments/next-queue-9.sh: issue 27's hook-cost bar (hooked softcap / ALiBi / window /
# causal >= 0.98x the built-in kernels, forward and backward, d 128, T 16k, bf16) re-measured
# through the front door after the block-map and eager-autograd sessions, 2 rounds. Run from
# the repo root (carry .whl):  bash bench/experiments/next-queue-9.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
t0=$SECONDS
timeout 560 python3 scripts/hooks_bench.py --out "$OUT/hook_cost.json" --rounds 2 --no-mask-rows \
  --budget-s 500 > "$OUT/hook_cost.log" 2>&1
echo "hook cost rc=$? at $((SECONDS - t0)) s"; grep -v -i "warn" "$OUT/hook_cost.log" | tail -30
