"""Which wgmma tile serves the sliding window best? (a dev tool for issue 12's window cost)

    python3 scripts/window_tiles.py OUT.json [--rounds 3] [--dtype bf16]

For the bench's window row (causal, 4096 keys back, d = 128, T = 16384), times the window
variant of every shipped d = 128 causal wgmma tile, and the plain kernel `select` picks on the
plain causal problem, in interleaved rounds; prints each tile's median useful TFLOP/s and its
ratio to the plain kernel's (the variants issue's bar is 0.95).
"""

from __future__ import annotations

import argparse
import json
import statistics

from flashgen.generator.features import FeatureArgs
from flashgen.generator.select import select
from flashgen.generator.space import shipped
from flashgen.perf import bench_features as bf
from flashgen.perf.bench import time_ms
from flashgen.runtime import gpu as runtime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    arch, gpu = runtime.device_arch(), runtime.device_name()
    [fc] = [c for c in bf.feature_cases((args.dtype,), seq_lens=(16384,)) if c.kind == "window"]
    plain = select(128, args.dtype, True, arch, gpu_name=gpu)
    tiles = [s for s in shipped("wgmma") if s.d == 128 and s.causal and s.dtype == args.dtype
             and not s.features]  # fmt: skip
    feats = FeatureArgs(window=fc.window)
    runners = {"plain " + plain.name: (bf._runner(plain, *bf._inputs(fc, fc.h), FeatureArgs()),
                                        fc.flops(None))}  # fmt: skip
    for t in tiles:
        w = t.replace(features=feats.tokens)
        runners[w.name] = (bf._runner(w, *bf._inputs(fc, fc.h_kv), feats), fc.flops(fc.window))
    got: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for name, (fn, flops) in runners.items():
            got[name].append(flops / time_ms(fn, reps=20) / 1e9)
    med = {k: statistics.median(v) for k, v in got.items()}
    base = med["plain " + plain.name]
    with open(args.out, "w") as fh:
        json.dump({"rounds": got, "median": med, "plain": plain.name}, fh, indent=1)
    for k, v in sorted(med.items(), key=lambda kv: -kv[1]):
        print(f"{k:64s} {v:7.1f}  x plain {v / base:.3f}")


if __name__ == "__main__":
    main()
