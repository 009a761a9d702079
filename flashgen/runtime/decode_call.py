"""One decode call's checks and launch choice, for any array library (`flashgen.api_kvcache`).

The layouts are `flashgen.kvcache`'s (tokens before heads): q (B, Tq, H, d); k_cache, v_cache
(B, Tk, H_kv, d) contiguous, or pages (n_pages, page_size, H_kv, d) with an int32
block_table (B, pages per sequence); cache_seqlens an int32 (B,) array, one int, or None.
`check_operands` judges arrays by their `validate.ArrayInfo` (shape, byte strides, dtype,
pointer), so NumPy arrays, GPUArrays and CUDA-array-interface objects share one set of rules;
`choose_launch` picks the variant, its plan and the split count from the sizes alone (the
rule the torch front door follows too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flashgen.generator.dtypes import DTYPES
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import launch
from flashgen.runtime.decode import (
    DECODE_MIN_TILES_PER_WARP_MERGED,
    DecodeShape,
    choose_splits,
    combine_enabled,
    few_blocks_specs,
)
from flashgen.runtime.launch import LaunchPlan
from flashgen.runtime.validate import ArrayInfo

INT_MAX = 2**31 - 1
DECODE_DTYPES = ("fp16", "bf16")  # the decode kernel's storage dtypes (tensor-core operands)


@dataclass(frozen=True)
class DecodeOperands:
    """A validated call's sizes and element strides (q, k, v as (batch|page, head, token))."""

    b: int
    tq: int
    h: int
    h_kv: int
    d: int
    dv: int
    tk: int  # keys per sequence: the capacity, or the one int length given
    page_size: int  # 0: contiguous
    bt_stride: int
    n_pages: int
    dtype: str  # "fp16" | "bf16"
    strides: tuple[int, ...]  # 9: q, k, v x (batch|page, head, token)

    def shape(self, scale_log2: float, o_strides: tuple[int, int, int]) -> DecodeShape:
        """The launch's DecodeShape, O written with (batch, head, token) `o_strides`."""
        return DecodeShape(
            self.b, self.h, self.h_kv, self.tq, self.tk, self.page_size, self.bt_stride,
            self.n_pages, (*self.strides, *o_strides), scale_log2,
        )  # fmt: skip


def _dtype_name(a: ArrayInfo) -> str | None:
    for name in DECODE_DTYPES:
        if a.dtype == np.dtype(DTYPES[name].numpy):
            return name
    return None


def _operand_strides(a: ArrayInfo) -> tuple[int, int, int]:
    """(batch|page, head, token) element strides of a (.., T, H, d) operand: the d axis
    contiguous, every other stride a multiple of 8 elements and the base 16-byte aligned (the
    kernel moves rows in 16-byte copies)."""
    if a.shape[3] > 1 and a.strides[3] != a.dtype.itemsize:
        raise ValueError(
            f"{a.name}.strides={a.strides} bytes: the last (d) axis must be contiguous; "
            "pass a copy"
        )
    sb, st, sh, _ = a.elem_strides()
    if any(s % 8 for s in (sb, st, sh)) or (a.ptr is not None and a.ptr % 16):
        raise ValueError(
            f"{a.name}: strides {a.strides} bytes and base address must be multiples of 16 "
            "bytes (8 elements); pass a contiguous copy"
        )
    return sb, sh, st


def check_int_array(a: ArrayInfo, shape: tuple[int, ...]) -> None:
    """`a` is int32 of `shape` (a negative last extent: any), its last axis contiguous."""
    if a.dtype != np.dtype(np.int32):
        raise ValueError(f"{a.name}.dtype={a.dtype}: must be int32; pass {a.name}.astype(int32)")
    if len(a.shape) != len(shape) or a.shape[:-1] != shape[:-1] or (
        shape[-1] >= 0 and a.shape[-1] != shape[-1]
    ):  # fmt: skip
        want = ", ".join("n" if n < 0 else str(n) for n in shape)
        raise ValueError(f"{a.name}.shape={a.shape}: must be ({want})")
    if a.shape[-1] > 1 and a.strides[-1] != 4:
        raise ValueError(f"{a.name}: its last axis must be contiguous; pass a copy")


