"""`ring_attention` as registered custom ops, for torch.compile (fullgraph too), fake tensors and
dispatch modes: `flashgen::ring_attention` and its backward `flashgen::ring_attention_backward`,
each one opaque graph node that runs the whole ring (`ring.ring_forward` / `ring.ring_backward`)
with the device's default engine. The process group travels by name (`group_name`), as torch's
functional collectives pass it, and is looked up when the op runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from flashgen.distributed.blocks import engine_for
from flashgen.distributed.merge import accumulator_dtype
from flashgen.distributed.ring import ring_backward, ring_forward

# torch's functional collectives pass groups by name the same way (private, typed loosely here)
_resolve: Any = getattr(distributed_c10d, "_resolve_process_group")  # noqa: B009

_library: Any = torch.library  # partly untyped: keep mypy --strict quiet
_LIB: Any = _library.Library("flashgen", "FRAGMENT")
_LIB.define(
    "ring_attention(Tensor q, Tensor k, Tensor v, bool causal, float scale, str group_name, "
    "str layout) -> (Tensor, Tensor)"
)
_LIB.define(
    "ring_attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, "
    "bool causal, float scale, str group_name, str layout) -> (Tensor, Tensor, Tensor)"
)


def group_name(group: Any) -> str:
    """The name a process group (None: the default group) is found by when the op runs."""
    chosen: Any = group if group is not None else dist.group.WORLD
    return str(chosen.group_name)


def _group(name: str) -> Any:
    return _resolve(name)


def _forward(q: Any, k: Any, v: Any, causal: bool, scale: float, name: str,
             layout: str) -> tuple[Any, Any]:  # fmt: skip
    return ring_forward(q, k, v, causal, scale, _group(name), layout, engine_for(q, None))


def _backward_impl(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool, scale: float, name: str,
    layout: str,
) -> tuple[Any, Any, Any]:  # fmt: skip
    return ring_backward(q, k, v, o, lse, do, causal, scale, _group(name), layout,
                         engine_for(q, None))  # fmt: skip


def _fake_forward(q: Any, k: Any, v: Any, causal: bool, scale: float, name: str,
                  layout: str) -> tuple[Any, Any]:  # fmt: skip
    out = torch.empty_like(q) if v.shape[-1] == q.shape[-1] else q.new_empty(
        (*q.shape[:3], v.shape[-1])
    )
    return out, q.new_empty(q.shape[:3], dtype=accumulator_dtype(q))


def _fake_backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool, scale: float, name: str,
    layout: str,
) -> tuple[Any, Any, Any]:  # fmt: skip
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_LIB.impl("ring_attention", _forward, "CompositeExplicitAutograd")
_LIB.impl("ring_attention_backward", _backward_impl, "CompositeExplicitAutograd")
_library.register_fake("flashgen::ring_attention", _fake_forward, lib=_LIB)
_library.register_fake("flashgen::ring_attention_backward", _fake_backward, lib=_LIB)


def _setup_context(ctx: Any, inputs: Any, output: Any) -> None:
    q, k, v, causal, scale, name, layout = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.setup = (causal, scale, name, layout)
    ctx.mark_non_differentiable(lse)


def _autograd_backward(ctx: Any, grad_o: Any, grad_lse: Any) -> Any:
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _BWD_OP(q, k, v, o, lse, grad_o, *ctx.setup)
    return dq, dk, dv, None, None, None, None


_library.register_autograd(
    "flashgen::ring_attention", _autograd_backward, setup_context=_setup_context, lib=_LIB
)
_OP = torch.ops.flashgen.ring_attention.default
_BWD_OP = torch.ops.flashgen.ring_attention_backward.default


def ring_op(q: Any, k: Any, v: Any, causal: bool, scale: float, name: str,
            layout: str) -> tuple[Any, Any]:  # fmt: skip
    """The registered op's call: (O, LSE)."""
    o, lse = _OP(q, k, v, causal, scale, name, layout)
    return o, lse
