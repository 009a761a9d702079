#!/usr/bin/env bash
# The GPU host's half of scripts/fa4_stage.sh: `fa4_install.sh part1` keeps the first piece in
# /tmp/fa4 (run it first, in its own `run` call carrying .fa4/part1); `fa4_install.sh part2`
# (the next call, carrying .fa4/part2) joins the pieces, installs every wheel with --target
# /tmp/fa4/site and writes /tmp/fa4/env.sh (PYTHONPATH with the CuTe DSL's dsl_packages, which
# a --target install does not add through its .pth file). Prints whether FA4 imports.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p /tmp/fa4
case ${1:?usage: fa4_install.sh part1|part2} in
part1)
  cp "$root"/.fa4/part1/cu13.part-aa /tmp/fa4/
  ls -la /tmp/fa4
  ;;
part2)
  name=$(cat "$root/.fa4/part2/cu13.name")
  cat /tmp/fa4/cu13.part-aa "$root/.fa4/part2/cu13.part-ab" > "/tmp/fa4/$name"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa4/site \
    "/tmp/fa4/$name" "$root"/.fa4/part2/*.whl
  echo "export PYTHONPATH=/tmp/fa4/site:/tmp/fa4/site/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}" > /tmp/fa4/env.sh
  # shellcheck disable=SC1091
  source /tmp/fa4/env.sh
  python3 -c "from flash_attn.cute.interface import flash_attn_func; print('FA4 imports')"
  ;;
*) echo "usage: fa4_install.sh part1|part2" >&2; exit 2 ;;
esac