def check_operands(
    q: ArrayInfo, k: ArrayInfo, v: ArrayInfo, table: ArrayInfo | None,
    lens: ArrayInfo | None, seqlen: int | None,
) -> DecodeOperands:  # fmt: skip
    """Every rule of a decode call that needs no GPU; ValueError naming value, rule and fix.

    `lens` describes a cache_seqlens array, `seqlen` is the one int given instead (both None:
    the whole cache)."""
    for a in (q, k, v):
        if len(a.shape) != 4:
            raise ValueError(f"{a.name}.shape={a.shape}: must have 4 dimensions")
    dtype = _dtype_name(q)
    if dtype is None:
        raise ValueError(
            f"q.dtype={q.dtype}: the decode kernel takes float16 or bfloat16 "
            "(ml_dtypes.bfloat16 with NumPy); convert q, k_cache and v_cache"
        )
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"dtypes q {q.dtype}, k_cache {k.dtype}, v_cache {v.dtype}: must be one dtype"
        )
    b, tq, h, d = q.shape
    n0, n1, h_kv, dk = k.shape
    dv = v.shape[3]
    if v.shape[:3] != (n0, n1, h_kv):
        raise ValueError(
            f"v_cache.shape={v.shape}: must match k_cache.shape={k.shape} but in the last axis"
        )
    if dk != d:
        raise ValueError(f"k_cache.shape[-1]={dk}, q.shape[-1]={d}: the head dims must match")
    if min(b, tq, h, h_kv) < 1:
        raise ValueError(
            f"q.shape={q.shape}, k_cache.shape={k.shape}: every axis must be at least 1"
        )
    if h % h_kv:
        raise ValueError(
            f"H={h}, H_kv={h_kv}: the query heads must be a multiple of the K/V heads (GQA)"
        )
    strides = (*_operand_strides(q), *_operand_strides(k), *_operand_strides(v))
    if table is None:
        if n0 != b:
            raise ValueError(
                f"k_cache.shape[0]={n0}, B={b}: a contiguous cache holds one row per sequence; "
                "pass block_table for a paged cache"
            )
        tk, page_size, bt_stride, n_pages = n1, 0, 0, 0
    else:
        check_int_array(table, (b, -1))
        page_size, n_pages = n1, n0
        tk = table.shape[1] * page_size
        bt_stride = table.elem_strides()[0] if b > 1 else table.shape[1]
        if tk > INT_MAX:
            raise ValueError(
                f"block_table.shape[1] x page_size = {tk}: must be below 2^31 keys per sequence"
            )
    if lens is not None:
        check_int_array(lens, (b,))
    elif seqlen is not None:
        if isinstance(seqlen, bool) or not isinstance(seqlen, int) or not 0 <= seqlen <= tk:
            raise ValueError(
                f"cache_seqlens={seqlen!r}: must be an int in [0, {tk}] (the cache's capacity), "
                "or an int32 (B,) array"
            )
        tk = seqlen
    if tq * (h // h_kv) > INT_MAX:
        raise ValueError(f"Tq={tq} x group={h // h_kv}: must stay below 2^31")
    return DecodeOperands(
        b, tq, h, h_kv, d, dv, tk, page_size, bt_stride, n_pages, dtype, strides
    )  # fmt: skip


def choose_launch(
    spec: KernelSpec, chosen: bool, plan_for: Callable[[KernelSpec], LaunchPlan],
    blocks: int, tk: int, splits: int,
) -> tuple[KernelSpec, LaunchPlan, int]:  # fmt: skip
    """(variant, its plan, split count) for `blocks` (B x H_kv x row tiles) row tiles over
    `tk` keys: `spec` with `choose_splits`' count (`splits` > 0 forces it). With the merge
    kernel (sm_90, more than one split) an automatic count takes DECODE_MIN_TILES_PER_WARP_MERGED
    tiles per warp when every block still has an SM to itself, and the variant stays `spec`;
    otherwise, when every block of the launch has an SM to itself and the caller did not choose
    the variant (`chosen` False), the first DECODE_FEW_BLOCKS variant whose blocks still fit one
    per SM (more bytes in flight per SM). `plan_for` loads a variant on the call's device."""
    plan = plan_for(spec)
    drv = launch.driver()
    slots = plan.sms * drv.resident_blocks(plan.function, spec.threads, plan.smem)
    n_splits = choose_splits(spec, blocks, tk, slots, splits)
    # with the merge kernel (sm_90) a split costs little more than its blocks, and the default
    # variant's blocks beat the few-blocks ones on every short row measured (bench/NOTES.md,
    # session 33: x1.06-1.19)
    merged_apart = n_splits > 1 and combine_enabled(plan.arch)
    if merged_apart and not splits:
        finer = choose_splits(spec, blocks, tk, slots, 0, DECODE_MIN_TILES_PER_WARP_MERGED)
        if blocks * finer <= plan.sms:
            n_splits = finer
    if not chosen and not merged_apart and blocks * n_splits <= plan.sms:
        for few, min_tiles in few_blocks_specs(spec):
            few_plan = plan_for(few)
            resident = drv.resident_blocks(few_plan.function, few.threads, few_plan.smem)
            few_splits = choose_splits(few, blocks, tk, plan.sms * resident, splits, min_tiles)
            if blocks * few_splits <= plan.sms:
                return few, few_plan, few_splits
    return spec, plan, n_splits

