"""Run a set of variants on ragged shapes; compute-sanitizer wraps this script.

Every family, causal and not, every storage type, both pipeline depths, 4 and 8 warps, the
two-chain Q K^T of d = 256 and a non-power-of-two d; shapes with Tq != Tk both ways, lengths
that are not multiples of any tile, one query, and Tq > Tk with three keys (under the causal
mask most rows see no key). Small problems: under racecheck the whole run stays well under a
minute on an H200. Exits 1 when an output breaks the correctness rule. `--features` runs the
feature variants instead (FEATURE_SPECS).
"""

from __future__ import annotations

import sys

from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.verify.checks import Case, check_variant, run_case

SPECS = (
    KernelSpec(family="simt", d=64, br=32, bc=32, dtype="bf16", causal=True),
    KernelSpec(family="simt", d=96, br=16, bc=64, dtype="fp32", causal=False),
    KernelSpec(family="simt", d=32, br=64, bc=16, dtype="fp16", causal=True),
    KernelSpec(family="mma", d=64, br=128, bc=64, dtype="bf16", causal=True, warps=8, stages=2),
    KernelSpec(family="mma", d=128, br=64, bc=64, dtype="fp16", causal=False, warps=4, stages=1),
    KernelSpec(family="mma", d=128, br=128, bc=64, dtype="bf16", causal=True, warps=4, stages=1),
    KernelSpec(family="mma", d=256, br=128, bc=32, dtype="bf16", causal=False, warps=8, stages=2),
    KernelSpec(family="mma", d=32, br=128, bc=128, dtype="fp16", causal=True, warps=4, stages=1),
    KernelSpec(family="mma", d=96, br=128, bc=128, dtype="fp16", causal=False, warps=8, stages=1),
    # wgmma: three consumers (br 192), two (br 128) with bc 176, d 256; run it with
    # FLASHGEN_SM_LIMIT=2 too, so problems of more tiles take the persistent grid (a block
    # walks several tiles: the Q reload and the q_empty barrier)
    KernelSpec(family="wgmma", d=64, br=192, bc=128, dtype="bf16", causal=True, stages=2),
    KernelSpec(family="wgmma", d=128, br=128, bc=176, dtype="fp16", causal=False, stages=2),
    KernelSpec(family="wgmma", d=256, dtype="bf16", causal=True),
)
SHAPES = ((1, 2, 70, 133), (2, 1, 133, 70), (1, 1, 1, 257), (1, 1, 200, 3))
# `--features`: one variant per feature and family (shipped), and odd head dims generated on
# demand (zero-padded in-kernel), each with its feature values on ragged shapes and GQA
FEATURE_SPECS = (
    KernelSpec(family="wgmma", d=128, dtype="bf16", causal=True, features=("window",)),
    KernelSpec(family="wgmma", d=64, dtype="fp16", causal=False, features=("softcap",)),
    KernelSpec(family="wgmma", d=128, dtype="bf16", causal=False, features=("alibi",)),
    KernelSpec(family="mma", d=64, br=128, bc=64, dtype="bf16", causal=True, warps=4, stages=2,
               features=("window", "softcap")),
    KernelSpec(family="simt", d=64, dtype="fp32", causal=False, features=("alibi",)),
    KernelSpec(family="wgmma", d=80, dtype="bf16", causal=True,
               features=("window", "softcap", "alibi")),
    KernelSpec(family="mma", d=40, dtype="fp16", causal=False, features=("window", "alibi")),
)  # fmt: skip
FEATURE_VALUES = {"window": (37, 5), "softcap": 30.0, "alibi": 0.5}


def features_main() -> int:
    """`--features`: every FEATURE_SPECS variant with its feature values, GQA 4-on-2."""
    bad = 0
    for spec in FEATURE_SPECS:
        values = {f: FEATURE_VALUES[f] for f in spec.features}
        for b, h, tq, tk in SHAPES:
            case = Case(2 * b, 4 * h, tq, tk, None, 8.0, tq * 7 + tk, h_kv=2 * h, **values)
            r = run_case(spec, case)
            print(f"{r.describe()[:160]} {'PASS' if r.passed else 'FAIL'}")
            bad += not r.passed
    return 1 if bad else 0


def main() -> int:
    """Check every (spec, shape); print one line each; 1 if any fails."""
    if "--features" in sys.argv[1:]:
        return features_main()
    unshipped = [s.name for s in SPECS if s not in set(shipped())]
    if unshipped:  # the sanitizers vouch for the shipped space only
        print(f"not shipped: {', '.join(unshipped)}; pick shipped variants", file=sys.stderr)
        return 2
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
