"""Training-step rows on the GPU: attention as a model's training step calls it (forward +
backward through autograd on (B, T, H, d) views, host time included), flashgen beside SDPA's
default and FA4 -- the training rows of `flashgen bench` (flashgen/perf/bench_training.py,
whose docstring says what each number is), run on their own.

    python3 scripts/training_bench.py OUT.json [--causal | --no-causal] [--no-peers]

Prints the table `flashgen bench` prints; writes every row to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from flashgen.cli.app import format_table
from flashgen.perf import bench_training as bt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    mask = ap.add_mutually_exclusive_group()
    mask.add_argument("--causal", dest="causal", action="store_const", const=(True,))
    mask.add_argument("--no-causal", dest="causal", action="store_const", const=(False,))
    ap.add_argument("--no-peers", action="store_true", help="flashgen only (SDPA still checks it)")
    args = ap.parse_args()
    causal = args.causal or (False, True)
    rows = []
    for case in bt.training_cases():
        if case.causal in causal:
            rows += bt.training_row(case, peers=not args.no_peers)
            print(f"{case.label}: done", flush=True)
    for line in format_table(*bt.training_table(rows)):
        print(line)
    for note in bt.error_notes(rows):
        print(f"note: {note}", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
