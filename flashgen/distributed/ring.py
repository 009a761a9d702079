"""Ring attention: one attention over a sequence sharded across the ranks of a process group.

Each rank holds its shard of Q, K and V (`sharding.shard`). The forward runs `world` steps: in
step s a rank attends its queries to the K/V shard of rank (rank - s) mod world (its own in
step 0) while that shard passes on to the next rank and the following one arrives
(`exchange.RingExchange`: NCCL's stream, so the transfer overlaps the step's kernels); the
steps' partial results merge by their LSE in float32 (`merge`). Which rows meet in a step, and
whether the causal mask applies there, is `sharding.block_plan`.

The backward sends K and V around the ring again, each with a float32 dK/dV accumulator
(float64 for float64 inputs) that travels with it: every rank adds its queries' share of that
shard's gradients, and after the last step the accumulator reaches the shard's owner
complete. dQ stays home, accumulated in float32 too. The accumulator's transfer overlaps the
next step's kernels: a step computes its shares first and waits for the accumulator only to
add them.

The public call (`ring_attention`, its autograd function and the custom ops' route) is module
`attention`; this module is the two passes of the ring.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from flashgen.distributed.blocks import BlockEngine
from flashgen.distributed.exchange import RingExchange
from flashgen.distributed.merge import accumulator_dtype, empty_accumulator, merge_into
from flashgen.distributed.sharding import block_plan


def _rows(x: Any, rows: slice) -> Any:
    """x's rows (the sequence axis, 2) `rows`: a view."""
    return x[:, :, rows]


def ring_forward(
    q: Any, k: Any, v: Any, causal: bool, scale: float, group: Any, layout: str,
    engine: BlockEngine,
) -> tuple[Any, Any]:  # fmt: skip
    """The forward ring: this rank's (O in q's dtype and layout, LSE) (module docstring)."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    ring = RingExchange(group) if world > 1 else None
    t = q.shape[2]
    acc_o, acc_lse = empty_accumulator(q, v.shape[-1])
    kv = [k, v]
    for step in range(world):
        incoming = ring.start(kv) if ring is not None and step < world - 1 else None
        plan = block_plan(rank, (rank - step) % world, world, t, causal, layout)
        if plan is not None:
            qr, kr = plan.q_slice(), plan.kv_slice()
            o, lse = engine.forward(
                _rows(q, qr), _rows(kv[0], kr), _rows(kv[1], kr), plan.causal, scale
            )
            merge_into(_rows(acc_o, qr), acc_lse[:, :, qr], o, lse)
        if incoming is not None:
            kv = incoming.wait()
    if v.shape[-1] == q.shape[-1]:
        out = torch.empty_like(q)  # q's memory layout, as flashgen.torch.attention's O
        out.copy_(acc_o)
    else:
        out = acc_o.to(q.dtype)
    return out, acc_lse


def ring_backward(
    q: Any, k: Any, v: Any, out: Any, lse: Any, grad_o: Any, causal: bool, scale: float,
    group: Any, layout: str, engine: BlockEngine,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """The backward ring: this rank's (dQ, dK, dV) (module docstring)."""
    do = grad_o if grad_o.stride() == out.stride() else grad_o.contiguous()
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    ring = RingExchange(group) if world > 1 else None
    t = q.shape[2]
    ct = accumulator_dtype(q)
    dq = torch.zeros(q.shape, device=q.device, dtype=ct)
    dkv = [
        torch.zeros(k.shape, device=k.device, dtype=ct),
        torch.zeros(v.shape, device=v.device, dtype=ct),
    ]
    kv = [k, v]
    travelling = None  # the accumulator of this step's shard, on its way from rank - 1
    for step in range(world):
        incoming = ring.start(kv) if ring is not None and step < world - 1 else None
        plan = block_plan(rank, (rank - step) % world, world, t, causal, layout)
        shares = None
        if plan is not None:
            qr, kr = plan.q_slice(), plan.kv_slice()
            shares = engine.backward(
                _rows(q, qr), _rows(kv[0], kr), _rows(kv[1], kr), _rows(out, qr),
                lse[:, :, qr], _rows(do, qr), plan.causal, scale,
            )  # fmt: skip
            _rows(dq, qr).add_(shares[0])  # promoted in place: no copy
        if travelling is not None:
            dkv = travelling.wait()
        if shares is not None:
            _rows(dkv[0], kr).add_(shares[1])
            _rows(dkv[1], kr).add_(shares[2])
        if ring is not None:
            travelling = ring.start(dkv)
        if incoming is not None:
            kv = incoming.wait()
    if travelling is not None:  # the own shard's accumulator, back from rank - 1
        dkv = travelling.wait()
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
