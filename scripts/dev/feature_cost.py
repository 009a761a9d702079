"""A feature's cost, measured in interleaved rounds (the H200's clocks drift between runs):

    python3 scripts/dev/feature_cost.py OUT.json [--rounds 6] [--t 16384]

Each round times, for bf16 and fp16, the GQA (32 on 8 heads, causal and not) and causal
sliding-window (4096 back) rows of `flashgen bench` (bench_features): the feature variant and
the plain kernel back to back, so both see the same clocks. Writes every round's rows and
prints the median ratio flashgen / flashgen-plain (useful TFLOP/s) per row; the bar is 0.95.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict

from flashgen.generator.select import select
from flashgen.perf import bench_features as bf
from flashgen.perf.bench import environment
from flashgen.runtime import gpu as runtime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--t", type=int, default=16384)
    args = ap.parse_args()
    arch, gpu = runtime.device_arch(), runtime.device_name()
    cases = bf.feature_cases(seq_lens=(args.t,))
    rows = []
    ratios: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for fc in cases:
            plain = select(fc.d, fc.dtype, fc.causal, arch, gpu_name=gpu)
            got = bf.bench_feature_case(fc, plain, peers=False, reps=20)
            rows += [{**asdict(x), "round": r} for x in got]
            by = {x.impl: x.tflops for x in got}
            key = f"{fc.label} {fc.dtype} {'causal' if fc.causal else 'noncausal'} T={fc.t}"
            if by.get("flashgen") and by.get("flashgen-plain"):
                ratios.setdefault(key, []).append(by["flashgen"] / by["flashgen-plain"])
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "rounds": len(v)}
               for k, v in ratios.items()}  # fmt: skip
    with open(args.out, "w") as fh:
        json.dump({"env": environment(), "bar": bf.COST_BAR, "summary": summary, "rows": rows},
                  fh, indent=1)  # fmt: skip
    for k, s in summary.items():
        ok = "ok" if s["median"] >= bf.COST_BAR else "BELOW BAR"
        spread = f"min {s['min']:.3f}, max {s['max']:.3f}"
        print(f"{k}: x plain median {s['median']:.3f} ({spread}) {ok}")


if __name__ == "__main__":
    main()
