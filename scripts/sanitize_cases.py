"""Run a handful of variants on ragged shapes; compute-sanitizer wraps this script.

One causal and one non-causal variant per family, Tq != Tk both ways, lengths that are not
multiples of the tiles. Exits 1 when an output breaks the correctness rule.
"""

from __future__ import annotations

import sys

from flashgen.generator.checks import check_variant
from flashgen.generator.spec import KernelSpec

SPECS = (
    KernelSpec(family="simt", d=64, br=32, bc=32, dtype="bf16", causal=True),
    KernelSpec(family="simt", d=96, br=16, bc=64, dtype="fp32", causal=False),
    KernelSpec(family="mma", d=64, br=128, bc=64, dtype="bf16", causal=True, warps=8, stages=2),
    KernelSpec(family="mma", d=128, br=64, bc=64, dtype="fp16", causal=False, warps=4, stages=1),
    KernelSpec(family="mma", d=128, br=128, bc=64, dtype="bf16", causal=True, warps=4, stages=1),
)
SHAPES = ((1, 2, 70, 133), (2, 1, 133, 70), (1, 1, 1, 257))


def main() -> int:
    """Check every (spec, shape); print one line each; 1 if any fails."""
    bad = 0
    for spec in SPECS:
        for b, h, tq, tk in SHAPES:
            r = check_variant(spec, b=b, h=h, tq=tq, tk=tk, seed=tq * 7 + tk)
            print(
                f"{spec.name} b={b} h={h} tq={tq} tk={tk} o_err/bound="
                f"{r.o_err:.3g}/{r.o_bound:.3g} {'PASS' if r.passed else 'FAIL'}"
            )
            bad += not r.passed
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
