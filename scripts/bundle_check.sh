#!/usr/bin/env bash
# Bundles on the GPU host: `scripts/bundle_check.sh OUTDIR`
#   1. `python3 -m flashgen bundle` writes a bundle holding one simt variant (fp32, non-causal)
#      and one mma variant (bf16, causal); `python3 -m flashgen build --bundle` writes a
#      single-variant bundle (mma, fp16, non-causal); `python3 -m flashgen bundle --family wgmma`
#      writes a Hopper bundle (wgmma, bf16, d 64 and 128, causal and not: four variants, whose
#      launchers build TMA tensor maps through the driver entry point at run time);
#      `--features` writes a Hopper bundle with feature variants beside a plain one (wgmma bf16
#      d 128 causal: plain, window, softcap+alibi; dispatch by the features the params use);
#      `bwd` writes a bundle with backward variants (`flashgen_bwd`: three kernels per call,
#      the caller's workspace): mma bf16 d 64 causal beside its forward partner (the example
#      runs that forward for O and LSE), mma fp16 d 128 non-causal alone (O and LSE from the
#      CPU), and `python3 -m flashgen build --direction bwd --bundle` a one-variant one;
#      `bwd-wgmma` writes a bundle with wgmma backward variants (sm_90a: four TMA tensor maps
#      per call, a workspace padded to whole 64-row query tiles): bf16 d 128 non-causal beside
#      its wgmma forward partner, fp16 d 64 causal alone (O and LSE from the CPU);
#   2. each is configured and built with CMake for sm_90 only (FLASHGEN_CUDA_ARCHITECTURES,
#      default 90-real; wgmma kernels always sm_90a) -- plain CMake + nvcc, no Python involved;
#   3. each bundle's `example` runs every variant on the GPU against its float64 CPU
#      reference and checks that bad parameters are refused; with compute-sanitizer present,
#      the multi-variant, wgmma, features, bwd and bwd-wgmma examples also run under memcheck,
#      and the bwd-wgmma one under racecheck too.
# BUNDLES (default "multi single wgmma features bwd bwd-wgmma") picks which to build.
# Everything goes to OUTDIR/bundle.txt; the last line is PASS or FAIL; exit 0 only on PASS.
# Needs the checkout importable (PYTHONPATH, set below), nvcc, cmake and a CUDA GPU; no PyCUDA.
set -euo pipefail

