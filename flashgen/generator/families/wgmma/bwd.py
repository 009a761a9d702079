"""The backward pass (dQ, dK, dV) of family wgmma (Hopper, sm_90a): its variant rules and
template values. flashgen.torch runs it on sm_90 GPUs by default (its family's bwd_axes ship it at
the default tile); bundles take its plain variants (their C launcher encodes the four tensor
maps as tma.py does, and sizes the padded scratch per variant).

`families.WgmmaFamily` hands a spec with direction "bwd" here. A block owns BC keys of one K/V
head (64 per consumer warpgroup, so `consumers` = bc/64) and walks every query tile of BR rows
that sees them, for every query head of its GQA group; a producer warpgroup streams Q and dO
tiles through a `stages`-deep TMA ring. The kernels (templates/wgmma_bwd.cu.j2) are the mma
backward's three, `<name>_pre`, `<name>`, `<name>_post`, with the same grids and C ABI
(backward.ABI_FORMAT), each preceded by four tensor maps (tm_q, tm_k, tm_v, tm_do: tma.py
builds them, backward.Prepared passes them). The forward's run-time features (`window`,
`softcap`, `alibi`: the ABI's last four arguments) are compile-time tokens as in family mma's
backward; dv = d, and d a multiple of 8 up to 128. The math runs at d_pad = d rounded up to
64 (the forward's rule): the TMA zero-fills each 64-column slab past d, S^T and dP^T take only
the k-steps over real columns, dK and dV are d_pad wide in registers and stored d wide, and
the dQ accumulator is d_pad wide (`backward.scratch_shapes`). The `deterministic` mode keeps
the three kernels: the blocks add into a query tile's dQ accumulator in descending key-tile
order, waiting on a semaphore per (batch, head, query tile) that the scratch holds after the
accumulator (generator/backward.py `scratch_shapes`); not with hooks (a mask may skip a key
tile's step, which the order counts on) nor varlen. Query tiles of 64 rows; or of 128
(WIDE_TILE: d = 64, bc = 128, dense, unhooked, not deterministic, 2 stages), FA3/FA4's
128 x 128 tile for head dim 64: S^T and dP^T of 64 keys x 128 queries per consumer, dS^T stored
as two 64-query slabs, dQ split by query rows between the two consumers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashgen.generator.backward import (
    PRE_LANES_PER_ROW,
    is_deterministic,
    is_varlen,
    kernel_names,
    pre_rows,
)
from flashgen.generator.features.hook import hook_tokens

if TYPE_CHECKING:
    from flashgen.generator.families import WgmmaFamily
    from flashgen.generator.spec import KernelSpec

# Keys a consumer warpgroup owns (the M of its m64nNk16 dK/dV accumulators).
KEYS_PER_CONSUMER = 64
# The values each knob may take, and the tile a backward spec gets when it names none.
MAX_HEAD_DIM = 128  # d: a multiple of 8 (16-byte TMA rows) up to this (dK and dV in registers)
# br: query rows per step (the N of S^T = K Q^T). 64: a dS^T row is one 128-byte swizzle atom of
# queries. 128: only as WIDE_TILE (see `wide`).
QUERY_TILES = (64, 128)
# The 128-row query tile: d and bc it needs. S^T and dP^T take 64 registers each (m64n128)
# beside dK and dV (32 each at d = 64): d = 128's dK and dV leave no room. Two consumers (bc
# 128) split dQ by query rows, 64 each.
WIDE_TILE = {"br": 128, "d": 64, "bc": 128}
WIDE_STAGES = 2  # its Q/dO ring: 3 stages take 233,576 B of shared memory, over sm_90a's limit
KEY_TILES = (64, 128)  # bc: keys per block
STAGES = (2, 3)  # depth of the Q/dO ring (1: no prefetch; d128 bc64 s1 also spilled 16 B)
DEFAULT_TILE = (64, 128)  # (br, bc)
# Registers a consumer thread needs beyond its dK and dV accumulators (d/2 each at 64 keys x d
# per warpgroup): S^T/dP^T (br/2 each, fp32) and descriptors, indices, loop state. Coarse: the
# compile test pins what ptxas really does.
BWD_INDEX_REGS = 48
# Bytes of the dynamic shared memory spent on aligning the base to a swizzle atom.
SMEM_ALIGN = 1024
# Columns of dQ = dS K one wgmma computes: one 64-column (128-byte) swizzled slab of K at a
# time (the template's CHUNK), so a consumer holds 32 fp32 dQ accumulators beside dK and dV.
DQ_COLS = 64
# A varlen variant's block keeps its sequence's rows and lengths in shared memory after the
# barriers (the template's SEQ_INFO ints): read where they are used, not held in registers;
# after them the walk order of the sequences (longest first) and each one's first item
# (VARLEN_SORT_MAX + VARLEN_SORT_MAX + 1 ints; see the main kernel).
VARLEN_SORT_MAX = 256
VARLEN_SEQ_BYTES = 4 * (8 + 2 * VARLEN_SORT_MAX + 1)
# A deterministic variant's block keeps its semaphores' address, the next key tile's query
# tiles and each consumer's pending semaphore in shared memory after the barriers (the
# template's DET_INFO ints).
DET_INFO_BYTES = 4 * 8


def wide(spec: KernelSpec) -> bool:
    """The 128-row query tile (WIDE_TILE): dS^T in 64-query slabs, dQ split by query rows."""
    return spec.br == WIDE_TILE["br"]


def default_tile(d: int, features: tuple[str, ...], stages: int = 0) -> tuple[int, int]:
    """(br, bc) of a backward spec that names no tiles: WIDE_TILE where it applies (d = 64,
    dense, unhooked, no softcap, not deterministic, stages unnamed or 2: 1.02-1.08x the 64 x 128
    tile on an H100, bench/results/nvidia-h100-2026-12-05-s28-bwd-d64-br128-ab.txt),
    DEFAULT_TILE otherwise."""
    refused = {"varlen", "softcap", "deterministic"}
    wide_ok = d == WIDE_TILE["d"] and stages in (0, WIDE_STAGES)
    if wide_ok and not refused & set(features) and not hook_tokens(features):
        return WIDE_TILE["br"], WIDE_TILE["bc"]
    return DEFAULT_TILE


def default_stages(spec: KernelSpec) -> int:
    """Q/dO ring depth when the spec names none: 3 at d = 64 (measured 3-5% over 2 on the
    H200, bench/results/*-wgmma-bwd-sweep.json), 2 at d = 128 (3 is no faster and takes
    227 KB of shared memory) and at br = 128 (3 needs 228 KB: over the 227 KB limit)."""
    return 3 if spec.d <= 64 and not wide(spec) else 2


def takes_head_dim(d: int) -> bool:
    """Whether the wgmma backward takes head dim `d` (and dv = d): a multiple of 8 up to
    MAX_HEAD_DIM."""
    return d % 8 == 0 and 8 <= d <= MAX_HEAD_DIM


def d_pad(spec: KernelSpec) -> int:
    """The head dim the math runs at: the family's (`WgmmaFamily.d_pad`: d rounded up to 64,
    one 128-byte slab per 64 columns)."""
    return spec.fam.d_pad(spec)


def consumers(spec: KernelSpec) -> int:
    """Consumer warpgroups: one per 64 keys of the block."""
    return max(1, spec.bc // KEYS_PER_CONSUMER)


def dq_regions(spec: KernelSpec) -> int:
    """The column ranges of dQ one bulk reduce covers (the template's DQ_REGIONS): one per
    consumer when each owns d_pad / consumers columns (a multiple of DQ_COLS; the template's
    DQ_SPLIT is over DP), else one (the consumers take whole steps in turn). The deterministic
    mode orders each separately: a semaphore per (batch, head, query tile, region)."""
    n = consumers(spec)
    return n if (d_pad(spec) // n) % DQ_COLS == 0 else 1


def register_estimate(spec: KernelSpec) -> int:
    """Registers per consumer thread: dK and dV (d_pad/2 each), S^T and dP^T (br/2 each), plus
    BWD_INDEX_REGS."""
    return d_pad(spec) + spec.br + BWD_INDEX_REGS


def smem_bytes(spec: KernelSpec) -> int:
    """K and V of the block, a ring of `stages` Q and dO tiles (d_pad columns each), two dS^T
    buffers (bc x br each), the fp32 dQ of a query tile (br x d_pad), the alignment slack and
    the mbarriers (one for K/V, full and empty per stage for Q and for dO); a varlen variant's
    sequence after them (VARLEN_SEQ_BYTES). Without hooks, each ring slot also holds its
    tile's D and LSE*log2(e) rows (fp32, bulk-copied with dO and Q); the hooked kernels read
    them from global memory (the template's `ld_smem`)."""
    item = spec.dtype_info.itemsize
    d, br, bc, n = d_pad(spec), spec.br, spec.bc, spec.stages
    tiles = item * (2 * bc * d + 2 * n * br * d + 2 * bc * br)
    varlen = "varlen" in spec.features
    rows = 0 if hook_tokens(spec.features) else 4 * 2 * n * br
    seq = VARLEN_SEQ_BYTES if varlen else 0
    det = DET_INFO_BYTES if is_deterministic(spec) else 0
    return SMEM_ALIGN + tiles + 4 * br * d + rows + 8 * (1 + 4 * n) + seq + det


def check(fam: WgmmaFamily, spec: KernelSpec) -> list[str]:
    """Every broken rule of a backward wgmma spec as 'value: rule; fix'. Its features
    (window, softcap, alibi) need no rule of their own here, but at br = 128 (WIDE_TILE: dense,
    unhooked, not deterministic, no softcap, d 64, bc 128); which features it takes, and dv,
    are spec.py's `_check_backward` (`Family.bwd_features`), checked before; a hook's rules
    beyond every family's are the forward's (`WgmmaFamily.hook_rule`: no varlen)."""
    p = fam.tensor_core_rule(spec) + fam.hook_rule(spec)
    if not takes_head_dim(spec.d):
        p.append(
            f"d={spec.d}: the wgmma backward takes d a multiple of 8 up to {MAX_HEAD_DIM} "
            "(16-byte TMA rows, dK and dV in registers); try 128, or --family mma for other "
            "head dims"
        )
    if spec.br not in QUERY_TILES:
        p.append(
            f"br={spec.br}: the wgmma backward's query tile must be 64 or 128 (dS^T is stored as "
            f"rows of 64 queries, one 128-byte swizzle atom); try {DEFAULT_TILE[0]}"
        )
    elif wide(spec):
        if (spec.d, spec.bc) != (WIDE_TILE["d"], WIDE_TILE["bc"]):
            p.append(
                f"br={spec.br}: the wgmma backward's 128-row query tile needs d = 64 and bc = 128 "
                f"(got d={spec.d}, bc={spec.bc}: S^T and dP^T take 64 registers each beside dK "
                "and dV, and the two consumers split dQ by query rows); try br=64"
            )
        if hook_tokens(spec.features) or "varlen" in spec.features:
            p.append(
                f"br={spec.br}: the wgmma backward's 128-row query tile is for dense kernels "
                "without hooks (it reads D and LSE from the ring in shared memory, which the "
                "hooked and varlen kernels do not, and their consumers have no registers to "
                "spare); try br=64"
            )
        elif "softcap" in spec.features:
            p.append(
                f"br={spec.br}: the wgmma backward's 128-row query tile does not take softcap "
                "(dS^T is computed with P^T there, S^T and dP^T both held through the tanh: "
                "ptxas spilled 16-100 B); try br=64"
            )
        if is_deterministic(spec):
            p.append(
                f"br={spec.br}: the wgmma backward's 128-row query tile has no deterministic "
                "mode (its semaphores count 64-row query tiles); try br=64"
            )
    if spec.bc not in KEY_TILES:
        p.append(
            f"bc={spec.bc}: the wgmma backward's key tile must be 64 or 128 (64 keys per "
            f"consumer warpgroup); try {DEFAULT_TILE[1]}"
        )
    elif spec.warps != fam.default_warps(spec):
        p.append(
            f"warps={spec.warps}: the wgmma backward derives warps from bc (4 * (bc/64 + 1) = "
            f"{fam.default_warps(spec)}: a producer warpgroup and bc/64 consumers); leave warps "
            "unset"
        )
    if spec.stages not in STAGES:
        p.append(
            f"stages={spec.stages}: the wgmma backward's Q/dO ring depth must be 2 or 3; try 2"
        )
    if is_deterministic(spec) and (hook_tokens(spec.features) or is_varlen(spec)):
        p.append(
            f"features={tuple(spec.features)!r}: the wgmma backward's deterministic mode orders "
            "dQ's adds by key tile, which hooks (a mask skips key tiles) and varlen do not "
            "keep; drop deterministic, or use --family mma for bit-identical gradients"
        )
    if not p:
        budget = fam.register_split(spec)[1]
        regs = register_estimate(spec)
        if regs > budget:
            p.append(
                f"d={spec.d}, br={spec.br}: ~{regs} registers per consumer thread of the wgmma "
                f"backward (d_pad + br + {BWD_INDEX_REGS}) exceed the {budget} that "
                f"{consumers(spec)} consumer warpgroups get; lower br"
            )
        p += fam.smem_rule(
            spec,
            "1024 + 2*(2*bc*dp + 2*stages*br*dp + 2*bc*br) + 4*br*dp + 8*br*stages (no "
            "hooks) + 8*(1 + 4*stages), dp = d rounded up to 64",
            "lower stages, br or bc",
        )
    return p


def context(fam: WgmmaFamily, spec: KernelSpec) -> dict[str, Any]:
    """The template values of templates/wgmma_bwd.cu.j2 (all derived here)."""
    from flashgen.generator.families.wgmma.ptx import Wgmma, wrappers

    mt = "bf16" if spec.dtype == "bf16" else "f16"
    n_cons = consumers(spec)
    # S^T = K Q^T and dP^T = V dO^T: 64 keys x br per consumer, both operands in shared memory
    sdp = Wgmma(n=spec.br, a_regs=False, trans_b=False, mma_type=mt)
    # dV += P^T dO and dK += dS^T Q: 64 keys x d, A (P^T, dS^T) from registers, B N-major
    dkv = Wgmma(n=d_pad(spec), a_regs=True, trans_b=True, mma_type=mt)
    # dQ = dS K over all bc keys, one 64-column slab of d at a time (the template's CHUNK: 32
    # accumulators, not d/2); dS^T in shared memory read M-major
    dq = Wgmma(n=DQ_COLS, a_regs=False, trans_b=True, mma_type=mt, trans_a=True)
    producer, consumer = fam.register_split(spec)
    names = kernel_names(spec)
    return {
        "consumers": n_cons,
        "deterministic": is_deterministic(spec),
        "dq_regions": dq_regions(spec),
        # br 128: dS^T as [query half][64 keys][64 queries] slabs, dQ split by query rows
        "wide": wide(spec),
        "stages": spec.stages,
        "producer_regs": producer,
        "consumer_regs": consumer,
        "pack_type": "bf16x2" if spec.dtype == "bf16" else "f16x2",
        "pre_name": names[0],
        "last_name": names[2],
        "pre_lanes": PRE_LANES_PER_ROW,
        "varlen_sort_max": VARLEN_SORT_MAX,
        "pre_rows": pre_rows(spec),
        "sdp_fn": sdp.fn,
        "dkv_fn": dkv.fn,
        "dq_fn": dq.fn,
        "wgmma_wrappers": wrappers([sdp, dkv, dq]),
    }
