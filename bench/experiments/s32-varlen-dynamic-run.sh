#!/bin/bash
# bench/experiments/s32-varlen-dynamic-run.sh: one GPU call (~7-8 min; carry .whl) for
# wgmma-varlen-dynamic.patch: a dynamic persistent tile scheduler for the wgmma VARLEN forward.
# Today's static snake hands round r of block x item r*gridDim.x +- x; with the patch a block's
# first item is item blockIdx.x and every later one comes from a global atomic counter
# (gridDim.x + atomicAdd), in the same list order (sequences longest first, query tiles last
# first, heads inner), drawn only when the block is about to need it.
# Who draws: a scheduler thread (lane 0 of the producer warpgroup's second warp) walks the
# sequences with the cursor as before and publishes each item in a one-slot shared-memory "work
# ring" (7 ints + a full and an empty mbarrier, at fixed offsets beside the sequences' order).
# Readers: the load issuer (warp 0 of the producer: the whole warp takes the slot and broadcasts
# it with __shfl_sync, so the values are warp-uniform and live in uniform registers -- the
# issuer has 24 vector registers) and every consumer thread (lane 0 of each consumer warp frees
# the slot after __syncwarp). The slot's empty barrier counts the consumer warps AND the issuer,
# which frees it only after issuing the item's loads: that is the cue for the next draw (just
# in time: ~2 key tiles before the block needs it). Items with no key tile and the end (head -1)
# pass the ring too, so Q's handshake is not involved. Counter: two int32 words; each block
# counts itself done after its last draw and the last block resets both to zero. Hosts: torch
# keeps one pair per (device, stream) (zeroed once) and takes fresh torch.zeros per call under
# graph capture; the NumPy/GPUArray path the runtime's kernel-restored zeros (legacy stream);
# the bundle launcher cudaMallocAsync + cudaMemsetAsync + kernel + cudaFreeAsync per call.
# CPU side (done): dense and backward renders byte-identical; 64 varlen variants (d 64/128,
# bf16/fp16, causal or not, 8 feature sets) 0 spills, 168/128 registers as before (the
# launch bound), smem +48 B; SASS of d128 bf16 causal: 3936 instructions vs 4136 (the consumers
# no longer walk the sequences).
#   1. tests on the patched tree, 8 shards: tests/gpu/test_varlen.py (3 new: > 256 sequences in
#      the order given, two streams at once bit-equal to one stream with the counters back at 0,
#      a batch with no item at all), test_varlen_property.py, test_api_varlen.py (GPUArray path),
#      then the forward's tests again as 3 SMs (FLASHGEN_SM_LIMIT=3: blocks draw many items;
#      the two streams' blocks share the GPU) -> $OUT/vdy-tests.txt
#   2. stress as 8 SMs (-> $OUT/vdy-stress.txt): 300 back-to-back launches on one stream, each
#      bit-equal to the first; 2 streams x 20 launches at once; a CUDA graph replayed on one
#      stream while eager calls run on two others; every cached counter pair 0 afterwards
#   3. compute-sanitizer memcheck (3 ragged cases: padding rows, Tq != Tk, GQA 3/1) and
#      racecheck (the first case) as 2 SMs, judged by the float64 oracle -> $OUT/vdy-sanitize.txt
#   4. a varlen bundle (d128 bf16 causal, d64 fp16 window) built with CMake + nvcc in the
#      background, its example (exercises the launcher's cudaMallocAsync'd counter) -> vdy-bundle.txt
#   5. 3 interleaved rounds, base vs patched, of scripts/varlen_bench.py --no-peers (16
#      sequences of 64..4096 tokens, 16k, shuffled, H 16, d 128, causal and not, bf16 and fp16;
#      the dense rows are a control: their kernels are the same in both trees) -> vdy-bench.txt
#   Raw logs -> $OUT/vdy-raw.tgz
#   bash bench/experiments/s32-varlen-dynamic-run.sh
set -u
P=bench/experiments/wgmma-varlen-dynamic.patch
export FLASHGEN_CACHE_DIR=/tmp/fgc PYTHONUNBUFFERED=1
t0=$SECONDS
rm -rf /tmp/vdy-raw; mkdir -p /tmp/vdy-raw
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/vdy-tests.txt"

cat > /tmp/vdy_compile.py <<'PY'
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
spill = [s.name for s, c in r.items() if not isinstance(c, Exception) and c.report.spill_bytes]
print(what, len(r), "compiled;", len(bad), "failed", bad[:3], ";", len(spill), "spill", spill[:3])
PY