out=${1:?usage: scripts/bundle_check.sh OUTDIR}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py=${PYTHON:-python3}
archs=${FLASHGEN_CUDA_ARCHITECTURES:-90-real}
jobs=${JOBS:-8}
bundles=" ${BUNDLES:-multi single wgmma features bwd bwd-wgmma} "
want() { [[ "$bundles" == *" $1 "* ]]; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log=$out/bundle.txt
work="$(mktemp -d "${TMPDIR:-/tmp}/flashgen-bundle.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
cd "$root"

SIMT=flash_fwd_simt_d64_br32_bc32_fp32_noncausal
MMA=flash_fwd_mma_d128_br128_bc64_bf16_causal_w4_s1
# the backward bundle: a backward variant with its forward partner, and one without
BWD=flash_bwd_mma_d64_br64_bc64_bf16_causal_w4_s2
BWD_FWD=flash_fwd_mma_d64_br128_bc64_bf16_causal_w4_s2
BWD_ALONE=flash_bwd_mma_d128_br64_bc64_fp16_noncausal_w4_s1
# the wgmma backward bundle: the same pattern (Tq = 77, 131 and 65 are not multiples of the
# 64-row query tile, so the padded scratch rows are exercised; the causal one has Tq > Tk rows
# that see no key)
BWD_WGMMA=flash_bwd_wgmma_d128_br64_bc128_bf16_noncausal_s2
BWD_WGMMA_FWD=flash_fwd_wgmma_d128_br128_bc128_bf16_noncausal_s2
BWD_WGMMA_ALONE=flash_bwd_wgmma_d64_br64_bc128_fp16_causal_s3

: >"$log"
failures=()
note() { echo "$*" | tee -a "$log"; }
# step NAME CMD...: run CMD with its output in the log; a failure is recorded, not fatal
step() {
  local name=$1 start=$SECONDS rc=0
  shift
  note "==> $name: $*"
  "$@" >>"$log" 2>&1 || rc=$?
  note "<== $name: rc=$rc, $((SECONDS - start)) s"
  if [ "$rc" -ne 0 ]; then
    failures+=("$name (rc=$rc)")
  fi
  return 0
}

note "flashgen bundle_check $(date -u +%FT%TZ) commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo unknown)"
nvcc=$("$py" -c "from flashgen.generator.nvcc import find_nvcc; print(find_nvcc())" 2>>"$log") || {
  note "FAIL: flashgen finds no nvcc (see $log)"
  exit 1
}
note "nvcc: $nvcc ($("$nvcc" --version | grep release || true)); cmake: $(cmake --version | head -n1)"

build_and_run() {  # build_and_run NAME DIR: configure, build, run the example
  local name=$1 dir=$2
  step "$name configure" cmake -S "$dir" -B "$dir/build" -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DFLASHGEN_CUDA_ARCHITECTURES="$archs"
  step "$name build" cmake --build "$dir/build" -j "$jobs"
  if [ -x "$dir/build/example" ]; then
    step "$name example" "$dir/build/example"
  else
    note "$name: no example binary"
    failures+=("$name example (not built)")
  fi
}

if want multi; then
  step "write multi" "$py" -m flashgen bundle "$work/multi" --name "$SIMT" --name "$MMA"
  build_and_run multi "$work/multi"
fi
if want single; then
  step "write single" "$py" -m flashgen build --family mma --d 64 --dtype fp16 --no-causal \
    --no-compile --bundle "$work/single"
  build_and_run single "$work/single"
fi
if want wgmma; then
  step "write wgmma" "$py" -m flashgen bundle "$work/wgmma" --family wgmma --d 64 --d 128
  if grep -q "add_library(flashgen_kernels_sm90a OBJECT" "$work/wgmma/CMakeLists.txt" 2>/dev/null; then
    build_and_run wgmma "$work/wgmma"
  else
    note "wgmma: the bundle holds no sm_90a object library"
    failures+=("wgmma bundle (no wgmma variant)")
  fi
fi
if want features; then
  step "write features" "$py" -m flashgen bundle "$work/features" --family wgmma --d 128 \
    --causal --features window --features softcap,alibi
  build_and_run features "$work/features"
fi
if want bwd; then
  step "write bwd" "$py" -m flashgen bundle "$work/bwd" --name "$BWD" --name "$BWD_FWD" \
    --name "$BWD_ALONE"
  build_and_run bwd "$work/bwd"
  step "write bwd-single" "$py" -m flashgen build --family mma --d 64 --dtype fp16 --causal \
    --direction bwd --no-compile --bundle "$work/bwd-single"
  build_and_run bwd-single "$work/bwd-single"
fi
if want bwd-wgmma; then
  step "write bwd-wgmma" "$py" -m flashgen bundle "$work/bwd-wgmma" --name "$BWD_WGMMA" \
    --name "$BWD_WGMMA_FWD" --name "$BWD_WGMMA_ALONE"
  build_and_run bwd-wgmma "$work/bwd-wgmma"
fi

sanitize() {  # sanitize TOOL NAME: the NAME bundle's example under compute-sanitizer TOOL
  local tool=$1 name=$2
  if command -v compute-sanitizer >/dev/null 2>&1 && [ -x "$work/$name/build/example" ]; then
    step "$name $tool" compute-sanitizer --tool "$tool" --error-exitcode 3 \
      "$work/$name/build/example"
  else
    note "$name $tool: skipped (no compute-sanitizer or no example)"
  fi
}
for name in multi wgmma features bwd bwd-wgmma; do
  sanitize memcheck "$name"
done
# the wgmma backward's producer/consumer ring and its shared-memory dQ staging: racecheck too
sanitize racecheck bwd-wgmma

# the example's verdict lines, then ours
grep -E "^(PASS|FAIL)|FAIL$|ERROR SUMMARY" "$log" | sed 's/^/  /' || true
if [ "${#failures[@]}" -eq 0 ]; then
  note "PASS: bundle_check (${bundles# }: multi = $SIMT + $MMA; single = mma d64 fp16" \
    "non-causal; wgmma = d64/d128 bf16 causal + non-causal for sm_90a; features = wgmma d128" \
    "bf16 causal plain, window, softcap+alibi; bwd = $BWD + $BWD_FWD + $BWD_ALONE, and" \
    "mma bwd d64 fp16 causal alone; bwd-wgmma = $BWD_WGMMA + $BWD_WGMMA_FWD +" \
    "$BWD_WGMMA_ALONE; archs $archs)"
  exit 0
fi
note "FAIL: bundle_check: ${failures[*]}"
exit 1
