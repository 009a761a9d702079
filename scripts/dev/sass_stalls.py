"""Where a kernel's warps wait, per SASS instruction, from ncu's source page (CSV).

    ncu ... --section SourceCounters -o REP <program>      (GPU host; scripts/dev/peer_compare.sh)
    ncu --import REP.ncu-rep --page source --csv --print-source sass > K.csv
    python3 scripts/dev/sass_stalls.py K.csv [K2.csv ...] [--top 30]

Prints, per file: the stall-reason totals, the instructions with the most warp samples (with
their top reasons), and the samples of the hottest loop (the instructions executed most often)
grouped by kind (HGMMA of S or of P V, the waits for them, named barriers, mbarrier polls, MUFU,
FMNMX, ...). Two files side by side (ours and a peer) show where one spends the cycles the
other does not: the comparison behind the 2026-12-01 loop changes (bench/NOTES.md).
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path: str) -> tuple[list[str], list[list[str]]]:
    """The header and the instruction rows of an ncu source-page CSV (first line: kernel name)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[1], rows[2:]


def num(x: str) -> float:
    try:
        return float(x or 0)
    except ValueError:
        return 0.0


def ranked(d: dict[str, float]) -> list[tuple[str, float]]:
    """Items by value, largest first."""
    return sorted(d.items(), key=lambda kv: -kv[1])


def kind(sass: str) -> str:
    """A coarse class of one SASS line (predicate stripped)."""
    words = sass.split()
    op = words[1] if words and words[0].startswith("@") else (words[0] if words else "")
    if op.startswith("HGMMA"):
        return "HGMMA P V" if "tnspB" in sass else "HGMMA S"
    if op.startswith("WARPGROUP.DEPBAR"):
        return "wait wgmma " + words[-1].rstrip(";")
    if op.startswith("BAR."):
        return op.split(".")[0] + "." + op.split(".")[1]
    if op.startswith("SYNCS") or op == "BRA":
        return "mbarrier / branch"
    for k in ("MUFU", "FMNMX", "FFMA", "FMUL", "FADD", "F2FP", "SHFL"):
        if op.startswith(k):
            return k
    return "uniform" if op.startswith("U") else "other"


def report(path: str, top: int) -> None:
    hdr, data = load(path)
    ix = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(num(r[ix[SAMPLES]]) for r in data)
    print(f"== {path}: {total:.0f} warp samples")
    by_reason: dict[str, float] = collections.defaultdict(float)
    for r in data:
        for h in reasons:
            by_reason[h] += num(r[ix[h]])
    print("   " + ", ".join(f"{h[6:]} {100 * v / total:.1f}%" for h, v in ranked(by_reason)[:8]))
    for r in sorted(data, key=lambda r: -num(r[ix[SAMPLES]]))[:top]:
        best = sorted(((num(r[ix[h]]), h[6:]) for h in reasons), reverse=True)[:2]
        why = ", ".join(f"{h} {v:.0f}" for v, h in best if v)
        print(f"   {r[0][-5:]} {num(r[ix[SAMPLES]]):7.0f}  {r[1].strip()[:58]:58s} {why}")
    # the hottest loop: the instructions sharing the execution count that gathers the most
    # samples (a loop body runs every instruction equally often; spin loops have few samples)
    per_count: dict[float, float] = collections.defaultdict(float)
    for r in data:
        per_count[num(r[ix[EXECUTED]])] += num(r[ix[SAMPLES]])
    most = max((c for c in per_count if c > 0), key=lambda c: per_count[c])
    loop = [r for r in data if num(r[ix[EXECUTED]]) == most]
    groups: dict[str, float] = collections.defaultdict(float)
    for r in loop:
        groups[kind(r[1].strip())] += num(r[ix[SAMPLES]])
    share = sum(groups.values())
    print(f"   hottest loop: {len(loop)} instructions x {most:.0f}, {share:.0f} samples")
    for k, v in ranked(groups):
        print(f"      {k:20s} {v:8.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    for path in args.csv:
        report(path, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