# background, CPU only: the bundle's build (4.) and the base tree's timed variants (5.)
VB=/tmp/vdybundle
BUNDLE_A=flash_fwd_wgmma_d128_br128_bc128_bf16_causal_varlen_s2
BUNDLE_B=flash_fwd_wgmma_d64_br128_bc128_fp16_noncausal_window_varlen_s2
(
  timeout 300 bash scripts/dev/patch_run.sh vdyb $P -- bash -c "
    rm -rf $VB && nvcc=\$(python3 -c 'from flashgen.generator.nvcc import find_nvcc; print(find_nvcc())') &&
    python3 -m flashgen bundle $VB --name $BUNDLE_A --name $BUNDLE_B &&
    grep -c 'cudaMallocAsync(reinterpret_cast<void\*\*>(&counter)' $VB/flashgen_launch.cu &&
    cmake -S $VB -B $VB/build -DCMAKE_CUDA_COMPILER=\$nvcc -DFLASHGEN_CUDA_ARCHITECTURES=90-real &&
    cmake --build $VB/build -j 8"
  echo "bundle build rc=$?"
) > /tmp/vdy-raw/bundle-build.log 2>&1 &
build_pid=$!
(sleep 5; timeout 300 bash scripts/dev/patch_run.sh base -- python3 /tmp/vdy_compile.py bench "$gpu") \
  > /tmp/vdy-raw/compile-base.log 2>&1 &
base_pid=$!

# ---- 1. tests ----------------------------------------------------------------------------------
KB='not gradient and not backward and not dq'  # the 3-SM pass: the forward's tests
FLASHGEN_REQUIRE_GPU=1 timeout 330 bash scripts/dev/patch_run.sh vdy $P -- bash -c "
  python3 /tmp/vdy_compile.py tests '$gpu' && python3 /tmp/vdy_compile.py bench '$gpu' &&
  bash scripts/dev/pytest_shards.sh 8 /tmp/vdy-raw/t tests/gpu/test_varlen.py \
    tests/gpu/test_varlen_property.py tests/gpu/test_api_varlen.py &&
  FLASHGEN_SM_LIMIT=3 bash scripts/dev/pytest_shards.sh 8 /tmp/vdy-raw/t3 tests/gpu/test_varlen.py \
    tests/gpu/test_varlen_property.py -k '$KB'" >> "$OUT/vdy-tests.txt" 2>&1
rc=$?
echo "tests rc=$rc$([ $rc -eq 124 ] && echo ' (timed out)') at $((SECONDS - t0)) s" | tee -a "$OUT/vdy-tests.txt"
grep -E "compiled;|^shard|^(FAILED|ERROR)" "$OUT/vdy-tests.txt" | tail -24
if [ $rc -ne 0 ]; then
  kill "$build_pid" "$base_pid" 2>/dev/null
  tar czf "$OUT/vdy-raw.tgz" -C /tmp vdy-raw 2>/dev/null
  exit 1
fi

# ---- 2. stress: many launches, two streams, a graph beside eager calls --------------------------
cat > /tmp/vdy_stress.py <<'PY'
# FLASHGEN_SM_LIMIT=8 (set by the caller): small persistent grids, so that launches on several
# streams run at the same time and every block draws many items
import sys

import torch

from flashgen import varlen as fv
from flashgen.torch import flash_attn_varlen_func

torch.manual_seed(0)
H, D = 8, 128
BATCHES = [[700, 1, 64, 300, 0, 129, 2048, 5], [3000, 17, 512, 0, 1], [64] * 30 + [1000]]


def batch(lens):
    t = sum(lens) + 3  # 3 padding rows after the last sequence
    q = torch.randn(t, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return q, k, v, cu, max(lens)


def run(b):
    q, k, v, cu, m = b
    return flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=True)


bs = [batch(lens) for lens in BATCHES]
want = [run(b) for b in bs]
torch.cuda.synchronize()
bad = 0
# 300 back-to-back launches on one stream (each launch's last block resets the counter)
outs = [run(bs[i % 3]) for i in range(300)]
torch.cuda.synchronize()
n = sum(not torch.equal(o, want[i % 3]) for i, o in enumerate(outs))
print(f"one stream, 300 launches: {n} differ from the first")
bad += n
# 2 streams x 20 launches at once
streams = [torch.cuda.Stream() for _ in range(2)]
outs = []
for i in range(20):
    for j, s in enumerate(streams):
        with torch.cuda.stream(s):
            outs.append((j, run(bs[j])))
torch.cuda.synchronize()
n = sum(not torch.equal(o, want[j]) for j, o in outs)
print(f"two streams at once, 40 launches: {n} differ")
bad += n
# a graph of batch 2 replayed on one stream while eager calls of batches 0 and 1 run on two others
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    run(bs[2])
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    o_graph = run(bs[2])
three = [torch.cuda.Stream() for _ in range(3)]
outs = []
for i in range(10):
    with torch.cuda.stream(three[0]):
        g.replay()
        outs.append((2, o_graph.clone()))
    for j in (0, 1):
        with torch.cuda.stream(three[j + 1]):
            outs.append((j, run(bs[j])))
