"""Decode bandwidth on the GPU: flashgen's kv-cache kernel beside torch SDPA, FlashInfer and a
device copy -- the decode rows of `flashgen bench` (flashgen/perf/bench_serving.py, whose
docstring says what each number is), run on their own or on rows of your choosing.

    python3 scripts/decode_bench.py OUT.json [--quick | --rows 'B,Tk,H,H_kv,Tq;...'] [--no-peers]
        [--plot]

The issue 26 rows: bf16, d 128; GQA 32/8 and 8/1; Tq 1 and 4; B 1, 8, 32; Tk 4096, 32768,
131072 where the cache fits. FlashInfer is timed (Tq 1 rows) when `import flashinfer` works:
staged on the GPU host by scripts/flashinfer_stage.sh. Prints the table `flashgen bench`
prints; writes every number to OUT.json (and with --plot a PNG beside it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from flashgen.cli.app import format_table
from flashgen.perf import bench_serving as bs
from flashgen.perf import serving_plot

QUICK = [bs.DecodeCase(8, 8192, 32, 8, 1), bs.DecodeCase(1, 65536, 32, 8, 1),
         bs.DecodeCase(32, 4096, 32, 8, 1), bs.DecodeCase(8, 32768, 8, 1, 4)]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--quick", action="store_true", help="a few rows only")
    ap.add_argument(
        "--rows", help="rows to run instead, 'B,Tk,H,H_kv,Tq;...' (e.g. '8,8192,32,8,1')"
    )
    ap.add_argument("--no-peers", action="store_true", help="flashgen only (no SDPA, no copy)")
    ap.add_argument("--plot", action="store_true",
                    help="also write OUT.png (flashgen.perf.serving_plot; needs matplotlib)")
    args = ap.parse_args()
    cases = QUICK if args.quick else bs.decode_cases()
    if args.rows:
        cases = [bs.DecodeCase(*(int(x) for x in part.split(",")))
                 for part in args.rows.split(";")]  # fmt: skip
    if not args.no_peers and bs.optional_module(bs.FLASHINFER_MODULE) is None:
        print("flashinfer does not import: no FlashInfer rows", flush=True)
    rows = []
    for case in cases:
        rows.append(bs.decode_row(case, peers=not args.no_peers))
        print(f"{case.label}: {rows[-1].get('flashgen_gbs', 0.0):.0f} GB/s", flush=True)
    for line in format_table(*bs.decode_table(rows)):
        print(line)
    for note in bs.serving_notes(rows):
        print(f"note: {note}", file=sys.stderr)
    gpu = torch.cuda.get_device_name()
    with open(args.out, "w") as f:
        json.dump({"gpu": gpu, "rows": rows}, f, indent=1)
    if args.plot:
        png = Path(args.out).with_suffix(".png")
        try:
            if serving_plot.plot(rows, png, gpu):
                print(f"wrote {png}")
        except ImportError:
            print("matplotlib does not import: no PNG (pip install matplotlib; or later "
                  "scripts/serving_plot.py OUT.json)", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
