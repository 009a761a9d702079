#!/usr/bin/env bash
# Stage FlashAttention-4 (its sm90 path: the strongest peer of issue 10) for the GPU host, which
# cannot reach PyPI: `scripts/fa4_stage.sh` on the CPU machine downloads the wheels the host
# needs (Python 3.12, manylinux; pins from ../shared/gpu-host/README.md) into .fa4/ (ignored by
# git) and splits them into two carries under the device tool's 64 MiB limit:
#   .fa4/part1/  the first 55 MB of nvidia-cutlass-dsl-libs-cu13 (92 MB alone)
#   .fa4/part2/  its rest and every other wheel
# On the host, two `run` calls back to back (the machine is released after ~30 s idle):
#   1. carry [".fa4/part1"]:  bash scripts/fa4_install.sh part1
#   2. carry [".fa4/part2", ...]: bash scripts/fa4_install.sh part2 && <the bench>
# after which `source /tmp/fa4/env.sh` puts FA4 on PYTHONPATH (flashgen bench then times it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dl="$root/.fa4/download"
mkdir -p "$dl" "$root/.fa4/part1" "$root/.fa4/part2"
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$dl" flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5 \
  apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
big=$(ls "$dl"/nvidia_cutlass_dsl_libs_cu13-*.whl)
rm -f "$root"/.fa4/part1/* "$root"/.fa4/part2/*
split -b 55M "$big" "$root/.fa4/part1/cu13.part-"
mv "$root/.fa4/part1/cu13.part-ab" "$root/.fa4/part2/"
basename "$big" > "$root/.fa4/part2/cu13.name"
for w in "$dl"/*.whl; do [ "$w" = "$big" ] || cp "$w" "$root/.fa4/part2/"; done
du -sh "$root/.fa4/part1" "$root/.fa4/part2"
