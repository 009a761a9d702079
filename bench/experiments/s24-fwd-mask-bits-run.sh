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
# 2. feature_cost.py (the window and GQA rows against the plain kernel, interleaved) in the base tree and
#    in the patched tree, 3 rounds each: $OUT/cost-{base,mask}.txt. Read both the window/plain ratio and
#    the absolute TFLOP/s (the plain causal kernel changes too).
set -u
P=bench/experiments/wgmma-fwd-mask-bits.patch
t0=$SECONDS
timeout 300 bash scripts/dev/patch_run.sh mask $P -- bash -c 'bash scripts/dev/pytest_shards.sh 8 /tmp/s24m \
  tests/gpu/test_property.py -k wgmma && bash scripts/dev/pytest_shards.sh 8 /tmp/s24h tests/gpu/test_hooks.py \
  -k "wgmma_forward or built_in_wgmma_kernels" && bash scripts/dev/pytest_shards.sh 4 /tmp/s24v tests/gpu/test_varlen.py' \
  > "$OUT/tests.txt" 2>&1
echo "tests rc=$? at $((SECONDS - t0)) s"; tail -20 "$OUT/tests.txt"
for r in 1 2; do
  for t in base mask; do
    if [ $t = base ]; then
      timeout 120 bash scripts/dev/patch_run.sh base -- python3 scripts/dev/feature_cost.py "$OUT/cost-base-$r.json" --rounds 2 >> "$OUT/cost-base.txt" 2>&1
    else
      timeout 120 bash scripts/dev/patch_run.sh mask2 $P -- python3 scripts/dev/feature_cost.py "$OUT/cost-mask-$r.json" --rounds 2 >> "$OUT/cost-mask.txt" 2>&1
    fi
    echo "$t round $r at $((SECONDS - t0)) s"
  done
done
tail -12 "$OUT/cost-base.txt" "$OUT/cost-mask.txt"
