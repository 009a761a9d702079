#!/bin/bash
# bench/experiments/s29-h100-tune.sh DTYPE: `flashgen tune` on the GPU this call gets (meant for an
# H100, which flashgen ships no table for: session 28's H100 bench ran d 64 at the families'
# default 128 x 128 tile). One call per dtype (~4-8 min each: ~30 plain candidates per key, 4 keys,
# T 4096/16384): the first writes $OUT/tune.json; copy it to flashgen/tuning/<gpu slug>.json
# (the slug is printed: `nvidia-h100-80gb-hbm3`), and the second call (fp16) updates that file
# in the working tree and writes it back to $OUT/tune.json. Commit the table with the results
# (bench/results/) and check `flashgen bench` picks its winners.
#   bash bench/experiments/s29-h100-tune.sh bf16; bash bench/experiments/s29-h100-tune.sh fp16
set -u
dtype=${1:?bf16 or fp16}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
slug=$(python3 -c "import torch; from flashgen.generator.tables import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))")
echo "gpu: $slug"
table=flashgen/tuning/$slug.json
[ -f "$table" ] && cp "$table" "$OUT/tune.json"
timeout 570 python3 -m flashgen tune --dtype "$dtype" --table "$OUT/tune.json" > "$OUT/tune-$dtype.txt" 2>&1
echo "tune rc=$?"; tail -8 "$OUT/tune-$dtype.txt"
