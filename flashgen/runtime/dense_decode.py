"""`flashgen.attention`'s decode route: a dense (B, H, T, d) call with few query rows against
many keys runs family mma's decode kernel, as `flashgen.torch.attention` does
(`decode.routes_to_decode`): the GQA heads packed, the keys split over the GPU, the same O and
LSE as the forward kernels within the correctness rule, several times faster on such shapes.

The call is launched like a forward's bound launch (pointers of q, k, v, O, LSE and the
stream), each call with its split scratch from PyCUDA's memory pool and the shared counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flashgen.generator.features import FeatureArgs
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.runtime import gpu as runtime
from flashgen.runtime.decode import (
    DecodeLaunch,
    decode_spec,
    routes_to_decode,
    row_tiles,
    scratch_sizes,
)
from flashgen.runtime.decode_call import DECODE_DTYPES, check_operands, choose_launch
from flashgen.runtime.validate import ArrayInfo, describe


class DenseDecodeLaunch:
    """One dense call signature on the decode kernel, called as a forward's `launch.Bound`."""

    def __init__(self, spec: KernelSpec, launch: DecodeLaunch, scratch: tuple[int, int, int]):
        self.spec = spec
        self._launch = launch
        self._scratch = scratch

    def __call__(
        self, q: int, k: int, v: int, o: int, lse: int, stream: int = 0,
        hook_ptrs: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        """Launch on `stream` with this call's pointers (no hooks: the route takes none)."""
        assert hook_ptrs is None
        n_o, n_l, n_c = self._scratch
        o_part = runtime.empty((n_o,), np.float32, pooled=True) if n_o else None
        lse_part = runtime.empty((n_l,), np.float32, pooled=True) if n_l else None
        counters = runtime.decode_counters(n_c)  # held through the launch
        self._launch(
            (q, k, v, o, lse, _ptr(o_part), _ptr(lse_part), int(counters.gpudata), 0, 0), stream
        )


def _ptr(x: Any) -> int:
    return 0 if x is None else int(x.gpudata)


def _tokens_first(a: ArrayInfo) -> ArrayInfo:
    """A (B, H, T, d) array described as the (B, T, H, d) view the decode checks read."""
    b, h, t, d = a.shape
    sb, sh, st, sd = a.strides
    return ArrayInfo(a.name, (b, t, h, d), (sb, st, sh, sd), a.dtype, a.ptr)


def dense_decode(
    q: Any, k: Any, v: Any, causal: bool, scale_log2: float, features: FeatureArgs
) -> tuple[DenseDecodeLaunch, tuple[int, int, int, int]] | None:
    """The decode route for an already validated dense call on device arrays q (B, H, Tq, d),
    k and v (B, H_kv, Tk, d | dv): (its launch, O's shape (B, H, Tq, dv)), O and LSE written
    contiguous as the forward's; None when the forward kernels take the call (more query rows
    or fewer keys, a dtype other than fp16/bf16, a layout the decode kernel's 16-byte row copies
    refuse, or no decode variant for its head dims)."""
    infos = [describe(n, x) for n, x in zip("qkv", (q, k, v), strict=True)]
    tq, tk = infos[0].shape[2], infos[1].shape[2]
    if not routes_to_decode(tq, tk):
        return None
    try:
        qi, ki, vi = (_tokens_first(a) for a in infos)
        ops = check_operands(qi, ki, vi, None, None, None)
        if ops.dtype not in DECODE_DTYPES:
            return None
        group = ops.h // ops.h_kv
        spec = decode_spec(ops.d, ops.dv, ops.dtype, causal, ops.tq * group, features.tokens)
        tiles = row_tiles(spec, ops.tq, group)
        spec, plan, splits = choose_launch(
            spec, False, runtime.get_function, ops.b * ops.h_kv * tiles, ops.tk, 0
        )
        o_strides = (ops.h * ops.tq * ops.dv, ops.tq * ops.dv, ops.dv)  # (B, H, Tq, dv) dense
        launch = DecodeLaunch(plan, ops.shape(scale_log2, o_strides), splits, features)
    except (ValueError, SpecError):  # as the torch route: the forward kernels take the call
        return None
    scratch = scratch_sizes(spec, ops.b, ops.h_kv, tiles, splits)
    return DenseDecodeLaunch(spec, launch, scratch), (ops.b, ops.h, ops.tq, ops.dv)
