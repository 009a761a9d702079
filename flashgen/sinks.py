"""Attention sinks on torch tensors: `flashgen.torch.attention(..., sinks=s)` lands here.

A sink is one learnable logit per query head, `s[h]`, that joins every row's softmax as a key
with no value (gpt-oss's sinks): with scores `x_ij = scale * q_i . k_j` (masked ones `-inf`),

    P_ij = exp(x_ij) / (exp(s_h) + sum_k exp(x_ik)),   O_i = sum_j P_ij V_j,
    LSE_i = log(exp(s_h) + sum_k exp(x_ik)).

Nothing in the kernels changes, because a sink only moves each row's normaliser:

- forward: the kernel's (O0, LSE0) without the sink give `LSE = logaddexp(LSE0, s_h)` and
  `O = O0 * exp(LSE0 - LSE)` exactly (one elementwise pass over O in fp32, then O's dtype:
  one more rounding of O than a kernel that folds the sink into its epilogue would do);
- backward: the attention backward kernels recompute P from the LSE they are given and take
  `D_i = dO_i . O_i`; handed the sink's LSE and O they compute dQ, dK, dV of the sink
  attention as they are (the sink column has no value, so it adds nothing to dP and its share
  of D is already in O), and the sink's own gradient is
  `ds_h = -sum_{b,i} exp(s_h - LSE_bhi) * D_bhi` (a few elementwise passes, a sum), D here
  from the rescaled O before its rounding (the backward recomputes it from O0: one rounding
  of O in D, as a kernel's D has; through the twice-rounded O it measured 2x the bound).

`SinkAttention` is the autograd function over `torch.ops.flashgen.attention` /
`attention_backward`; `HookedSinkAttention` the same over the hooked ops (score_mod / mask_mod
with sinks). `flashgen.torch.attention(..., sinks=)` calls them.
"""

from __future__ import annotations

from typing import Any

try:
    import torch
except ImportError as _exc:  # one line, says what is missing
    raise ImportError(
        f"flashgen.sinks needs PyTorch, which cannot be imported ({_exc}); install torch"
    ) from None

from flashgen.torch_support import check_tensor, fail


def check_sinks(sinks: Any, q: Any) -> None:
    """`sinks` is a float32 (H,) tensor on q's device, H being q's query heads (dim 1)."""
    check_tensor("sinks", sinks, 1, q.device)
    if sinks.dtype != torch.float32:
        fail(f"sinks.dtype={sinks.dtype}: must be torch.float32; pass sinks.float()")
    if sinks.shape[0] != q.shape[1]:
        fail(
            f"sinks.shape={tuple(sinks.shape)}: one logit per query head, ({q.shape[1]},) for "
            f"q of shape {tuple(q.shape)}"
        )


def _wide(x: Any) -> Any:
    """x in float32 at least (fp16/bf16 widened; float64 kept)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _rescaled(o0: Any, lse0: Any, lse: Any) -> Any:
    """O0 * exp(LSE0 - LSE) in float32 at least: the sink attention's O before its rounding."""
    return _wide(o0) * torch.exp(lse0 - lse).unsqueeze(-1)


def with_sinks(o0: Any, lse0: Any, sinks: Any) -> tuple[Any, Any]:
    """(O, LSE) of the sink attention from the kernel's (O0, LSE0) without it (module doc)."""
    lse = torch.logaddexp(lse0, sinks.view(1, -1, 1).to(lse0.dtype))
    return _rescaled(o0, lse0, lse).to(o0.dtype), lse


def sink_grad(o: Any, lse: Any, do: Any, sinks: Any) -> Any:
    """d loss / d sinks: -sum over batch and rows of exp(s_h - LSE) * (dO . O) (module doc).
    `o` as wide as it is at hand: the backward passes the rescaled O before its rounding to
    the storage dtype (one rounding of O in D, as in a kernel's, not two)."""
    d = (_wide(do) * _wide(o)).sum(-1)  # (B, H, Tq)
    return -(torch.exp(sinks.view(1, -1, 1) - lse) * d).sum((0, 2)).to(sinks.dtype)


def _ops() -> tuple[Any, Any]:
    """The attention forward and backward ops (flashgen.torch registers them; the CPU tests
    stand reference ones in)."""
    return torch.ops.flashgen.attention.default, torch.ops.flashgen.attention_backward.default


def _hooked_ops() -> tuple[Any, Any]:
    """The hooked attention ops (flashgen.hooked registers them; the CPU tests stand
    reference ones in)."""
    ops = torch.ops.flashgen
    return ops.hooked_attention.default, ops.hooked_attention_backward.default


def _split_arrays(args: tuple[Any, ...]) -> tuple[list[Any], tuple[Any, ...]]:
    """The tensors among op arguments (None elsewhere; saved for the backward) and the
    arguments without them (None where a tensor was; kept on ctx)."""
    arrays = [a if isinstance(a, torch.Tensor) else None for a in args]
    return arrays, tuple(None if isinstance(a, torch.Tensor) else a for a in args)


def _join_arrays(kept: tuple[Any, ...], arrays: list[Any]) -> tuple[Any, ...]:
    """`_split_arrays`' inverse."""
    return tuple(t if a is None else a for a, t in zip(kept, arrays, strict=True))


