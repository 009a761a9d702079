#!/bin/bash
# bench/experiments/decode-bulk-ring-run.sh: one GPU call (~6 min, guarded to end by ~8.7) for
# decode-bulk-ring.patch (issue 26, the long-cache gap: 4.15-4.19 TB/s vs SDPA's 4.48 at B32
# Tk32k GQA 32/8 d128 bf16, same 256-block grid). Hypothesis: too few bytes in flight per SM.
# The patch gives a decode block a producer warp that fills a block-shared ring of
# warps x stages K/V tiles with cp.async.bulk (one bulk copy per K row and per V row, mbarrier
# full/empty pairs): while the 4 consumer warps wait, every slot of the ring is in flight (main:
# one tile per warp). Same shared memory as main at stages 2, plus 16 B of mbarriers a slot
# (~128 KB in flight per SM at 2 blocks, vs ~64 KB). Only in the code for sm_90 and newer, and
# only for a variant whose registers allow a fifth warp without losing blocks per SM
# (mma/decode.py producer_warps): 2 blocks of 5 warps cap a thread at 168 registers (3 warps
# in one register sub-partition), which that code is held to (__launch_bounds__(160, 2)).
# ptxas sm_90: d128 br16 166-168 registers (main 185-189), 0 spills, 2 blocks per SM as main;
# br 32 (~217 with a producer: 1 block, or 84-268 B of spills at 168) keeps main's kernel (4
# warps, SASS identical to main's), as does all sm_80 code, whose launch is the consumers alone
# (128 threads; the host launches KernelSpec.threads_on(arch), a bundle asks the PTX version).
# Two more trees come from the same patch with one constant changed (sed, below):
#   -p2: DECODE_PRODUCER_WARPS = 2 -- ptxas issues a warp's bulk copies one lane at a time
#        (ELECT/R2UR/UBLKCP loop, ~9 instructions a row, 32 rows a d128 tile): if the single
#        producer's issue chain is the limit, p2 beats the plain patch (6 warps: still 168
#        registers and 2 blocks per SM at d128 br16).
#   -s3: DECODE_RING_STAGES = 3 -- 12 slots (109 KB at d128, still 2 blocks per SM on the H200;
#        variants without producers keep 2 stages).
# Steps (run from the repo root, .whl carried):
#   1. tests/gpu/test_decode.py on the patched tree (8 shards): $OUT/tests.txt. A hang (rc 124)
#      means a barrier/phase bug: the script stops there (the A/B would hang too).
#   2. decode_ab.sh 3 rounds, base vs bulk-ring vs -p2 vs -s3 on three big rows (2.1 GB each)
#      and two small ones: $OUT/ab.txt, one line per (row, metric): median GB/s per tree and
#      (ratio to base). flashgen_gbs = contiguous cache, paged16/paged256 = shuffled pages.
#      Read: big rows (B32 Tk32k 32/8, B8 Tk131k 32/8, B32 Tk131k 8/1) are the hypothesis
#      (base ~4150-4190 GB/s; SDPA 4480 on the first); small rows (B1 Tk4k 8/1, B8 Tk4k 32/8)
#      are latency-bound and guard against regressions (B1 Tk4k runs the 8-warp few-blocks
#      variant: 9 warps, one producer per SM there, 166 registers). Paged16 is the bulk loader's
#      worst case (a page lookup per row). B8 Tk32k 8/1 Tq 4 runs br 32, which keeps main's
#      kernel in every tree (the extra warp would drop it to 1 block per SM: 217 registers x
#      160 threads): a control that should read ~1.00.
#   3. tests/gpu/test_decode.py on -p2 and -s3 while time is left: $OUT/tests-variants.txt.
# Raw JSON and logs: $OUT/raw.tgz.
#   bash bench/experiments/decode-bulk-ring-run.sh
set -u
E=bench/experiments
P=$E/decode-bulk-ring.patch
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1 FLASHGEN_REQUIRE_GPU=1
rm -rf /tmp/raw && mkdir -p /tmp/raw/ab
t0=$SECONDS
left() { echo $((510 - (SECONDS - t0))); }  # seconds of the call's budget still free

# the two variants: the same patch with one added line changed (same line count, so it applies)
sed 's/^+DECODE_PRODUCER_WARPS = 1$/+DECODE_PRODUCER_WARPS = 2/' $P > $E/decode-bulk-ring-p2.patch
sed 's/^+DECODE_RING_STAGES = 2$/+DECODE_RING_STAGES = 3/' $P > $E/decode-bulk-ring-s3.patch
grep -q '^+DECODE_PRODUCER_WARPS = 2$' $E/decode-bulk-ring-p2.patch \
  && grep -q '^+DECODE_RING_STAGES = 3$' $E/decode-bulk-ring-s3.patch || echo "variant sed failed"

# 1. correctness of the patched tree (compiles land in /tmp/fgc, which the A/B reuses)
FLASHGEN_CACHE_DIR=/tmp/fgc timeout 240 bash scripts/dev/patch_run.sh bulk $P -- \
  bash scripts/dev/pytest_shards.sh 8 /tmp/raw/tests-bulk tests/gpu/test_decode.py > "$OUT/tests.txt" 2>&1
rc=$?
echo "tests rc=$rc at $((SECONDS - t0)) s"; tail -12 "$OUT/tests.txt"
if [ $rc -eq 124 ]; then
  # (240 s include compiling into a cold cache: the shard logs in raw.tgz say whether a test
  # was stuck in a launch or still compiling)
  echo "test_decode timed out (a hang? see the shard logs): no A/B"; tar czf "$OUT/raw.tgz" -C /tmp raw; exit 1
fi

# 2. the A/B
ROWS="32,32768,32,8,1;8,131072,32,8,1;32,131072,8,1,1;1,4096,8,1,1;8,4096,32,8,1;8,32768,8,1,4" OUT=/tmp/raw/ab \
  timeout $(($(left) - 60)) bash scripts/dev/decode_ab.sh 3 $P $E/decode-bulk-ring-p2.patch \
  $E/decode-bulk-ring-s3.patch > "$OUT/ab.txt" 2>&1 || echo "decode_ab: rc $?" >> "$OUT/ab.txt"
echo "A/B done at $((SECONDS - t0)) s"; cat "$OUT/ab.txt"

# 3. the variants' correctness, while time is left
for v in p2 s3; do
  if [ "$(left)" -lt 60 ]; then echo "$v: not tested (time)" >> "$OUT/tests-variants.txt"; continue; fi
  echo "== $v" >> "$OUT/tests-variants.txt"
  FLASHGEN_CACHE_DIR=/tmp/fgc timeout "$(left)" bash scripts/dev/patch_run.sh "bulk-$v" \
    "$E/decode-bulk-ring-$v.patch" -- bash scripts/dev/pytest_shards.sh 8 "/tmp/raw/tests-$v" \
    tests/gpu/test_decode.py >> "$OUT/tests-variants.txt" 2>&1
  echo "$v: rc $?" >> "$OUT/tests-variants.txt"
done
echo "done at $((SECONDS - t0)) s"; cat "$OUT/tests-variants.txt"
tar czf "$OUT/raw.tgz" -C /tmp raw
