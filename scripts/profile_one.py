"""Launch one variant on one benchmark-sized problem (for ncu / nsys to attach to).

Usage: python3 scripts/profile_one.py KERNEL_NAME [T]   (B*T = 16384 tokens, H*d = 2048)
A `window` variant runs the bench's sliding window (4096 keys back, bench_features.WINDOW).
"""

from __future__ import annotations

import sys

from flashgen.generator import bench
from flashgen.generator.bench_features import WINDOW
from flashgen.generator.features import FeatureArgs
from flashgen.generator.spec import KernelSpec


def main() -> int:
    """Warm up once, then run the kernel three times."""
    spec = KernelSpec.from_name(sys.argv[1])
    t = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    case = bench.Case(spec.dtype, spec.d, spec.causal, t)
    q, k, v = bench._inputs(case)
    window = WINDOW if "window" in spec.features else None
    run, _ = bench.flashgen_runner(spec, q, k, v, FeatureArgs(window=window))
    for _ in range(4):
        run()
    bench._torch().cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
