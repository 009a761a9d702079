#!/bin/bash
# bench/experiments/next-queue-5.sh (twentieth session): proves the op-side range summaries
# (runtime/summary_kernel.py: one launch per table instead of ~20 torch ops in the front door),
# measures the hooked calls' host cost again, then hooks_bench's document and prefix-LM rows
# against Flex (issue 27). Run from the repo root (carry .whl):
#   bash bench/experiments/next-queue-5.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin FLASHGEN_REQUIRE_GPU=1
t0=$SECONDS
bash scripts/dev/pytest_shards.sh 8 /tmp/q5-tests tests/gpu/test_hooks_torch.py \
  tests/gpu/test_torch_sinks.py tests/gpu/test_hooks.py tests/gpu/test_api.py \
  -k "torch or sinks or wgmma or hooked_numpy or summary" \
  > "$OUT/tests.txt" 2>&1; echo "tests rc=$? at $((SECONDS - t0)) s"; tail -10 "$OUT/tests.txt"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -x \
  -p no:cacheprovider tests/gpu/test_hooks_torch.py -k "own_aux or summary_kernel" > "$OUT/memcheck.txt" 2>&1
echo "memcheck rc=$? at $((SECONDS - t0)) s"; tail -2 "$OUT/memcheck.txt"
timeout 90 python3 scripts/dev/hook_host_cost.py > "$OUT/host-cost.txt" 2>&1
timeout 90 python3 scripts/dev/hook_host_cost.py --bwd >> "$OUT/host-cost.txt" 2>&1
echo "host cost at $((SECONDS - t0)) s"; grep -v -i warn "$OUT/host-cost.txt"
left=$((570 - (SECONDS - t0)))
timeout $left python3 scripts/hooks_bench.py --out "$OUT/hooks_bench.json" --rounds 2 \
  --masks document,prefix_lm --impls flashgen,flex,builtin --modes fwd,fwd+bwd --no-hook-cost \
  > "$OUT/hooks_bench.txt" 2>&1
echo "hooks_bench rc=$? at $((SECONDS - t0)) s"; tail -18 "$OUT/hooks_bench.txt"
