"""Variable-length prefill on the GPU: flashgen's varlen forward (or backward) against the
dense forward at the same token count and FA4's varlen (when `flash_attn.cute` imports) -- the
varlen rows of `flashgen bench` (flashgen/perf/bench_serving.py, whose docstring says what each
number is), run on their own with more choices.

    python3 scripts/varlen_bench.py OUT.json [--dtype bf16 fp16] [--causal 1 0] [--rounds 3]
    python3 scripts/varlen_bench.py OUT.json --backward [--sorted] [--no-peers] [...]

The issue 26 row set: 16 sequences of 64 to 4096 tokens, 16384 in all (shuffled; `--sorted`:
longest first), H 16, d 128, useful TFLOP/s (causal: each row's own prefix). `--backward`
(issue 26: varlen backward >= 0.95x the dense backward) times autograd.grad after one forward
at 2.5x the forward's FLOPs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flashgen.cli.app import format_table
from flashgen.perf import bench
from flashgen.perf import bench_serving as bs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", nargs="+", default=list(bs.VARLEN_DTYPES))
    ap.add_argument("--causal", nargs="+", type=int, default=[1])
    ap.add_argument("--rounds", type=int, default=bs.VARLEN_ROUNDS)
    ap.add_argument("--sorted", action="store_true", help="longest sequence first")
    ap.add_argument("--no-peers", action="store_true", help="flashgen's kernels only")
    ap.add_argument("--backward", action="store_true", help="the backward rows (autograd.grad)")
    args = ap.parse_args()
    if not args.no_peers and bs.optional_module(bs.FA4_MODULE) is None:
        print("FA4 (flash_attn.cute) does not import: no FA4 rows", file=sys.stderr)
    lengths = bs.LENGTHS if args.sorted else bs.SHUFFLED
    direction = "bwd" if args.backward else "fwd"
    rows: list[dict[str, Any]] = []
    for dtype in args.dtype:
        for causal in map(bool, args.causal):
            rows += bs.varlen_rows(dtype, causal, direction, peers=not args.no_peers,
                                   rounds=args.rounds, lengths=lengths)  # fmt: skip
    table = [[r["kernel"], r["dtype"], "yes" if r["causal"] else "no", f"{r['us']:.1f}",
              f"{r['tflops']:.1f}"] for r in rows if r["tflops"] is not None]  # fmt: skip
    for line in format_table(["kernel", "dtype", "causal", "us", "TFLOP/s"], table):
        print(line)
    for line in format_table(*bs.varlen_table(rows)):
        print(line)
    for note in bs.serving_notes(rows):
        print(f"note: {note}", file=sys.stderr)
    with open(args.out, "w") as f:
        factor = bench.BWD_FLOPS_FACTOR if args.backward else 1.0
        json.dump({"lengths": lengths, "heads": bs.VARLEN_HEADS, "d": bs.VARLEN_D,
                   "backward": args.backward, "flops_factor": factor, "rows": rows}, f,
                  indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
