"""Host time of one training call (forward + backward) on the torch front door, eager
autograd shortcut (`torch_support.eager_autograd`) against the registered op's autograd
wrapper, beside torch SDPA, at a small shape where the host is the limit (H200 or any GPU).

    python3 scripts/dev/train_host_cost.py [--rounds 3]

Prints microseconds of host enqueue per call (30 calls, no sync inside) and the events wall
per call, for the built-in causal kernel and a causal mask_mod hook.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
SHORTCUT = "eager_autograd"  # the predicate flashgen.torch and flashgen.hooked each import


def per_call(torch: Any, fn: Callable[[], Any], n: int = 30) -> tuple[float, float]:
    """(host enqueue, events wall) microseconds per call of `fn`."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    b.record()
    torch.cuda.synchronize()
    return host, a.elapsed_time(b) / n * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    import flashgen.hooked as hooked
    import flashgen.torch as fgt
    from flashgen.generator.hooks import library

    b, h, t, d = 1, 8, 256, 64
    q, k, v, do = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_()
    causal = library.causal_hook()
    calls = {
        "flashgen causal": lambda: fgt.attention(q, k, v, causal=True),
        "flashgen causal_hook": lambda: fgt.attention(q, k, v, mask_mod=causal),
        "sdpa causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    modules = (fgt, hooked)  # each imports its own reference to the predicate
    real = [getattr(m, SHORTCUT) for m in modules]
    for r in range(args.rounds):
        for name, fwd in calls.items():
            modes = ("eager", "op") if name.startswith("flashgen") else ("",)
            for mode in modes:
                for m, pred in zip(modules, real, strict=True):  # "op": the wrapper, as before
                    setattr(m, SHORTCUT, (lambda *a: False) if mode == "op" else pred)

                def step(fwd: Callable[[], Any] = fwd) -> Any:
                    return torch.autograd.grad(fwd(), (q, k, v), do)

                host, wall = per_call(torch, step)
                print(f"round {r} {name:22s} {mode:5s} host {host:7.1f} us  wall {wall:7.1f} us",
                      flush=True)  # fmt: skip
    for m, pred in zip(modules, real, strict=True):
        setattr(m, SHORTCUT, pred)
    return 0


if __name__ == "__main__":
    sys.exit(main())
