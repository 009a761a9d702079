#!/bin/bash
# bench/experiments/s28-api-gpu-tests.sh: one GPU call (~3-4 min) for what session 27 landed on
# main with CPU proof only (bench/NOTES.md, twenty-seventh session): the NumPy/GPUArray serving
# front doors (tests/gpu/test_api_kvcache.py, test_api_varlen.py: oracle per sequence, GPUArray
# == NumPy bit for bit, NaN rows for bad device lengths/pages), FlashAttention's and torch's call
# names (test_torch_fa_api.py: bit-equal to attention / flash_attn_varlen_func), flashgen.attention
# (test_api.py; its few-query-row calls now take the decode kernel: runtime/dense_decode.py), the torch
# decode and varlen paths as controls (test_decode.py: its variant/split choice now goes through
# runtime/decode_call.choose_launch; test_varlen.py: flash_attn_varlen_func's new argument order).
# 8 shards; the wheels from .whl (carry it). A failure here is a main bug: fix it before anything
# lands on top. -> $OUT/api-tests/, $OUT/api-tests.txt
#   bash bench/experiments/s28-api-gpu-tests.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=/tmp/fgc FLASHGEN_REQUIRE_GPU=1
t0=$SECONDS
timeout 560 bash scripts/dev/pytest_shards.sh 8 "$OUT/api-tests" tests/gpu/test_api_kvcache.py \
  tests/gpu/test_api_varlen.py tests/gpu/test_torch_fa_api.py tests/gpu/test_decode.py tests/gpu/test_api.py \
  tests/gpu/test_varlen.py > "$OUT/api-tests.txt" 2>&1
echo "rc=$? at $((SECONDS - t0)) s"; cat "$OUT/api-tests.txt"
