#!/bin/bash
# bench/experiments/s34-bundle-decode-combine-run.sh (carry .whl; ~3 min): bundle-decode-combine.patch --
# bundles do what the Python runtime does on sm_90: with split keys, decode code built for sm_90+
# (cudaFuncGetAttributes: binaryVersion AND ptxVersion >= 90; JIT'd sm_80 PTX counts as sm_80)
# gets counters = NULL and is followed by <kernel>_combine as a programmatic dependent launch;
# on such code the decode kernel itself is a programmatic dependent too (split or not), the gate
# asked once per (variant, device); an automatic split count takes 2 tiles a warp while every
# block keeps an SM. Proves: the
# bundle's C example PASS and memcheck clean for a 90-real build (combine kernels launched) and
# for 80-real;80-virtual (JIT'd PTX on the H100: in-kernel merge, no combine kernels).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
bash scripts/dev/patch_run.sh bdc bench/experiments/bundle-decode-combine.patch -- bash -c '
r=$OUT/bdc; b=/tmp/bdc; mkdir -p $r
python3 -m flashgen bundle $b/src --name flash_decode_mma_d128_br16_bc16_bf16_noncausal_w4_s2 \
  --name flash_decode_mma_d64_br16_bc16_fp16_causal_w4_s2 >$r/write.txt 2>&1 || exit 4
for a in 90-real "80-real;80-virtual"; do t=${a%%-*}
  cmake -S $b/src -B $b/$t -DFLASHGEN_CUDA_ARCHITECTURES="$a" >$r/build-$t.txt 2>&1 &&
    cmake --build $b/$t -j 16 >>$r/build-$t.txt 2>&1 || { echo "build $t FAILED"; continue; }
  $b/$t/example >$r/example-$t.txt 2>&1; echo "example $t rc=$? $(tail -1 $r/example-$t.txt)"
  compute-sanitizer --tool memcheck --error-exitcode 3 $b/$t/example >$r/memcheck-$t.txt 2>&1; echo "memcheck $t rc=$?"
  ncu -k regex:_combine --metrics gpu__time_duration.sum $b/$t/example >$r/ncu-$t.txt 2>&1
  echo "combine kernels $t: $(grep -c "_combine" $r/ncu-$t.txt)"
  # the launches by API: 90-real cudaLaunchKernelExC = decode + combine calls, 80: none;
  # cudaFuncGetAttributes = the decode variants used (2) in both
  if command -v nsys >/dev/null; then
    nsys profile --trace=cuda -o $r/nsys-$t $b/$t/example >/dev/null 2>&1
    nsys stats -r cuda_api_sum $r/nsys-$t.nsys-rep 2>/dev/null | grep -E "LaunchKernel|FuncGetAttributes|Name" | tee $r/api-$t.txt
  else echo "no nsys: launch APIs not counted"; fi
done'
