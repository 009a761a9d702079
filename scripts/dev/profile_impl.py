"""Launch one implementation four times on one bench case (for ncu to attach to, GPU host).

    python3 scripts/dev/profile_impl.py IMPL D CAUSAL T [DTYPE]
    python3 scripts/dev/profile_impl.py KERNEL_NAME [T]     (d, causal, dtype from the name; T 4096)

IMPL as `scripts/dev/power_probe.py` takes it: a flashgen variant name (optionally `@bshd`,
`#tiles`, `#persistent`; a `window` variant runs the bench's window, 4096 keys back) or a peer
(`fa4`, `sdpa-cudnn`, `sdpa-flash`); CAUSAL is 0 or 1; DTYPE bf16 (default) or fp16.
B*T = 16384 and H*d = 2048, as in the bench.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import power_probe  # noqa: E402  (a sibling script)

from flashgen.generator.spec import KernelSpec  # noqa: E402
from flashgen.perf import bench  # noqa: E402


def main() -> int:
    """Build the case's inputs, then run IMPL four times (ncu: -s 1 -c 1 takes the second)."""
    if len(sys.argv) <= 3:  # KERNEL_NAME [T]
        spec = KernelSpec.from_name(sys.argv[1].partition("@")[0].partition("#")[0])
        t = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
        impl, case = sys.argv[1], bench.Case(spec.dtype, spec.d, spec.causal, t)
    else:
        impl, d, causal, t = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
        case = bench.Case(sys.argv[5] if len(sys.argv) > 5 else "bf16", d, causal, t)
    q, k, v = bench._inputs(case)
    fn = power_probe.runner(impl, case, q, k, v)
    for _ in range(4):
        fn()
    bench._torch().cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
