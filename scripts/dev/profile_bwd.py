"""Run one backward variant through flashgen.torch on one bench-sized problem (for ncu / nsys).

    python3 scripts/dev/profile_bwd.py NAME [T]     (B*T = 16384 tokens, H*d = 2048)

A forward once, then `torch.autograd.grad` four times; the backward's three kernels run each
time (pre, main, post), so `ncu -k regex:NAME --launch-skip 1 --launch-count 1` takes one main.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for bwd_sweep

from bwd_sweep import use_variant  # noqa: E402  (scripts/bwd_sweep.py)

from flashgen.generator.spec import KernelSpec  # noqa: E402
from flashgen.perf import bench  # noqa: E402


def main() -> int:
    """Warm up once, then run the backward three more times."""
    spec = KernelSpec.from_name(sys.argv[1])
    t = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
    use_variant(spec)
    case = bench.Case(spec.dtype, spec.d, spec.causal, t)
    q, k, v = (x.requires_grad_() for x in bench._inputs(case))
    o, leaves = bench.backward_forward("flashgen", q, k, v, case.causal)
    do = torch.randn_like(o)
    for _ in range(4):
        torch.autograd.grad(o, leaves, do, retain_graph=True)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
