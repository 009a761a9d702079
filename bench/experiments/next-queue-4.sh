#!/bin/bash
# bench/experiments/next-queue-4.sh: the four hook patches' GPU tests (after next-queue-3's A/B),
# each in its own patched tree (scripts/dev/patch_run.sh), 8 shards, while the call has time;
# then memcheck over one document case of the forward and backward patches. Run from the repo
# root (carry .whl):  bash bench/experiments/next-queue-4.sh [PATCH-NAME...]  (default: all four)
set -u
E=bench/experiments
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(wgmma-hook-mask-bits-early wgmma-bwd-hook-mask-bits-early \
  wgmma-bwd-producer-warp-walk wgmma-br192-mask-hooks)
export PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin FLASHGEN_REQUIRE_GPU=1
t0=$SECONDS
for p in "${names[@]}"; do
  left=$((560 - (SECONDS - t0))); [ $left -lt 90 ] && { echo "$p: no time left"; continue; }
  timeout $left bash scripts/dev/patch_run.sh "q4-$p" "$E/$p.patch" -- bash scripts/dev/pytest_shards.sh \
    8 "/tmp/q4-$p" tests/gpu/test_hooks.py tests/gpu/test_hooks_torch.py -k "wgmma or torch" \
    > "$OUT/tests-$p.txt" 2>&1
  echo "$p tests rc=$? at $((SECONDS - t0)) s"; tail -9 "$OUT/tests-$p.txt"
done
