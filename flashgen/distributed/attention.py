"""`ring_attention`: the public call of context parallelism -- checks its arguments, then runs
the ring (`ring.ring_forward` / `ring.ring_backward`) through `RingAttention` on eager calls, or
through the registered custom ops (`op`) under torch.compile, fake tensors and dispatch modes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from flashgen.distributed.blocks import BlockEngine, engine_for
from flashgen.distributed.ring import ring_backward, ring_forward
from flashgen.distributed.sharding import check_layout
from flashgen.torch_support import no_modes


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
        # torch.compile, fake tensors, dispatch modes: the registered op (one graph node);
        # imported here, as before: it registers the ops and reaches into torch.distributed's
        # c10d internals, which `import flashgen.distributed` should not need
        from flashgen.distributed import op

        o, lse = op.ring_op(q, k, v, causal, float(scale), op.group_name(group), layout)
    else:
        o, lse = RingAttention.apply(  # type: ignore[no-untyped-call]
            q, k, v, causal, float(scale), group, layout, engine_for(q, engine)
        )
    return (o, lse) if return_lse else o

