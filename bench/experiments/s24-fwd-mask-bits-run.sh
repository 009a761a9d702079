#!/bin/bash
# bench/experiments/s24-fwd-mask-bits-run.sh: one GPU call (~8 min) for wgmma-fwd-mask-bits.patch (issue 28,
# the causal window at 0.85-0.92x the plain causal kernel). Found on the CPU (FA4's sm90 forward compiled
# there, scripts/dev/fa4_cpu.sh): on a masked tile our forward waited for O += P V (DEPBAR.LE 0) before
# the mask and the whole softmax, after ~330 instructions of branchy 64-bit edge math, while FA4's masked
# loops keep that wait after ~30 exps, as in their steady loop. The patch computes each row's key edges
# once per row block, a tile's edges with one int subtraction, and masks through bit words (R2P + FSEL,
# as FA4): the window loop 1316 -> 1097 instructions, no branch in the masked path, the PV wait after
# 28 exps (causal: the same). Exactly key_hidden's verdicts (checked on 1.2M random cases on the CPU).
# Run from the repo root, .whl carried:
#   bash bench/experiments/s24-fwd-mask-bits-run.sh
# 1. The property suite on every shipped wgmma forward (window, softcap, ALiBi, GQA), the hooked wgmma
#    forward tests and the varlen tests, on the patched tree (8 shards): $OUT/tests.txt.
# 2. The varlen prefill row, base vs patch (below). 3. feature_cost.py (the window and GQA rows against the
#    plain kernel, interleaved) in the base tree and in the patched tree, alternating: $OUT/cost-*.txt.
#    Read both the window/plain ratio and the absolute TFLOP/s (the plain causal kernel changes too).
set -u
P=bench/experiments/wgmma-fwd-mask-bits.patch
t0=$SECONDS
timeout 300 bash scripts/dev/patch_run.sh mask $P -- bash -c 'bash scripts/dev/pytest_shards.sh 8 /tmp/s24m \
  tests/gpu/test_property.py -k wgmma && bash scripts/dev/pytest_shards.sh 8 /tmp/s24h tests/gpu/test_hooks.py \
  -k "wgmma_forward or built_in_wgmma_kernels" && bash scripts/dev/pytest_shards.sh 4 /tmp/s24v tests/gpu/test_varlen.py' \
  > "$OUT/tests.txt" 2>&1
echo "tests rc=$? at $((SECONDS - t0)) s"; tail -20 "$OUT/tests.txt"
# 2. The varlen prefill row (issue 26: bf16 0.953x FA4's 521 TFLOP/s in session 15): causal varlen runs
#    a masked diagonal tile in every query tile, more than half the tiles of a short sequence, so the
#    masked path is its hot path. Base vs patch, flashgen only (no FA4 here).
for t in base mask; do
  if [ $t = base ]; then
    timeout 70 bash scripts/dev/patch_run.sh vbase -- python3 scripts/varlen_bench.py "$OUT/varlen-base.json" --causal 1 --rounds 2 --no-peers > "$OUT/varlen-base.txt" 2>&1
  else
    timeout 70 bash scripts/dev/patch_run.sh vmask $P -- python3 scripts/varlen_bench.py "$OUT/varlen-mask.json" --causal 1 --rounds 2 --no-peers > "$OUT/varlen-mask.txt" 2>&1
  fi
  echo "varlen $t at $((SECONDS - t0)) s"; tail -4 "$OUT/varlen-$t.txt"
done
# 3. feature_cost (window and GQA rows against the plain kernel), base and patch alternating while the
#    call has time.
for r in 1 2 3; do
  for t in base mask; do
    if [ $((SECONDS - t0)) -gt 470 ]; then echo "stopped before $t round $r (time)"; break 2; fi
    if [ $t = base ]; then
      timeout 100 bash scripts/dev/patch_run.sh base -- python3 scripts/dev/feature_cost.py "$OUT/cost-base-$r.json" --rounds 1 >> "$OUT/cost-base.txt" 2>&1
    else
      timeout 100 bash scripts/dev/patch_run.sh mask2 $P -- python3 scripts/dev/feature_cost.py "$OUT/cost-mask-$r.json" --rounds 1 >> "$OUT/cost-mask.txt" 2>&1
    fi
    echo "$t round $r at $((SECONDS - t0)) s"
  done
done
tail -12 "$OUT/cost-base.txt" "$OUT/cost-mask.txt"