def _sink_outputs(ctx: Any, o0: Any, lse0: Any, sinks: Any) -> tuple[Any, Any, Any]:
    """(O, LSE) with the sinks, and LSE kept for the backward; the backward recomputes the
    rescaled O from O0 (same bits: the same ops) for the sinks' D without O's second
    rounding, so O0 and LSE0 are saved instead of O."""
    o, lse = with_sinks(o0, lse0, sinks)
    ctx.o_dtype = o.dtype
    ctx.mark_non_differentiable(lse)
    return o, lse, lse


def _sink_o(ctx: Any, o0: Any, lse0: Any, lse: Any) -> tuple[Any, Any]:
    """(the forward's O bit for bit, the rescaled O before its rounding)."""
    wide = _rescaled(o0, lse0, lse)
    return wide.to(ctx.o_dtype), wide


class SinkAttention(torch.autograd.Function):
    """(O, LSE) of attention with sinks; gradients to q, k, v and sinks.

    `apply(q, k, v, sinks, causal, scale, variant, deterministic, *feature_arguments)`: the
    arguments of `torch.ops.flashgen.attention` with `sinks` after v and `deterministic`
    before the features (the ops' own order puts it last)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: Any, k: Any, v: Any, sinks: Any, causal: bool, scale: float | None,
        variant: str | None, deterministic: bool, *feature_arguments: Any,
    ) -> tuple[Any, Any]:  # fmt: skip
        o0, lse0 = _ops()[0](q, k, v, causal, scale, variant, *feature_arguments, deterministic)
        o, lse, _ = _sink_outputs(ctx, o0, lse0, sinks)
        ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic
        arrays, ctx.feature_arguments = _split_arrays(feature_arguments)
        ctx.save_for_backward(q, k, v, sinks, o0, lse0, lse, *arrays)
        return o, lse

    @staticmethod
    def backward(ctx: Any, grad_o: Any, grad_lse: Any) -> Any:  # type: ignore[override]
        q, k, v, sinks, o0, lse0, lse, *arrays = ctx.saved_tensors
        rest = (None,) * (4 + len(ctx.feature_arguments))  # causal .. deterministic, features
        if grad_o is None:
            return (None, None, None, None, *rest)
        o, wide = _sink_o(ctx, o0, lse0, lse)
        features = _join_arrays(ctx.feature_arguments, arrays)
        dq, dk, dv = _ops()[1](
            q, k, v, o, lse, grad_o, ctx.causal, ctx.scale, ctx.deterministic, *features
        )
        return (dq, dk, dv, sink_grad(wide, lse, grad_o, sinks), *rest)


class HookedSinkAttention(torch.autograd.Function):
    """SinkAttention over the hooked ops (`flashgen.hooked`): score_mod / mask_mod and sinks.

    `apply(q, k, v, sinks, causal, scale, deterministic, hooks, aux_floats, aux_ints, n_aux,
    *aux_tensors, *feature_arguments)`: the hooked op's arguments (`hooked.hook_op_args`'
    tokens and aux lists), the aux tensors spread so that autograd sees and saves them."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: Any, k: Any, v: Any, sinks: Any, causal: bool, scale: float | None,
        deterministic: bool, hooks: str, aux_floats: list[float], aux_ints: list[int],
        n_aux: int, *rest: Any,
    ) -> tuple[Any, Any]:  # fmt: skip
        aux, features = list(rest[:n_aux]), rest[n_aux:]
        o0, lse0 = _hooked_ops()[0](
            q, k, v, causal, scale, hooks, aux, aux_floats, aux_ints, *features, deterministic
        )
        o, lse, _ = _sink_outputs(ctx, o0, lse0, sinks)
        ctx.causal, ctx.scale, ctx.deterministic, ctx.hooks = causal, scale, deterministic, hooks
        ctx.aux_floats, ctx.aux_ints, ctx.n_aux = list(aux_floats), list(aux_ints), n_aux
        arrays, ctx.feature_arguments = _split_arrays(features)
        ctx.save_for_backward(q, k, v, sinks, o0, lse0, lse, *aux, *arrays)
        return o, lse

    @staticmethod
    def backward(ctx: Any, grad_o: Any, grad_lse: Any) -> Any:  # type: ignore[override]
        q, k, v, sinks, o0, lse0, lse, *saved = ctx.saved_tensors
        aux, arrays = saved[: ctx.n_aux], saved[ctx.n_aux :]
        # causal, scale, deterministic, hooks, aux_floats, aux_ints, n_aux; the aux tensors
        # and the features
        rest = (None,) * (7 + ctx.n_aux + len(ctx.feature_arguments))
        if grad_o is None:
            return (None, None, None, None, *rest)
        o, wide = _sink_o(ctx, o0, lse0, lse)
        features = _join_arrays(ctx.feature_arguments, arrays)
        dq, dk, dv = _hooked_ops()[1](
            q, k, v, o, lse, grad_o, ctx.causal, ctx.scale, ctx.deterministic, ctx.hooks,
            list(aux), ctx.aux_floats, ctx.aux_ints, *features,
        )  # fmt: skip
        return (dq, dk, dv, sink_grad(wide, lse, grad_o, sinks), *rest)


__all__ = ["HookedSinkAttention", "SinkAttention", "check_sinks", "sink_grad", "with_sinks"]
