"""Decode on the host: a few new query rows per sequence against a K/V cache, contiguous or paged.

The kernel is family mma's decode (templates/mma_decode.cu.j2; `abi.DECODE` lists its
arguments). This module holds what does not depend on the array library: the variant for a
call (`decode_spec`), how many blocks share each row tile's keys (`choose_splits`: from the
shapes alone, so a call never reads a device value), the scratch sizes (`scratch_sizes`), and
the launch (`DecodeLaunch`: one signature's argument buffer, then five to ten pointer stores
and one `cuLaunchKernel` a call). The torch front door is `flashgen.kvcache`.

Splits: the keys each row tile sees are cut into `n_splits` runs of whole tiles, one block
each, so that B x H_kv x row tiles blocks become enough to fill the GPU
(`DECODE_WAVES` waves of the blocks it holds at once). A run is at least
`DECODE_MIN_TILES_PER_WARP` tiles per warp, so that short caches are not cut finer than
their loads can hide. Before sm_90 (and with FLASHGEN_DECODE_COMBINE=0) the splits are merged
inside the same launch: the block finishing a row tile's last split adds them by their LSE --
with many splits in two levels, groups of splits and then the groups (counters zeroed once at
allocation and put back to zero by the blocks that finish them). On sm_90 a call with splits
launches the decode kernel with counters = NULL (its blocks store their splits and leave) and
then the variant's merge kernel, `<name>_combine` (`abi.DECODE_COMBINE`: a block per packed
row), both as programmatic dependents: the merge's blocks wait at griddepcontrol.wait for the
decode grid, so a short call's tail is a parallel merge instead of one block's fence, counter
and serial merge. o_part and lse_part are the same either way; the counters go unused (the
torch front door allocates none then).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flashgen.generator import abi
from flashgen.generator.arch import arch_number
from flashgen.generator.families.mma.decode import (
    DECODE_COMBINE_THREADS,
    DECODE_MERGE_MAX,
    DECODE_REG_BUDGET,
    combine_name,
    merge_group_size,
    register_estimate,
)
from flashgen.generator.features import NO_FEATURES, FeatureArgs, check_fits
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.runtime.launch import LaunchPlan, PreparedLaunch

DECODE_WAVES = 1
"""The split count aims for this many waves of blocks (the SMs times the blocks one SM holds,
`Driver.resident_blocks`): every block of a launch resident at once, no tail wave."""
DECODE_MIN_TILES_PER_WARP = 4
"""A split gives each warp at least this many key tiles (else it is not worth a block)."""
DECODE_MIN_TILES_PER_WARP_MERGED = 2
"""The same with the merge kernel (sm_90: a split costs little more than its blocks), used when
every block of the launch still has an SM to itself (B 1, Tk 4k, 8/1 heads: 32 splits instead
of 16, x1.17; bench/NOTES.md, session 33)."""
DECODE_FEW_BLOCKS: tuple[tuple[int, int, int], ...] = ((8, 2, 2),)
"""(warps, stages, min tiles per warp) tried in order for a call whose blocks all fit one per SM
(B x H_kv x row tiles x splits <= SMs): with every block alone on its SM, shared memory is free,
so eight warps of two tiles each halve every warp's serial chain of tile loads and math (the
split count stays that of four warps of four tiles). The first that is a valid spec and still
fits one per SM wins. Not with the merge kernel (sm_90, splits): there the four-warp blocks won
on every short row measured (bench/NOTES.md, session 33)."""
DECODE_MAX_SPLITS = 256
"""At most this many splits (each adds a row tile's O to the scratch the merge reads)."""
assert DECODE_MAX_SPLITS <= DECODE_MERGE_MAX**2  # the merge's two levels take this many
POINTER_ARGS = (
    "q",
    "k",
    "v",
    "o",
    "lse",
    "o_part",
    "lse_part",
    "counters",
    "cache_seqlens",
    "block_table",
)
"""The decode kernel's pointer arguments, in order (abi.DECODE's `tensor` rows)."""
assert abi.pointers(abi.DECODE) == POINTER_ARGS
COMBINE_THREADS = DECODE_COMBINE_THREADS
"""The merge kernel's block (the template's COMBINE_THREADS)."""
COMBINE_ENV = "FLASHGEN_DECODE_COMBINE"
"""`0`: merge the splits inside the decode launch on sm_90 too (the rule before sm_90)."""


def combine_enabled(arch: str) -> bool:
    """True when a decode call with splits on `arch` merges them in the variant's own merge
    kernel (`<name>_combine`, launched as a programmatic dependent): sm_90 and newer, unless
    FLASHGEN_DECODE_COMBINE=0 (read when a call signature is first prepared)."""
    return arch_number(arch) >= 90 and os.environ.get(COMBINE_ENV, "1") != "0"


DECODE_ROUTE_MAX_TQ = 16
"""`flashgen.torch.attention` calls with at most this many query rows per sequence ..."""
DECODE_ROUTE_MIN_TK = 256
"""... and at least this many keys (and 4 x Tq) run the decode kernel (`routes_to_decode`)."""


def routes_to_decode(tq: int, tk: int) -> bool:
    """True when a dense attention call of Tq queries against Tk keys runs faster on the
    decode kernel than on the forward kernels, whose 64- to 128-row query tiles such a call
    leaves mostly empty: few query rows, many keys."""
    return tq <= DECODE_ROUTE_MAX_TQ and tk >= max(DECODE_ROUTE_MIN_TK, 4 * tq)


def decode_spec(
    d: int, dv: int, dtype: str, causal: bool, rows: int, features: tuple[str, ...] = ()
) -> KernelSpec:
    """The decode variant for a call: `rows` packed rows per K/V head (query heads per K/V
    head x new tokens) in one block where the registers allow (16, else 32 rows: more row
    tiles read K and V once each). Small tiles: 16 keys a warp tile, four warps, a two-tile
    ring each -- measured on the H200 (bench/NOTES.md, d 128 bf16): small rings let the most
    blocks stream at once, which beat deeper rings by 2-12%; four warps beat two by 1-16%,
    and 32-key tiles were no better. SpecError (from the last candidate) when none fits."""
    brs = [16] if rows <= 16 else [32, 16]
    candidates = [br for br in brs if _fits(d, dv, br, 16)]
    last: SpecError | None = None
    for br in candidates or [16]:
        try:
            return KernelSpec(
                family="mma", direction="decode", d=d, dv=dv, dtype=dtype, causal=causal,
                br=br, bc=16, features=features,
            )  # fmt: skip
        except SpecError as exc:
            last = exc
    assert last is not None
    raise last


def _fits(d: int, dv: int, br: int, bc: int) -> bool:
    return register_estimate(d, dv, br, bc) <= DECODE_REG_BUDGET


def row_tiles(spec: KernelSpec, tq: int, kv_group: int) -> int:
    """Row tiles per K/V head: ceil(tq * kv_group / br)."""
    return -(-(tq * kv_group) // spec.br)


def choose_splits(
    spec: KernelSpec, blocks: int, tk: int, slots: int, requested: int = 0,
    min_tiles: int = DECODE_MIN_TILES_PER_WARP,
) -> int:  # fmt: skip
    """How many blocks share a row tile's keys: `requested` when > 0 (clamped to the tiles
    there are), else as many as keep `blocks` (B x H_kv x row tiles) x splits within
    DECODE_WAVES of the GPU's `slots` (SMs x resident blocks), each split keeping
    `min_tiles` (DECODE_MIN_TILES_PER_WARP) tiles per warp of the cache's capacity `tk`."""
    tiles = max(1, -(-tk // spec.bc))
    most = max(1, min(DECODE_MAX_SPLITS, tiles))
    if requested > 0:
        return min(requested, most)
    want = max(1, max(1, slots) * DECODE_WAVES // max(1, blocks))
    per_split = spec.warps * min_tiles
    return max(1, min(want, most, -(-tiles // per_split)))


def few_blocks_specs(spec: KernelSpec) -> list[tuple[KernelSpec, int]]:
    """The DECODE_FEW_BLOCKS variants of `spec` (same rows, tile, dtype and features; more
    warps or a deeper ring) that are valid specs, each with its min tiles per warp."""
    out = []
    for warps, stages, min_tiles in DECODE_FEW_BLOCKS:
        try:
            out.append((dataclasses.replace(spec, warps=warps, stages=stages), min_tiles))
        except SpecError:  # its shared memory or merge space does not fit: the next one
            continue
    return out


def scratch_sizes(
    spec: KernelSpec, b: int, h_kv: int, tiles: int, splits: int
) -> tuple[int, int, int]:
    """Elements of o_part (fp32), lse_part (fp32) and counters (int32) for a call (zero when
    one split: the block stores O itself). Counters: one per row tile for its merge groups,
    then one per (row tile, group) for the group's splits."""
    rt = b * h_kv * tiles
    if splits == 1:
        return 0, 0, rt
    groups = -(-splits // merge_group_size(splits))
    return rt * splits * spec.br * spec.dv, rt * splits * spec.br, rt * (1 + groups)


@dataclass(frozen=True)
class DecodeShape:
    """One call's sizes and strides (elements): what `DecodeLaunch` binds."""

    b: int
    h: int
    h_kv: int
    tq: int
    tk: int  # keys per sequence the cache can hold (paged: pages per sequence x page_size)
    page_size: int  # 0: contiguous
    bt_stride: int
    n_pages: int
    strides: tuple[int, ...]  # q, k, v, o x (batch|page, head, token): 12
    scale_log2: float

    @property
    def kv_group(self) -> int:
        """Query heads per K/V head."""
        return self.h // self.h_kv


class DecodeLaunch:
    """One signature's launch: the argument buffer built once, pointers stored per call."""

    def __init__(
        self, plan: LaunchPlan, shape: DecodeShape, splits: int,
        features: FeatureArgs = NO_FEATURES,
    ) -> None:  # fmt: skip
        c = ctypes
        spec = plan.spec
        check_fits(spec, features)
        features.check()
        self.plan = plan
        self.splits = splits
        tiles = row_tiles(spec, shape.tq, shape.kv_group)
        self.grid = (splits, tiles * shape.h_kv, shape.b)
        if tiles * shape.h_kv >= 2**16 or shape.b >= 2**16:
            raise ValueError(
                f"B={shape.b}, H_kv={shape.h_kv} x {tiles} row tiles: a decode launch takes "
                "fewer than 65536 of each; split the batch"
            )
        left, right, cap, slopes = features.kernel_args(shape.tq, shape.tk)
        self._ptrs = (c.c_void_p * len(POINTER_ARGS))()
        scalars: list[Any] = [
            c.c_int(shape.tq), c.c_int(shape.tk), c.c_int(max(shape.page_size, 1)),
            c.c_int(shape.bt_stride), c.c_int(shape.n_pages),
            *(c.c_longlong(s) for s in shape.strides),
            c.c_float(shape.scale_log2), c.c_int(shape.kv_group),
            c.c_int(left), c.c_int(right), c.c_float(cap), c.c_void_p(slopes),
        ]  # fmt: skip
        if len(scalars) + len(POINTER_ARGS) != len(abi.DECODE):
            raise AssertionError("decode arguments out of step with abi.DECODE")
        self._args = scalars
        base = c.addressof(self._ptrs)
        width = c.sizeof(c.c_void_p)
        addrs = [base + width * i for i in range(len(POINTER_ARGS))] + [
            c.addressof(a) for a in scalars
        ]
        self.params = (c.c_void_p * len(addrs))(*addrs)
        # sm_90 kernels wait at griddepcontrol.wait (templates/mma_decode.cu.j2): launch them as
        # programmatic dependents, so a block's start overlaps the previous kernel's end
        self._dependent = arch_number(plan.arch) >= 90
        # both launches built once (a call only stores pointers and the stream): the decode
        # kernel, then with splits on sm_90 the merge kernel (module docstring)
        self._launches = [plan.prepare(self.grid, self.params, dependent=self._dependent)]
        self.combine = combine_name(spec) if splits > 1 and combine_enabled(plan.arch) else None
        if self.combine is not None:
            self._launches.append(self._merge_launch(plan, shape, splits))
        self._lock = threading.Lock()

    def _merge_launch(self, plan: LaunchPlan, shape: DecodeShape, splits: int) -> PreparedLaunch:
        """The merge kernel's prepared launch, a block per packed row: its arguments
        (abi.DECODE_COMBINE) are o, lse, o_part, lse_part (stored per call in `_cptrs`), then
        tq, the split count, o's strides and kv_group."""
        c = ctypes
        self._cptrs = (c.c_void_p * len(_COMBINE_POINTERS))()
        self._cargs: list[Any] = [
            c.c_int(shape.tq), c.c_int(splits), *(c.c_longlong(s) for s in shape.strides[9:12]),
            c.c_int(shape.kv_group),
        ]  # fmt: skip
        if len(self._cargs) + len(self._cptrs) != len(abi.DECODE_COMBINE):
            raise AssertionError("merge arguments out of step with abi.DECODE_COMBINE")
        base, width = c.addressof(self._cptrs), c.sizeof(c.c_void_p)
        params = (c.c_void_p * len(abi.DECODE_COMBINE))(
            *(base + width * i for i in range(len(self._cptrs))),
            *(c.addressof(a) for a in self._cargs),
        )
        grid = (shape.tq * shape.kv_group, shape.h_kv, shape.b)
        return plan.prepare(
            grid, params, dependent=True, sibling=self.combine, threads=COMBINE_THREADS
        )

    def __call__(self, pointers: Sequence[int], stream: int) -> None:
        """Launch on `stream` with `pointers` in POINTER_ARGS order (0 for NULL); with a
        merge kernel (`combine`), the decode kernel gets counters = NULL and the merge kernel
        follows it on `stream`."""
        with self._lock:
            ptrs = self._ptrs
            for i, p in enumerate(pointers):
                ptrs[i] = p
            if self.combine is not None:
                ptrs[_COUNTERS] = None  # NULL: the blocks store their splits and leave
                cp = self._cptrs  # o, lse, o_part, lse_part (_COMBINE_POINTERS)
                cp[0], cp[1], cp[2], cp[3] = pointers[3], pointers[4], pointers[5], pointers[6]
            self.plan.run(self._launches, stream)


_COUNTERS = POINTER_ARGS.index("counters")
# the merge kernel's pointers (abi.DECODE_COMBINE's tensors) in the decode kernel's order
_COMBINE_POINTERS = tuple(POINTER_ARGS.index(n) for n in abi.pointers(abi.DECODE_COMBINE))
assert _COMBINE_POINTERS == (3, 4, 5, 6)  # DecodeLaunch.__call__ stores them by these indices
