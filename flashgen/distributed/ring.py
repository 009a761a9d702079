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
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from flashgen.distributed.blocks import BlockEngine, engine_for
from flashgen.distributed.exchange import RingExchange
from flashgen.distributed.merge import accumulator_dtype, empty_accumulator, merge_into
from flashgen.distributed.sharding import block_plan, check_layout
from flashgen.torch_support import no_modes


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


class RingAttention(torch.autograd.Function):
    """`ring_attention`'s autograd function (eager calls):
    `apply(q, k, v, causal, scale, group, layout, engine)` -> (O, LSE)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: Any, k: Any, v: Any, causal: bool, scale: float, group: Any,
        layout: str, engine: BlockEngine,
    ) -> tuple[Any, Any]:  # fmt: skip
        out, lse = ring_forward(q, k, v, causal, scale, group, layout, engine)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.setup = (causal, scale, group, layout, engine)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, grad_o: Any, grad_lse: Any) -> Any:  # type: ignore[override]
        none = (None,) * 5
        if grad_o is None:
            return (None, None, None, *none)
        q, k, v, out, lse = ctx.saved_tensors
        grads = ring_backward(q, k, v, out, lse, grad_o, *ctx.setup)
        return (*grads, *none)


def ring_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    group: Any = None,
    layout: str = "zigzag",
    return_lse: bool = False,
    engine: BlockEngine | None = None,
) -> Any:
    """Attention over a sequence sharded across the ranks of `group` (torch.distributed; the
    default group when None), differentiable: a drop-in for `flashgen.torch.attention` on
    each rank's shard.

    q is this rank's (B, H, T_local, d) shard of the queries, k and v its (B, H_kv, T_local, d)
    shards of the keys and values (H a multiple of H_kv: GQA), all cut from the whole sequence
    by `flashgen.distributed.shard` with the same `layout` -- ``"zigzag"`` (default: equal
    causal work on every rank) or ``"contiguous"``. Every rank calls with the same shapes,
    `causal` and `scale`. `causal` masks key j for query i when j > i in the whole sequence.
    `scale` defaults to 1/sqrt(d). Returns this rank's shard of O (q's dtype and memory
    layout), or (O, LSE) with `return_lse` (LSE float32 (B, H, T_local), natural log).
    `engine` computes each step (`flashgen.distributed.FlashgenBlocks` on CUDA by default,
    `MathBlocks` for CPU tensors). Communication: NCCL point-to-point ops (gloo works too,
    staged through host memory); the K/V of the next step is in flight while a step computes.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(
                f"{name}: {type(x).__name__} of shape {getattr(x, 'shape', None)}: must be a 4-D "
                "torch tensor, (B, H, T_local, d); pass this rank's shard"
            )
    if causal is not True and causal is not False:
        raise ValueError(f"causal={causal!r}: must be True or False")
    layout = check_layout(layout)
    b, h, t, d = q.shape
    if k.shape[0] != b or k.shape[2] != t or v.shape[:3] != k.shape[:3] or k.shape[3] != d:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: k and v must be "
            f"(B={b}, H_kv, T_local={t}, d) with k's d = {d} -- each rank holds equal shards of "
            "one sequence's queries, keys and values"
        )
    if k.shape[1] < 1 or h % k.shape[1]:
        raise ValueError(
            f"H={h}, H_kv={k.shape[1]}: the query heads must be a multiple of the K/V heads"
        )
    if q.dtype != k.dtype or q.dtype != v.dtype or q.device != k.device or q.device != v.device:
        raise ValueError(
            f"q {q.dtype} on {q.device}, k {k.dtype} on {k.device}, v {v.dtype} on {v.device}: "
            "q, k and v must share one dtype and one device"
        )
    if layout == "zigzag" and t % 2:
        raise ValueError(
            f"T_local={t}: a zigzag shard is two equal chunks, so T_local must be even; pad "
            "the sequence to a multiple of 2 x the group's size"
        )
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "torch.distributed is not initialized: call torch.distributed.init_process_group "
            "first (torchrun sets its environment), or use flashgen.torch.attention on one GPU"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale={scale!r}: must be a finite number > 0, or None (1/sqrt(d))")
    if engine is None and not no_modes():
        # torch.compile, fake tensors, dispatch modes: the registered op (one graph node)
        from flashgen.distributed import op

        o, lse = op.ring_op(q, k, v, causal, float(scale), op.group_name(group), layout)
    else:
        o, lse = RingAttention.apply(  # type: ignore[no-untyped-call]
            q, k, v, causal, float(scale), group, layout, engine_for(q, engine)
        )
    return (o, lse) if return_lse else o

