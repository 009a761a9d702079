"""One timing round of hooked mask rows through `flashgen.torch.attention` (H200 A/B of hook
kernels and of the hooked front door): document masks (hooks_bench's 16 random documents, and
256-token documents: no partial tiles), prefix-LM (1024), the causal hook and (T 16384) the
window hook beside the built-in causal and window kernels it is measured against, d 64 and 128,
T 4096 and 16384, B*T = 16384, H*d = 2048, bf16; per row the median of three timings of 20
back-to-back calls (CUDA events), forward alone and, with --bwd, forward + autograd backward.
Prints one JSON object {row: microseconds}; scripts/dev/mask_ab.sh runs it in interleaved trees.

    python3 scripts/dev/mask_rows.py [--bwd]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def time_us(torch: Any, fn: Callable[[], Any], n: int = 20) -> float:
    """Median over three runs of `n` back-to-back calls, microseconds per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runs = []
    for _ in range(3):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) * 1000 / n)
    return sorted(runs)[1]


def shapes() -> list[tuple[int, int, int, int]]:
    """(d, T, B, H) of every row group: hooks_bench's protocol (B*T = 16384, H*d = 2048)."""
    import hooks_bench as hb

    return [(d, t, *hb.shape(d, t)) for d in (64, 128) for t in (4096, 16384)]


def inputs(torch: Any, d: int, t: int, b: int, h: int, grad: bool) -> tuple[Any, ...]:
    """q, k, v (leaves needing gradients when `grad`) and dO, (B, H, T, d) views of (B, T, H, d)
    memory, bf16."""

    def one() -> Any:
        return torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)

    return one().requires_grad_(grad), one().requires_grad_(grad), one().requires_grad_(grad), one()


def documents(torch: Any, t: int) -> list[tuple[str, Any]]:
    """(name, doc_ids on the GPU): hooks_bench's 16 random documents, and 256-token ones."""
    import hooks_bench as hb

    out = []
    for name, lengths in (("doc", hb.doc_lengths(t)), ("doc256", [256] * (t // 256))):
        out.append((name, torch.tensor(hb.doc_ids(lengths), dtype=torch.int32, device="cuda")))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bwd", action="store_true", help="time forward + backward too")
    args = ap.parse_args()
    import torch

    import flashgen.torch as fgt
    from flashgen.generator.hooks import library

    doc, pre, cau = library.document_hook(), library.prefix_lm_hook(), library.causal_hook()
    out: dict[str, float] = {}
    for d, t, b, h in shapes():
        q, k, v, do = inputs(torch, d, t, b, h, args.bwd)
        rows: list[tuple[str, dict[str, Any]]] = [
            (name, {"mask_mod": doc, "aux": {"doc_ids": ids}}) for name, ids in documents(torch, t)
        ]
        rows.append(("prefix", {"mask_mod": pre, "aux": {"prefix": 1024}}))
        if t == 16384:
            win = {"window_left": 4096, "window_right": 0}
            rows += [
                ("causalhook", {"mask_mod": cau, "aux": {}}),
                ("causal", {"causal": True}),  # the built-in kernels the hook rows face
                ("windowhook", {"causal": True, "mask_mod": library.window_hook(), "aux": win}),
                ("window", {"causal": True, "window": (4096, 0)}),
            ]
        for name, kw in rows:

            def fwd(kw: dict[str, Any] = kw, qkv: Any = (q, k, v)) -> Any:
                return fgt.attention(*qkv, **{"causal": False, **kw})

            with torch.no_grad():
                out[f"{name} d{d} T{t} fwd"] = time_us(torch, fwd)
            if args.bwd:

                def step(
                    fwd: Callable[[], Any] = fwd, qkv: Any = (q, k, v), do: Any = do
                ) -> Any:
                    return torch.autograd.grad(fwd(), qkv, do)

                out[f"{name} d{d} T{t} fwd+bwd"] = time_us(torch, step)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
