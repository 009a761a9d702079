#!/bin/bash
# bench/experiments/s31-varlen-otma-run.sh: one GPU call (~7-8 min) for
# wgmma-varlen-o-tma-store.patch: the dense forward's O TMA store (f0ecf87, O_TMA_STORE) for the
# wgmma VARLEN forward. Packed O is (total_q, H, dv) and a 64-row box past a sequence's end would
# write the next sequence's rows, so per item each consumer warpgroup picks its epilogue at run
# time: one whose 64 rows lie wholly inside its sequence (q0 + 64c + 64 <= the sequence's length,
# its key range valid) stages them by stmatrix and TMA-stores them at packed row
# q_start + q0 + 64c (batch 0) through a fourth map tm_o over the packed rows; one crossing the
# end, past it, or of a sequence with NaN rows (cu_seqlens_k out of k) writes from the registers
# as before. The branch is warpgroup-uniform (it depends on the item and c only), so the
# staging's bulk_wait_read + two bar_sync(O_BARRIER + c, 128) stay balanced. Same staging and
# shared-memory rule as dense (+BR*DVP*2 B; not d 256). The bundle's varlen launcher encodes
# O's map over the packed totals and checks O's strides like Q's.
# CPU side (done): dense renders byte-identical; 48 varlen O_TMA variants (d 64/128, the feature
# sets select ships) 0 spills, ptxas registers unchanged (launch-bound 168 / 128), SASS max
# register index -16..+6 (max 236 of 240; br 192 157 of 160 unchanged); the epilogue gains
# STSM 4/8 + UTMASTG 1/2 (d 64/128) and keeps its STG (the register branch; +2 for the TMA
# branch's LSE). The bundle with both varlen variants builds with CMake + nvcc 13.0.
#   1. tests on the patched tree, 8 shards: tests/gpu/test_varlen.py and
#      tests/gpu/test_varlen_property.py (wgmma fp16/bf16, d 64/128, every feature), then again as
#      3 SMs (FLASHGEN_SM_LIMIT=3: persistent blocks walk many items, so the staging is reused
#      across TMA and register items) without the backward-only tests; a failure stops the
#      script -> $OUT/vlo-tests.txt
#   2. compute-sanitizer memcheck, as 2 SMs, of the patched varlen d 128 forward (bf16 causal with
#      70 padding rows, fp16 non-causal with Tq != Tk per sequence, bf16 GQA 3/1): sequences of
#      1, 7, 17, 63, 64, 65, 130, 200, 256 rows and an empty one, judged by the float64 oracle
#      -> $OUT/vlo-memcheck.txt
#   3. a varlen bundle (scripts/gpu_check.sh has no varlen kind: written here): the patched
#      d 128 bf16 causal and d 64 fp16 non-causal window varlen variants, built with CMake +
#      nvcc (in the background while 1. runs), its example (given lengths 77/1/0/131/40 + 3
#      padded rows, 24 random ones) as is and under memcheck -> $OUT/vlo-bundle.txt
#   4. 3 interleaved rounds, base tree vs patched, of scripts/varlen_bench.py's rows (16
#      sequences of 64..4096 tokens, 16k in all, shuffled, H 16, d 128, causal and not, bf16
#      and fp16; the dense B16 T1024 / B4 T4096 rows as a control: their kernels are the same
#      in both trees) -> $OUT/vlo-bench.txt: per row the median TFLOP/s of each tree, n, and
#      patched/base. Read: the "flashgen varlen" rows x > 1.00 beyond the dense rows' spread.
#   Raw logs (shards, bench JSON) -> $OUT/vlo-raw.tgz
#   bash bench/experiments/s31-varlen-otma-run.sh
set -u
P=bench/experiments/wgmma-varlen-o-tma-store.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
t0=$SECONDS
rm -rf /tmp/vlo-raw; mkdir -p /tmp/vlo-raw
# the staged wheels once, before any background job (patch_run.sh installs them again: a no-op)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/vlo-tests.txt"

cat > /tmp/vlo_compile.py <<'PY'
# compile the variants the varlen tests (or the timed rows) run, in parallel, so the shards
# start from a warm cache; CPU only (arch given: no CUDA context)
import itertools
import sys

from flashgen.generator.select import select
from flashgen.verify.checks import compile_all

what, gpu = sys.argv[1], sys.argv[2]
specs = set()
if what == "tests":
    feats = [(), ("window",), ("softcap",), ("alibi",), ("window", "softcap"), ("softcap", "alibi"),
             ("window", "alibi"), ("window", "softcap", "alibi")]
    for d, dt, causal, f in itertools.product((64, 128), ("bf16", "fp16"), (False, True), feats):
        specs.add(select(d, dt, causal, "sm_90a", gpu_name=gpu, features=(*f, "varlen")))
else:  # the timed rows: d 128 varlen and dense, both dtypes, causal and not
    for dt, causal in itertools.product(("bf16", "fp16"), (False, True)):
        specs.add(select(128, dt, causal, "sm_90a", gpu_name=gpu, features=("varlen",)))
        specs.add(select(128, dt, causal, "sm_90a", gpu_name=gpu))