torch.cuda.synchronize()
n = sum(not torch.equal(o, want[j]) for j, o in outs)
print(f"graph replays beside eager calls on two streams, 30 results: {n} differ")
bad += n
left = {k: w.tolist() for k, w in fv._counters.items() if int(w.abs().sum())}
print(f"cached counter pairs: {len(fv._counters)}, not back at zero: {left}")
bad += len(left)
print("PASS" if not bad else "FAIL")
sys.exit(1 if bad else 0)
PY
FLASHGEN_SM_LIMIT=8 timeout 90 bash scripts/dev/patch_run.sh vdy $P -- python3 /tmp/vdy_stress.py \
  > "$OUT/vdy-stress.txt" 2>&1
echo "stress rc=$? at $((SECONDS - t0)) s" | tee -a "$OUT/vdy-stress.txt"
grep -vE "^\s*$" "$OUT/vdy-stress.txt" | tail -6

# ---- 3. memcheck and racecheck -------------------------------------------------------------------
cat > /tmp/vdy_sanitize.py <<'PY'
# the patched varlen d 128 forward on ragged sequences: each sequence against the float64 oracle,
# rows with no key exactly 0 / -inf, padding rows after the last sequence 0 / -inf. argv[1]: how
# many of the cases to run
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
for lens_q, lens_k, h, h_kv, dt, causal, pad in CASES[: int(sys.argv[1])]:
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
  {
    FLASHGEN_SM_LIMIT=2 timeout 120 bash scripts/dev/patch_run.sh vdy $P -- compute-sanitizer \
      --tool memcheck --error-exitcode 3 python3 /tmp/vdy_sanitize.py 3
    echo "memcheck rc=$? at $((SECONDS - t0)) s"
    FLASHGEN_SM_LIMIT=2 timeout 120 bash scripts/dev/patch_run.sh vdy $P -- compute-sanitizer \
      --tool racecheck --racecheck-report all --error-exitcode 3 python3 /tmp/vdy_sanitize.py 1
    echo "racecheck rc=$? at $((SECONDS - t0)) s"
  } > "$OUT/vdy-sanitize.txt" 2>&1
  grep -E "PASS|FAIL|SUMMARY|rc=" "$OUT/vdy-sanitize.txt" | tail -8
else
  echo "sanitizers: skipped (no compute-sanitizer)" | tee "$OUT/vdy-sanitize.txt"
fi

# ---- 4. the varlen bundle's example --------------------------------------------------------------
wait "$build_pid"
{
  cat /tmp/vdy-raw/bundle-build.log
  if [ -x $VB/build/example ]; then
    timeout 60 $VB/build/example; echo "example rc=$?"
  else
    echo "bundle: no example binary (see the build log above)"
  fi
} > "$OUT/vdy-bundle.txt" 2>&1
echo "bundle done at $((SECONDS - t0)) s"
grep -E "rc=|^(PASS|FAIL)" "$OUT/vdy-bundle.txt" | tail -6

# ---- 5. timed rounds: base vs patched -----------------------------------------------------------
wait "$base_pid"; tail -1 /tmp/vdy-raw/compile-base.log
mkdir -p /tmp/vdy-raw/b
for r in 1 2 3; do
  for t in base vdy; do
    # the call's 10 minutes: a run that might not finish before ~590 s is not started
    if [ $((SECONDS - t0)) -gt 535 ]; then echo "round $r $t: skipped (time)"; continue; fi
    if [ $t = base ]; then ps=(); else ps=($P); fi
    timeout 50 bash scripts/dev/patch_run.sh $t "${ps[@]}" -- python3 scripts/varlen_bench.py \
      /tmp/vdy-raw/b/$t-$r.json --dtype bf16 fp16 --causal 1 0 --rounds 1 --no-peers \
      > /tmp/vdy-raw/b/$t-$r.log 2>&1 || tail -3 /tmp/vdy-raw/b/$t-$r.log
  done
done
echo "timed at $((SECONDS - t0)) s"
tar czf "$OUT/vdy-raw.tgz" -C /tmp vdy-raw 2>/dev/null
python3 - "$gpu" <<'PY' | tee "$OUT/vdy-bench.txt"
import glob, json, statistics, sys
print(f"{sys.argv[1]}: scripts/varlen_bench.py rows, TFLOP/s (useful), medians of the rounds")
med = {}
for t in ("base", "vdy"):
    acc = {}
    for f in glob.glob(f"/tmp/vdy-raw/b/{t}-*.json"):
        for r in json.load(open(f)).get("rows", []):
            if r.get("tflops"):
                acc.setdefault((r["kernel"], r["dtype"], r["causal"]), []).append(r["tflops"])
    med[t] = {k: (statistics.median(v), len(v)) for k, v in acc.items()}
print(f"{'kernel':<26} {'dtype':>5} {'causal':>6}  {'base':>7} n  {'patched':>7} n  x")
for k in sorted(set(med["base"]) | set(med["vdy"])):
    b, g = med["base"].get(k, (0.0, 0)), med["vdy"].get(k, (0.0, 0))
    x = f"{g[0] / b[0]:.3f}" if b[0] and g[0] else "-"
    print(f"{k[0]:<26} {k[1]:>5} {str(k[2]):>6}  {b[0]:7.1f} {b[1]}  {g[0]:7.1f} {g[1]}  x{x}")
PY
