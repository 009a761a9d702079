"""Document-mask rows timed through CUDA-graph replay (host time out), H200: the document hook
(`tab`: doc_ids and its range summary), the same 256-token block diagonal written without a
table (`free`), and the varlen kernel over the same documents; hooks_bench's shapes (B*T =
16384, H*d = 2048), bf16, d 64 and 128, T 4096 and 16384, 16 random documents and 256-token
ones. Prints a dict per shape, then one JSON object {row: microseconds per call}.

    python3 scripts/dev/doc_rows_graph.py   (repo root; PYTHONPATH holding the wheels and .)
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def graph_us(torch: Any, fn: Callable[[], Any], n: int = 10) -> float:
    """Median of five replays of a graph of `n` calls, microseconds per call."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):  # compile, load, plan: outside the capture
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runs = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) * 1000 / n)
    return sorted(runs)[2]


def _block_diagonal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    return (q_idx // 256) == (kv_idx // 256)


def main() -> int:
    import hooks_bench as hb
    import torch

    import flashgen.torch as fgt
    from flashgen.generator.hooks import library
    from flashgen.varlen import flash_attn_varlen_func

    doc = library.document_hook()
    out: dict[str, float] = {}
    with torch.no_grad():
        for d, t in itertools.product((64, 128), (4096, 16384)):
            b, h = hb.shape(d, t)
            q, k, v = (torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))  # fmt: skip
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            for name, lens in (("doc", hb.doc_lengths(t)), ("doc256", [256] * (t // 256))):
                ids = torch.tensor(hb.doc_ids(lens), dtype=torch.int32, device="cuda")
                row = f"{name} d{d} T{t}"
                dense = (qt, kt, vt)
                out[f"{row} tab"] = graph_us(torch, lambda ids=ids, x=dense: fgt.attention(
                    *x, mask_mod=doc, aux={"doc_ids": ids}))  # fmt: skip
                if name == "doc256":
                    out[f"{row} free"] = graph_us(
                        torch, lambda x=dense: fgt.attention(*x, mask_mod=_block_diagonal)
                    )
                per = list(lens) * b
                cu = torch.tensor([0, *itertools.accumulate(per)], dtype=torch.int32,
                                  device="cuda")  # fmt: skip
                packed = tuple(x.reshape(b * t, h, d) for x in (q, k, v))
                longest = max(per)
                out[f"{row} varlen"] = graph_us(torch, lambda cu=cu, n=longest, x=packed: (
                    flash_attn_varlen_func(*x, cu, cu, n, n)))  # fmt: skip
            print({r: round(x, 1) for r, x in out.items() if f"d{d} T{t}" in r}, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