r = compile_all(sorted(specs, key=lambda s: s.name), arch="sm_90a")
bad = [s.name for s, c in r.items() if isinstance(c, Exception)]
print(what, len(r), "compiled;", len(bad), "failed", bad[:3])
PY

# background, CPU only: the bundle's build (3.) and the base tree's timed variants (4.)
VB=/tmp/vlbundle
BUNDLE_A=flash_fwd_wgmma_d128_br128_bc128_bf16_causal_varlen_s2
BUNDLE_B=flash_fwd_wgmma_d64_br128_bc128_fp16_noncausal_window_varlen_s2
(
  timeout 300 bash scripts/dev/patch_run.sh vlob $P -- bash -c "
    rm -rf $VB && nvcc=\$(python3 -c 'from flashgen.generator.nvcc import find_nvcc; print(find_nvcc())') &&
    python3 -m flashgen bundle $VB --name $BUNDLE_A --name $BUNDLE_B &&
    grep -c 'maps\[3\], p->H, /\*n_batch=\*/1' $VB/flashgen_launch.cu &&
    cmake -S $VB -B $VB/build -DCMAKE_CUDA_COMPILER=\$nvcc -DFLASHGEN_CUDA_ARCHITECTURES=90-real &&
    cmake --build $VB/build -j 8"
  echo "bundle build rc=$?"
) > /tmp/vlo-raw/bundle-build.log 2>&1 &
build_pid=$!
(sleep 5; timeout 300 bash scripts/dev/patch_run.sh base -- python3 /tmp/vlo_compile.py bench "$gpu") \
  > /tmp/vlo-raw/compile-base.log 2>&1 &
base_pid=$!

# ---- 1. tests ----------------------------------------------------------------------------------
KB='not gradient and not backward and not dq'  # the 3-SM pass: the forward's tests
FLASHGEN_REQUIRE_GPU=1 timeout 300 bash scripts/dev/patch_run.sh vlo $P -- bash -c "
  python3 /tmp/vlo_compile.py tests '$gpu' && python3 /tmp/vlo_compile.py bench '$gpu' &&
  bash scripts/dev/pytest_shards.sh 8 /tmp/vlo-raw/t tests/gpu/test_varlen.py tests/gpu/test_varlen_property.py &&
  FLASHGEN_SM_LIMIT=3 bash scripts/dev/pytest_shards.sh 8 /tmp/vlo-raw/t3 tests/gpu/test_varlen.py \
    tests/gpu/test_varlen_property.py -k '$KB'" >> "$OUT/vlo-tests.txt" 2>&1
rc=$?
echo "tests rc=$rc$([ $rc -eq 124 ] && echo ' (timed out)') at $((SECONDS - t0)) s" | tee -a "$OUT/vlo-tests.txt"
grep -E "compiled;|^shard|^(FAILED|ERROR)" "$OUT/vlo-tests.txt" | tail -24
if [ $rc -ne 0 ]; then
  kill "$build_pid" "$base_pid" 2>/dev/null
  tar czf "$OUT/vlo-raw.tgz" -C /tmp vlo-raw 2>/dev/null
  exit 1
fi

# ---- 2. memcheck -------------------------------------------------------------------------------
cat > /tmp/vlo_memcheck.py <<'PY'
# the patched varlen d 128 forward on ragged sequences: each sequence against the float64 oracle,
# rows with no key exactly 0 / -inf, padding rows after the last sequence 0 / -inf
import sys

import ml_dtypes
import numpy as np
import torch

from flashgen.torch import flash_attn_varlen_func
from flashgen.verify.oracle import check_outputs

NP = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}
TT = {"fp16": torch.float16, "bf16": torch.bfloat16}
LENS = [1, 63, 64, 65, 200, 0, 130, 17, 256, 7]
CASES = [  # (lens_q, lens_k (None: = lens_q), H, H_kv, dtype, causal, padding rows)
    (LENS, None, 2, 2, "bf16", True, 70),
    (LENS, [5, 100, 64, 1, 300, 9, 130, 40, 200, 0], 2, 2, "fp16", False, 0),
    ([129, 1, 191, 64, 65], None, 3, 1, "bf16", True, 5),
]


def host(x, dt):
    return x.transpose(0, 1)[None].float().cpu().numpy().astype(NP[dt])


