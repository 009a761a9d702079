"""The loops of one kernel's SASS and what they are made of: instruction classes per loop body.

    python3 scripts/dev/sass_loops.py K.sass [--kernel NAME] [--min 60] [--top N]
    python3 scripts/dev/sass_loops.py K.sass --region 0x22c0 0x3e30 [--skip 0x1e10 0x27a0]
                                      [--vs FA4.sass 0x22c0 0x3e30]

K.sass is `nvdisasm -c` (or `cuobjdump -sass`) output. Without --region: every backward branch
(a loop) whose body holds a tensor-core op, an exp or more than --min instructions, with its
length and the counts of the classes that tell a FlashAttention step apart (HGMMA, MUFU, the
float math, barriers, uniform and integer address math). With --region: one stretch, less the
--skip stretch (e.g. the masked alternative of a step), opcode by opcode; with --vs, beside
another kernel's stretch, sorted by the difference. This is how ours and FA4's steady loops
were compared instruction by instruction on the CPU machine (bench/NOTES.md, twenty-fourth
session; FA4's SASS from scripts/dev/fa4_cpu.sh).
"""

from __future__ import annotations

import argparse
import collections
import re

LOOP_KEYS = (
    "HGMMA", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "F2FP", "SYNCS", "BAR", "WARPGROUP",
    "BRA", "UIADD3", "UMOV", "IMAD", "LEA", "LOP3", "R2UR", "LDG", "LDS", "STS", "STSM",
)  # fmt: skip


def parse(path: str, kernel: str | None = None) -> tuple[list[tuple[int, str]], dict[str, int]]:
    """(address, instruction) pairs of the kernel's text section (the first, or `kernel`'s)
    and each label's address."""
    ins: list[tuple[int, str]] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    inside = kernel is None
    with open(path) as f:
        lines = f.read().splitlines()
    for line in lines:
        section = re.match(r"\s*\.text\.(\S+):", line)
        if section:
            if ins and inside:
                break  # the next kernel
            inside = kernel is None or section.group(1) == kernel
            continue
        if not inside:
            continue
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                labels[name] = addr
            pending.clear()
            ins.append((addr, m.group(2)))
    return ins, labels


def opcode(text: str) -> str:
    """The opcode without predicate and modifiers: `@!P0 LDG.E.64` -> LDG."""
    return re.sub(r"^@!?U?P[0-9T]+\s+", "", text).split()[0].split(".")[0]


def loops(ins: list[tuple[int, str]], labels: dict[str, int]) -> list[tuple[int, int]]:
    """(first, last) indices of every backward branch's body."""
    index = {a: i for i, (a, _) in enumerate(ins)}
    out = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA.*`\((\.L_x_\d+)\)", text)
        if m and m.group(1) in labels and labels[m.group(1)] <= a:
            out.append((index[labels[m.group(1)]], i))
    return out


def region(ins: list[tuple[int, str]], lo: int, hi: int, skip: tuple[int, int] | None) -> list[str]:
    return [t for a, t in ins if lo <= a <= hi and not (skip and skip[0] <= a < skip[1])]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("sass")
    ap.add_argument("--kernel")
    ap.add_argument("--min", type=int, default=60)
    ap.add_argument("--top", type=int, default=0, help="print only the first N loops")
    ap.add_argument("--region", nargs=2)
    ap.add_argument("--skip", nargs=2)
    ap.add_argument("--vs", nargs=3, metavar=("SASS", "LO", "HI"))
    a = ap.parse_args()
    ins, labels = parse(a.sass, a.kernel)
    if not a.region:
        shown = 0
        for lo, hi in loops(ins, labels):
            c = collections.Counter(opcode(t) for _, t in ins[lo : hi + 1])
            if (c["HGMMA"] or c["MUFU"] or hi - lo > a.min) and (not a.top or shown < a.top):
                shown += 1
                classes = " ".join(f"{k}={c[k]}" for k in LOOP_KEYS if c[k])
                first, last = ins[lo][0], ins[hi][0]
                print(f"loop {first:#x}-{last:#x}: {hi - lo + 1} instructions; {classes}")
        return
    skip = (int(a.skip[0], 16), int(a.skip[1], 16)) if a.skip else None
    lo, hi = int(a.region[0], 16), int(a.region[1], 16)
    mine = collections.Counter(map(opcode, region(ins, lo, hi, skip)))
    other: collections.Counter[str] = collections.Counter()
    if a.vs:
        o_ins, _ = parse(a.vs[0])
        o_lo, o_hi = int(a.vs[1], 16), int(a.vs[2], 16)
        other = collections.Counter(map(opcode, region(o_ins, o_lo, o_hi, None)))
    print(f"{sum(mine.values())} instructions" + (f" vs {sum(other.values())}" if a.vs else ""))
    for k in sorted(set(mine) | set(other), key=lambda k: (-(mine[k] - other[k]), k)):
        beside = f" {other[k]:5d} {mine[k] - other[k]:+5d}" if a.vs else ""
        print(f"{k:14s} {mine[k]:5d}{beside}")


if __name__ == "__main__":
    main()
