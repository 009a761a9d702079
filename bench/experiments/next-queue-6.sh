#!/bin/bash
# bench/experiments/next-queue-6.sh: the first GPU call of the session after the twentieth
# (bench/NOTES.md): proves the eager autograd shortcut (torch_support.eager_autograd:
# flashgen.torch training calls run the op's formula as an autograd.Function, not through the
# custom op's wrapper) with the torch front door's GPU tests (built-in, hooked, sinks,
# compile and graphs), then measures the host time per training call against the wrapper and
# SDPA (scripts/dev/train_host_cost.py) and the hooked rows' host cost. Run from the repo root
# (carry .whl):  bash bench/experiments/next-queue-6.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin FLASHGEN_REQUIRE_GPU=1
t0=$SECONDS
timeout 300 bash scripts/dev/pytest_shards.sh 8 /tmp/q6-tests tests/gpu/test_torch.py \
  tests/gpu/test_torch_backward.py tests/gpu/test_torch_sinks.py tests/gpu/test_hooks_torch.py \
  > "$OUT/tests.txt" 2>&1; echo "tests rc=$? at $((SECONDS - t0)) s"; tail -10 "$OUT/tests.txt"
timeout 120 python3 scripts/dev/train_host_cost.py --rounds 3 > "$OUT/train-host.txt" 2>&1
echo "train host at $((SECONDS - t0)) s"; grep -v -i warn "$OUT/train-host.txt"
timeout 90 python3 scripts/dev/hook_host_cost.py --bwd > "$OUT/host-cost-bwd.txt" 2>&1
echo "hooked host at $((SECONDS - t0)) s"; grep -v -i warn "$OUT/host-cost-bwd.txt"
