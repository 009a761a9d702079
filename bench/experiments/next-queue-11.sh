#!/bin/bash
# bench/experiments/next-queue-11.sh (session 22): `wgmma-hook-keep-bits-table-free.patch`, the
# keep-bits change (session 20's wgmma-hook-mask-bits-early.patch) for masks that read no table only (window, causal,
# prefix-LM hooks: their d 64 br = 192 variants then compile without spills and are chosen);
# table-reading masks (documents) keep the element-wise call, as on main. Hooked forward GPU
# tests, then a 3-round A/B on the mask rows, forward. Run from the repo root (carry .whl):
#   bash bench/experiments/next-queue-11.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin FLASHGEN_REQUIRE_GPU=1
t0=$SECONDS
p=bench/experiments/wgmma-hook-keep-bits-table-free.patch
timeout 230 bash scripts/dev/patch_run.sh keep "$p" -- bash -c 'bash scripts/dev/pytest_shards.sh 8 \
  /tmp/q11a tests/gpu/test_hooks.py -k "wgmma_forward or built_in_wgmma_kernels or range_summaries" \
  && bash scripts/dev/pytest_shards.sh 8 /tmp/q11b tests/gpu/test_hooks_torch.py' > "$OUT/keep-tests.txt" 2>&1
echo "tests rc=$? at $((SECONDS - t0)) s"; tail -10 "$OUT/keep-tests.txt"
export PYTHONPATH=/tmp/site
timeout 300 bash scripts/dev/mask_ab.sh 3 "$p" > "$OUT/keep-ab.txt" 2>&1
echo "ab at $((SECONDS - t0)) s"; grep -E "fwd" "$OUT/keep-ab.txt"
