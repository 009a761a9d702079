#!/bin/bash
# bench/experiments/next-queue-8.sh: the second GPU call of the session after the twenty-first
# (bench/NOTES.md): proves `wgmma-map-words-in-lanes.patch` (a block-map row of <= 32 words read
# once per item, a word per lane, the walks taking words by shuffles instead of a load per
# word; forward and backward; 0 spills, CPU-checked) and A/Bs it on the mask rows, 3 rounds,
# forward and backward (it should move the document rows, whose items crossed empty words a
# load each, and leave prefix-LM / the causal hook alone: no map). Run from the repo root
# (carry .whl):  bash bench/experiments/next-queue-8.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin FLASHGEN_REQUIRE_GPU=1
t0=$SECONDS
p=bench/experiments/wgmma-map-words-in-lanes.patch
timeout 200 bash scripts/dev/patch_run.sh lanes "$p" -- bash scripts/dev/pytest_shards.sh 8 \
  /tmp/q8t tests/gpu/test_hooks_torch.py > "$OUT/lanes-tests.txt" 2>&1
echo "tests rc=$? at $((SECONDS - t0)) s"; tail -10 "$OUT/lanes-tests.txt"
export PYTHONPATH=/tmp/site
timeout 330 bash scripts/dev/mask_ab.sh 3 --bwd "$p" > "$OUT/lanes-ab.txt" 2>&1
echo "ab at $((SECONDS - t0)) s"; grep -E "fwd|bwd" "$OUT/lanes-ab.txt"
