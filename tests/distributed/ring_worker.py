"""One rank of the CPU ring-attention check (tests/distributed/test_ring_cpu.py starts `world`
of these): gloo, MathBlocks in float64, every case against an autograd float64 oracle on the
whole sequence; prints one JSON line per case with the largest errors of O, LSE, dQ, dK, dV.

    python ring_worker.py RANK WORLD PORT
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import torch
import torch.distributed as dist

from flashgen.distributed import ring_attention, shard

CASES = [  # (layout, causal, B, H, H_kv, T_per_rank, d)
    ("zigzag", True, 2, 4, 2, 6, 8),
    ("zigzag", False, 1, 2, 2, 4, 8),
    ("contiguous", True, 1, 4, 1, 5, 8),
    ("contiguous", False, 2, 2, 2, 3, 16),
]


def oracle(q, k, v, causal: bool):  # noqa: ANN001, ANN201  (plain float64 autograd)
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[2]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ vv, torch.logsumexp(s, -1)


def run_case(case: tuple[Any, ...], rank: int, world: int, group: Any = None) -> list[float]:
    """One case on this rank of `group`: the largest errors of O, LSE, dQ, dK, dV."""
    layout, causal, b, h, h_kv, t_rank, d = case
    t = t_rank * world * (2 if layout == "zigzag" else 1)
    gen = torch.Generator().manual_seed(1234)  # the same whole tensors on every rank
    q, k, v = (torch.randn(b, hh, t, d, generator=gen, dtype=torch.float64)
               for hh in (h, h_kv, h_kv))  # fmt: skip
    do = torch.randn(b, h, t, d, generator=gen, dtype=torch.float64)
    ref = [x.clone().requires_grad_() for x in (q, k, v)]
    o_ref, lse_ref = oracle(*ref, causal)
    o_ref.backward(do)
    mine = [shard(x, rank, world, layout=layout).requires_grad_() for x in (q, k, v)]
    o, lse = ring_attention(*mine, causal=causal, layout=layout, return_lse=True, group=group)
    o.backward(shard(do, rank, world, layout=layout))
    pairs = [(o, o_ref), (lse, lse_ref)] + [
        (m.grad, r.grad) for m, r in zip(mine, ref, strict=True)
    ]
    return [
        float((a.detach() - shard(r.detach(), rank, world, layout=layout)).abs().max())
        for a, r in pairs
    ]


def main() -> None:
    rank, world, port = (int(a) for a in sys.argv[1:4])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    for case in CASES:
        err = run_case(case, rank, world)
        print(json.dumps({"rank": rank, "case": list(case), "err": err}), flush=True)
    if world == 2:  # inside torch.compile(fullgraph=True): the registered ops, one node each
        compiled = torch.compile(
            lambda *xs: ring_attention(*xs, causal=True, return_lse=True), backend="aot_eager",
            fullgraph=True,
        )
        gen = torch.Generator().manual_seed(5)
        whole = [torch.randn(1, 2, 8, 8, generator=gen, dtype=torch.float64) for _ in range(3)]
        a = [shard(x, rank, world).requires_grad_() for x in whole]
        b = [shard(x, rank, world).requires_grad_() for x in whole]
        (o1, l1), (o2, l2) = compiled(*a), ring_attention(*b, causal=True, return_lse=True)
        (o1.sum() + l1.sum()).backward()
        (o2.sum() + l2.detach().sum()).backward()
        err = [float((x.detach() - y.detach()).abs().max()) for x, y in ((o1, o2), (l1, l2))]
        err += [float((x.grad - y.grad).abs().max()) for x, y in zip(a, b, strict=True)]
        print(json.dumps({"rank": rank, "case": ["compiled"], "err": err}), flush=True)
    if world == 3:  # a ring over a subgroup (global ranks 0 and 2): peers by global rank
        sub = dist.new_group([0, 2])
        if rank in (0, 2):
            err = run_case(CASES[0], dist.get_rank(sub), 2, sub)
            print(json.dumps({"rank": rank, "case": ["subgroup", *CASES[0]], "err": err}),
                  flush=True)  # fmt: skip
    dist.barrier()  # every rank reaches the teardown first (examples/ring/train.py says why)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
