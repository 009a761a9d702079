#!/bin/bash
# scripts/dev/fa4_cpu.sh: FA4's sm90 kernels compiled on the CPU machine (no GPU), for their SASS.
#   bash scripts/dev/fa4_cpu.sh install                    FA4 4.0.0b36's stack for this Python
#                                                          (pip --target /tmp/fa4cpu/site; ~300 MB)
#   bash scripts/dev/fa4_cpu.sh fwd|bwd D T CAUSAL OUTDIR  PTX, cubin and SASS of FA4's kernel
# The versions are the ones the GPU host's FA4 runs (../shared/gpu-host, .fa4/); cuda-bindings,
# triton and einops are imported by FA4's modules, not used. Read the result with
# scripts/dev/sass_loops.py. See scripts/dev/fa4_fake_compile.py.
set -euo pipefail
site=/tmp/fa4cpu/site
here=$(cd "$(dirname "$0")" && pwd)
case ${1:?usage: fa4_cpu.sh install | fwd|bwd D T CAUSAL OUTDIR} in
install)
  python3 -m pip install -q --no-deps --target "$site" \
    "nvidia-cutlass-dsl==4.8.1" "nvidia-cutlass-dsl-libs-base==4.8.1" "nvidia-cutlass-dsl-libs-core==4.8.1" \
    "nvidia-cutlass-dsl-libs-cu13==4.8.1" "apache-tvm-ffi==0.1.15.post2" "flash-attn-4==4.0.0b36" \
    "quack-kernels==0.6.5" "torch-c-dlpack-ext==0.1.5" "cuda-bindings>=13,<14" cuda-pathfinder triton einops
  ;;
fwd | bwd)
  out=${5:?OUTDIR}
  mkdir -p "$out"
  PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages" CUTE_DSL_ARCH=sm_90a CUTE_DSL_KEEP=ptx,cubin \
    CUTE_DSL_DUMP_DIR="$out" python3 "$here/fa4_fake_compile.py" "$1" "$2" "$3" "$4" 2>&1 | grep -v Warning
  nvdisasm=$(python3 -c "import nvidia, os; print(os.path.join(nvidia.__path__[0], 'cu13', 'bin', 'nvdisasm'))" 2>/dev/null || true)
  [ -x "$nvdisasm" ] || nvdisasm=nvdisasm  # FA4's cubins need nvdisasm >= 13.4 (pip nvidia-cuda-nvdisasm)
  for c in "$out"/*.cubin; do "$nvdisasm" -c "$c" > "${c%.cubin}.sass"; done
  ls "$out"
  ;;
*) echo "usage: fa4_cpu.sh install | fwd|bwd D T CAUSAL OUTDIR" >&2; exit 2 ;;
esac
