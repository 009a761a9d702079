#!/bin/bash
# bench/experiments/next-queue-10.sh (session 22): proves `wgmma-hook-keep-bits.patch` (the
# wgmma forward evaluates a mask hook's per-element verdicts into bits before it waits for
# S = Q K^T, so the mask's table loads and compares overlap the GEMM instead of sitting on the
# softmax's path; table-free masks see unclamped keys) with the hooked forward GPU tests, then
# A/Bs it on the mask rows (document, prefix-LM, causal and window hooks beside the built-in
# causal and window kernels), 3 interleaved rounds, forward. Run from the repo root (carry .whl):
#   bash bench/experiments/next-queue-10.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin FLASHGEN_REQUIRE_GPU=1
t0=$SECONDS
p=bench/experiments/wgmma-hook-keep-bits.patch
timeout 230 bash scripts/dev/patch_run.sh keep "$p" -- bash -c 'bash scripts/dev/pytest_shards.sh 8 \
  /tmp/q10a tests/gpu/test_hooks.py -k "wgmma_forward or built_in_wgmma_kernels or range_summaries" \
  && bash scripts/dev/pytest_shards.sh 8 /tmp/q10b tests/gpu/test_hooks_torch.py' > "$OUT/keep-tests.txt" 2>&1
echo "tests rc=$? at $((SECONDS - t0)) s"; tail -10 "$OUT/keep-tests.txt"
export PYTHONPATH=/tmp/site
timeout 300 bash scripts/dev/mask_ab.sh 3 "$p" > "$OUT/keep-ab.txt" 2>&1
echo "ab at $((SECONDS - t0)) s"; grep -E "fwd" "$OUT/keep-ab.txt"
