#!/bin/bash
# scripts/dev/patch_run.sh NAME PATCH... -- COMMAND...: run COMMAND (on the GPU host) in a copy of
# this checkout (flashgen, scripts, tests, docs, generated, README.md, pyproject.toml, bench/experiments) with PATCHes applied in order, under
# /tmp/pr/NAME, with the staged wheels (.whl/) and PYTHONPATH set; the compile cache
# FLASHGEN_CACHE_DIR (default /tmp/.fgc, or the one `tar xJf .fgcx/fgc.tar.xz -C /tmp` made)
# is shared. For proving a patch in bench/experiments/ before it lands: its tests, then its
# benchmark, in one `run` call; $OUT keeps working (absolute). E.g.
#   bash scripts/dev/patch_run.sh vlsort bench/experiments/wgmma-varlen-longest-first.patch -- \
#     python3 -m pytest -q tests/gpu/test_varlen.py
set -u
name=${1:?usage: patch_run.sh NAME PATCH... -- COMMAND...}; shift
patches=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patches+=("$1"); shift; done
[ "${1:-}" = "--" ] || { echo "patch_run.sh: missing -- before the command" >&2; exit 2; }
shift
here=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$here"/.whl/*.whl >/dev/null 2>&1
if [ -f "$here/.fgcx/fgc.tar.xz" ] && [ ! -d /tmp/.fgc ]; then tar xJf "$here/.fgcx/fgc.tar.xz" -C /tmp; fi
tree=/tmp/pr/$name
rm -rf "$tree"; mkdir -p "$tree"
cp -r "$here"/flashgen "$here"/scripts "$here"/tests "$here"/docs "$here"/generated "$here"/README.md "$here"/pyproject.toml "$tree"/
mkdir -p "$tree"/bench && cp -r "$here"/bench/experiments "$tree"/bench/  # patches may port other patches
for p in "${patches[@]}"; do
  (cd "$tree" && patch -s -p1 < "$here/$p") || { echo "patch_run.sh: $p does not apply" >&2; exit 3; }
done
cd "$tree" && FLASHGEN_CACHE_DIR=${FLASHGEN_CACHE_DIR:-/tmp/.fgc} PYTHONUNBUFFERED=1 \
  PYTHONPATH=/tmp/site:$tree${PYTHONPATH:+:$PYTHONPATH} "$@"
