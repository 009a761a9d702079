"""What computes one ring step: a block of queries against a block of keys, forward and backward.

The ring (`flashgen.distributed.ring`) needs two things of a block engine: the forward, which
returns O and the natural-log LSE (float32, (B, H, Tq)) of the block alone, and the backward,
which takes the *whole* attention's O and LSE (after every step's merge) with dO and returns
this block's share of dQ, dK and dV -- with the final LSE, P = exp(S - LSE) is the block's part
of the global softmax, and D = rowsum(dO * O) uses the final O, so the shares add up to the
gradients of the whole attention.

- `FlashgenBlocks`: flashgen's kernels through its torch ops (`flashgen::attention`,
  `flashgen::attention_backward`), for CUDA tensors.
- `MathBlocks`: the same computation in plain torch arithmetic (float32, float64 for float64
  inputs), on any device: the engine the ring uses for CPU tensors, and a reference to check
  the kernels' ring against.

Both take (B, H, T, d) queries and (B, H_kv, T, d) keys and values (GQA when H_kv < H), a
bottom-right-aligned causal mask (key j hidden from query i when j > i + Tk - Tq) and the
softmax scale.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from flashgen.distributed.merge import accumulator_dtype


class BlockEngine(Protocol):
    """One ring step's attention (see the module docstring)."""

    name: str

    def forward(self, q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
        """(O in q's dtype, LSE (B, H, Tq): float32, float64 for float64 q) of q against
        this block's keys."""
        ...

    def backward(
        self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool, scale: float
    ) -> tuple[Any, Any, Any]:
        """This block's (dQ, dK, dV) given the whole attention's O, LSE and dO for q's rows."""
        ...


class FlashgenBlocks:
    """flashgen's generated kernels (CUDA tensors; fp16/bf16 for the backward)."""

    name = "flashgen"

    def forward(self, q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
        from flashgen import torch as fgt

        with torch.no_grad():
            o, lse = fgt.attention(q, k, v, causal=causal, scale=scale, return_lse=True)
        return o, lse

    def backward(
        self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool, scale: float
    ) -> tuple[Any, Any, Any]:
        from flashgen import torch as fgt  # registers the ops
        from flashgen.runtime.op_args import OFF

        del fgt
        dq, dk, dv = torch.ops.flashgen.attention_backward(
            q, k, v, o, lse.contiguous(), do, causal, scale, False, *OFF
        )
        return dq, dk, dv


class MathBlocks:
    """Plain torch arithmetic (float32; float64 for float64 inputs), any device."""

    name = "math"

    @staticmethod
    def _scores(q: Any, k: Any, causal: bool, scale: float) -> tuple[Any, Any, int]:
        ct = accumulator_dtype(q)
        group = q.shape[1] // k.shape[1]
        kk = k.to(ct).repeat_interleave(group, 1)
        s = torch.matmul(q.to(ct), kk.transpose(-1, -2)) * scale
        if causal:
            tq, tk = q.shape[2], k.shape[2]
            i = torch.arange(tq, device=q.device).unsqueeze(1)
            j = torch.arange(tk, device=q.device).unsqueeze(0)
            s = s.masked_fill(j > i + tk - tq, float("-inf"))
        return s, kk, group

    @staticmethod
    def _probs(s: Any, lse: Any) -> Any:
        # rows that see no key (LSE -inf) have P = 0, not exp(-inf + inf)
        base = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).to(s.dtype)
        return torch.exp(s - base.unsqueeze(-1))

    def forward(self, q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
        s, _, group = self._scores(q, k, causal, scale)
        lse = torch.logsumexp(s, -1)
        p = self._probs(s, lse)
        o = torch.matmul(p, v.to(s.dtype).repeat_interleave(group, 1))
        return o.to(q.dtype), lse if lse.dtype == torch.float64 else lse.float()

    def backward(
        self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool, scale: float
    ) -> tuple[Any, Any, Any]:
        s, kk, group = self._scores(q, k, causal, scale)
        ct = s.dtype
        p = self._probs(s, lse)
        vv = v.to(ct).repeat_interleave(group, 1)
        do_c = do.to(ct)
        dv = torch.matmul(p.transpose(-1, -2), do_c)
        dp = torch.matmul(do_c, vv.transpose(-1, -2))
        delta = (do_c * o.to(ct)).sum(-1, keepdim=True)
        ds = p * (dp - delta)
        dq = torch.matmul(ds, kk) * scale
        dk = torch.matmul(ds.transpose(-1, -2), q.to(ct)) * scale
        b, h_kv = k.shape[0], k.shape[1]
        dk = dk.view(b, h_kv, group, *dk.shape[2:]).sum(2)
        dv = dv.view(b, h_kv, group, *dv.shape[2:]).sum(2)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def engine_for(q: Any, engine: BlockEngine | None) -> BlockEngine:
    """`engine`, or the default for q's device: flashgen's kernels on CUDA, MathBlocks else."""
    if engine is not None:
        return engine
    return FlashgenBlocks() if q.is_cuda else MathBlocks()
