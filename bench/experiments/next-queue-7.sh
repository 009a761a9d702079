#!/bin/bash
# bench/experiments/next-queue-7.sh: the first GPU call of the session after the twenty-first
# (bench/NOTES.md): issue 27's Flex bar re-measured with block maps (the forward and backward
# maps the op builds per call, and `flashgen.torch.block_map` built once per row as Flex's
# BlockMask is), document and prefix-LM rows, fwd and fwd+bwd, 2 rounds; FA4 skipped (its
# columns need the two-call install: ../shared/gpu-host/README.md). Then the document rows
# against the varlen kernel through CUDA graphs. Run from the repo root (carry .whl):
#   bash bench/experiments/next-queue-7.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/cuda/bin
t0=$SECONDS
timeout 470 python3 scripts/hooks_bench.py --out "$OUT/hooks_bench.json" --rounds 2 --no-hook-cost \
  --impls flashgen,flashgen-map,flex,builtin --budget-s 440 > "$OUT/hooks_bench.log" 2>&1
echo "hooks_bench rc=$? at $((SECONDS - t0)) s"; grep -v -i "warn" "$OUT/hooks_bench.log" | tail -40
timeout 100 python3 scripts/dev/doc_rows_graph.py > "$OUT/doc-rows.txt" 2>&1
echo "doc rows at $((SECONDS - t0)) s"; grep -v -i warn "$OUT/doc-rows.txt" | head -4
