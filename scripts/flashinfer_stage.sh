#!/bin/bash
# FlashInfer as a decode peer on the GPU host (which has no package index).
#   CPU machine:  bash scripts/flashinfer_stage.sh pack      -> .fi/fi.tar.xz (~20 MB; carry .fi)
#   GPU host:     bash scripts/flashinfer_stage.sh install   -> /tmp/fi (then PYTHONPATH=/tmp/fi:...)
# flashinfer-python 0.7.4 is a 101 MB wheel (715 MB unpacked) of which decode needs the Python
# package, its JIT sources at the top of data/csrc, and the headers; the pack drops the rest
# (the other kernels' source folders, the experimental and prebuilt "cake" backends, files over
# 200 kB outside data/) so that it fits one carry. Its decode kernels are compiled by its JIT,
# with the host's nvcc, at the first call of each configuration (outside any timing).
set -eu
case "${1:-}" in
pack)
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  plat="--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64"
  pip download -q --no-deps flashinfer-python==0.7.4 -d "$work/wh"
  pip download -q --no-deps $plat apache-tvm-ffi==0.1.15.post2 einops==0.8.2 tabulate==0.10.0 \
    nvidia-ml-py==13.615.71 -d "$work/wh"
  mkdir -p "$work/site"
  for w in "$work"/wh/*.whl; do unzip -q -o "$w" -d "$work/site"; done
  rm -rf "$work"/site/*.dist-info
  fi="$work/site/flashinfer"
  find "$fi/data/csrc" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
  find "$fi" -path "$fi/data" -prune -o -type f -name "*.cu" -path "*cake_*" -print | xargs -r rm -f
  find "$fi" -path "$fi/data" -prune -o -type f ! -name "*.py" -size +200k -print | xargs -r rm -f
  mkdir -p .fi && tar cf - -C "$work/site" . | xz -T2 -6 > .fi/fi.tar.xz
  grep -qx '/.fi/' .git/info/exclude 2>/dev/null || echo '/.fi/' >> .git/info/exclude
  ls -la .fi/fi.tar.xz ;;
install)
  mkdir -p /tmp/fi && python3 -c "import tarfile; tarfile.open('.fi/fi.tar.xz').extractall('/tmp/fi')"
  echo "export PYTHONPATH=/tmp/fi:\${PYTHONPATH:-}" ;;
*) echo "usage: $0 pack|install"; exit 2 ;;
esac