bad = 0
for lens_q, lens_k, h, h_kv, dt, causal, pad in CASES:
    lens_k = lens_k or lens_q
    g = torch.Generator(device="cuda").manual_seed(sum(lens_q) + pad)
    tq, tk = sum(lens_q) + pad, sum(lens_k) + pad
    q = torch.randn(tq, h, 128, device="cuda", dtype=TT[dt], generator=g)
    k = torch.randn(tk, h_kv, 128, device="cuda", dtype=TT[dt], generator=g)
    v = torch.randn(tk, h_kv, 128, device="cuda", dtype=TT[dt], generator=g)
    cq, ck = np.cumsum([0, *lens_q]).tolist(), np.cumsum([0, *lens_k]).tolist()
    cu_q = torch.tensor(cq, dtype=torch.int32, device="cuda")
    cu_k = torch.tensor(ck, dtype=torch.int32, device="cuda")
    o, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                    causal=causal, return_lse=True)
    torch.cuda.synchronize()
    fails = []
    for s, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        rows = slice(cq[s], cq[s] + nq)
        if nq == 0:
            continue
        if nk == 0:
            ok = bool((o[rows] == 0).all()) and bool((lse[:, rows] == float("-inf")).all())
        else:
            keys = slice(ck[s], ck[s] + nk)
            ok = check_outputs(host(o[rows], dt), lse[:, rows][None].cpu().numpy(),
                               host(q[rows], dt), host(k[keys], dt), host(v[keys], dt),
                               causal=causal, scale=128**-0.5, dtype=dt).passed
        if not ok:
            fails.append((s, nq, nk))
    if pad:
        tail = slice(cq[-1], tq)
        if not (bool((o[tail] == 0).all()) and bool((lse[:, tail] == float("-inf")).all())):
            fails.append(("padding", pad))
    print(f"varlen d128 {dt} causal={causal} H={h}/{h_kv} lens_q={lens_q} lens_k={lens_k} "
          f"pad={pad}: {'PASS' if not fails else f'FAIL {fails}'}")
    bad += bool(fails)
sys.exit(1 if bad else 0)
PY
if command -v compute-sanitizer >/dev/null 2>&1; then
  FLASHGEN_SM_LIMIT=2 timeout 120 bash scripts/dev/patch_run.sh vlo $P -- compute-sanitizer --tool memcheck \
    --error-exitcode 3 python3 /tmp/vlo_memcheck.py > "$OUT/vlo-memcheck.txt" 2>&1
  echo "memcheck rc=$? at $((SECONDS - t0)) s" | tee -a "$OUT/vlo-memcheck.txt"
  grep -E "PASS|FAIL|ERROR SUMMARY" "$OUT/vlo-memcheck.txt" | tail -5
else
  echo "memcheck: skipped (no compute-sanitizer)" | tee "$OUT/vlo-memcheck.txt"
fi

# ---- 3. the varlen bundle: its example, then under memcheck -------------------------------------
wait "$build_pid"
{
  cat /tmp/vlo-raw/bundle-build.log
  if [ -x $VB/build/example ]; then
    timeout 60 $VB/build/example; echo "example rc=$?"
    if command -v compute-sanitizer >/dev/null 2>&1; then
      timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 $VB/build/example
      echo "example memcheck rc=$?"
    fi
  else
    echo "bundle: no example binary (see the build log above)"
  fi
} > "$OUT/vlo-bundle.txt" 2>&1
echo "bundle done at $((SECONDS - t0)) s"
grep -E "rc=|^(PASS|FAIL)|ERROR SUMMARY" "$OUT/vlo-bundle.txt" | tail -8

# ---- 4. timed rounds: base vs patched -----------------------------------------------------------
wait "$base_pid"; tail -1 /tmp/vlo-raw/compile-base.log
mkdir -p /tmp/vlo-raw/b
for r in 1 2 3; do
  for t in base vlo; do
    # the call's 10 minutes: a run that might not finish before ~590 s is not started
    if [ $((SECONDS - t0)) -gt 540 ]; then echo "round $r $t: skipped (time)"; continue; fi
    if [ $t = base ]; then ps=(); else ps=($P); fi
    timeout 50 bash scripts/dev/patch_run.sh $t "${ps[@]}" -- python3 scripts/varlen_bench.py \
      /tmp/vlo-raw/b/$t-$r.json --dtype bf16 fp16 --causal 1 0 --rounds 1 --no-peers \
      > /tmp/vlo-raw/b/$t-$r.log 2>&1 || tail -3 /tmp/vlo-raw/b/$t-$r.log
  done
done
echo "timed at $((SECONDS - t0)) s"
tar czf "$OUT/vlo-raw.tgz" -C /tmp vlo-raw 2>/dev/null
python3 - "$gpu" <<'PY' | tee "$OUT/vlo-bench.txt"
import glob, json, statistics, sys
print(f"{sys.argv[1]}: scripts/varlen_bench.py rows, TFLOP/s (useful), medians of the rounds")
med = {}
for t in ("base", "vlo"):
    acc = {}
    for f in glob.glob(f"/tmp/vlo-raw/b/{t}-*.json"):
        for r in json.load(open(f)).get("rows", []):
            if r.get("tflops"):
                acc.setdefault((r["kernel"], r["dtype"], r["causal"]), []).append(r["tflops"])
    med[t] = {k: (statistics.median(v), len(v)) for k, v in acc.items()}
print(f"{'kernel':<26} {'dtype':>5} {'causal':>6}  {'base':>7} n  {'patched':>7} n  x")
for k in sorted(set(med["base"]) | set(med["vlo"])):
    b, g = med["base"].get(k, (0.0, 0)), med["vlo"].get(k, (0.0, 0))
    x = f"{g[0] / b[0]:.3f}" if b[0] and g[0] else "-"
    print(f"{k[0]:<26} {k[1]:>5} {str(k[2]):>6}  {b[0]:7.1f} {b[1]}  {g[0]:7.1f} {g[1]}  x{x}")
PY
