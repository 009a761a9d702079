"""Family mma's backward (dQ, dK, dV): its variant rules, sizes and template values.

`MmaFamily` hands a spec with direction "bwd" here. A block owns BC keys of one K/V head and
walks every query tile (BR rows) that sees them, for every query head of its GQA group; each
warp owns 16 of the keys, so `warps` is always bc/16. It takes the forward's run-time features
as compile-time tokens (`window`, `softcap`, `alibi`) and the `deterministic` mode
(generator/backward.py: dQ by a kernel of its own, a block per query tile, which recomputes P
and dS for every key tile it sees in a fixed order -- about 2/7 more tensor-core work than the
fast mode's five GEMMs per tile pair, the price of bit-identical gradients), and user hooks
(`scoremod<digest>` / `maskmod<digest>`, features/hook.py: P recomputed with the forward's
hooked logit, dS times the score_mod's derivative); it needs dv = d and has no `gqapack`
(spec.py refuses those in one line).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashgen.generator.arch import ARCHS
from flashgen.generator.backward import (
    PRE_LANES_PER_ROW,
    is_deterministic,
    kernel_names,
    pre_rows,
)

if TYPE_CHECKING:
    from flashgen.generator.families.base import Family
    from flashgen.generator.spec import KernelSpec

# ---- the variant's rules ---------------------------------------------------------------------
# Extra 16-byte pad per shared-memory row (as the forward's MMA_ROW_PAD): the 8 rows one
# ldmatrix phase reads start in 8 different bank quads.
BWD_ROW_PAD = 8
# Ceiling for `register_estimate` (registers a thread's live arrays take): above it the live
# arrays alone leave ptxas too little of its 255 (d=128 at br=128: 288). A coarse guard, not a
# promise: ptxas 13.0 fills up to 255 registers at every tile, and a few points under it spill
# a few bytes (d=96 and d=64 at br=128: 8-68 B, measured); the zero-spill compile test pins
# the shipped variants (tests/runtime/test_backward_cpu.py).
BWD_REG_BUDGET = 232
# Up to this padded head dim dP^T is computed for the whole query tile at once; above it, 16
# query columns at a time (V's fragments re-read per chunk), which keeps the fp32 dP values
# live beside P to 8. Measured on ptxas 13.0 at 64x64: d=128 spilled 16-104 B computed whole
# and none in chunks of 16; d=64 the other way round (none whole, 12-84 B in chunks of 16).
BWD_DP_CHUNK_MAX_D = 64
# Registers beyond the estimate that addresses, indices and loop state take (see min_blocks):
# measured ~85 on ptxas 13.0 (d=64 at 64x64 uses 216 against an estimate of 144); a cap below
# estimate + this spills (d=40 promised 3 blocks, capped at 168 registers: 80 B on sm_90).
BWD_INDEX_REGS = 96


def default_warps(spec: KernelSpec) -> int:
    """Each warp owns 16 of the block's bc keys (its dK and dV rows)."""
    return max(1, spec.bc // 16)


def register_estimate(spec: KernelSpec, br: int | None = None) -> int:
    """Registers per thread of the live arrays: dK and dV (16 keys x dp fp32 per warp: dp/2
    each), P^T and dP^T in fp32 (16 keys x br: br/2 each) and P^T packed (br/4); `br`
    overrides the spec's."""
    dp = -(-spec.d // 16) * 16
    rows = spec.br if br is None else br
    return dp + rows + rows // 4


def smem_bytes(spec: KernelSpec, stages: int | None = None) -> int:
    """K and V of the block, a ring of `stages` Q and dO tiles, dS^T (for the atomic dQ; in
    deterministic mode for dK's fragments), and the ring's LSE and D rows (fp32); `stages`
    overrides the spec's."""
    n = spec.stages if stages is None else stages
    item = spec.dtype_info.itemsize
    lds = -(-spec.d // 16) * 16 + BWD_ROW_PAD  # K, V, Q, dO rows
    ldss = spec.br + BWD_ROW_PAD  # dS^T rows (one per key, br queries)
    return item * (2 * spec.bc * lds + 2 * n * spec.br * lds + spec.bc * ldss) + 4 * 2 * n * spec.br


def dq_smem_bytes(spec: KernelSpec, stages: int | None = None) -> int:
    """Shared memory of the deterministic mode's dQ kernel: Q and dO of its query tile, and
    a ring of `stages` K and V tiles (default: `dq_stages`)."""
    n = dq_stages(spec) if stages is None else stages
    lds = -(-spec.d // 16) * 16 + BWD_ROW_PAD
    return spec.dtype_info.itemsize * lds * (2 * spec.br + 2 * n * spec.bc)


def dq_stages(spec: KernelSpec) -> int:
    """K/V ring depth of the dQ kernel: two (the next key tile loads under this one) when two
    blocks of it still fit one sm_80 SM, as `default_stages` decides for the main kernel
    (d=64 at 64x64: 54 KiB; d=128: two stages take 102 KiB, so one, 68 KiB)."""
    two = dq_smem_bytes(spec, stages=2)
    return 2 if 2 * two <= ARCHS["sm_80"].smem_per_sm else 1


def default_stages(spec: KernelSpec) -> int:
    """Two Q/dO stages (the next tile loads while this one is used) when two blocks of them
    still fit one sm_80 SM, so 8 warps stay resident there; else one (d=128 at 64x64: two
    stages take 115 KB and would leave one block per SM)."""
    two = smem_bytes(spec, stages=2)
    return 2 if 2 * two <= ARCHS["sm_80"].smem_per_sm else 1


def min_blocks(spec: KernelSpec) -> int:
    """Blocks per SM promised to ptxas: the most (up to 4) whose register share holds the
    estimate plus BWD_INDEX_REGS."""
    need = register_estimate(spec) + BWD_INDEX_REGS
    fits = [n for n in (1, 2, 3, 4) if need <= min(255, 65536 // (n * spec.threads))]
    return max(fits, default=1)


def check(fam: Family, spec: KernelSpec) -> list[str]:
    """Every broken rule of a backward mma spec as 'value: rule; fix'."""
    p: list[str] = []
    if spec.d % 8 or not 8 <= spec.d <= 256:
        p.append(f"d={spec.d}: must be a multiple of 8 in [8, 256] for family mma; try 64")
    if spec.br % 16 or not 16 <= spec.br <= 128:
        p.append(
            f"br={spec.br}: the backward's query tile must be a multiple of 16 in [16, 128]; try 64"
        )
    if spec.bc % 16 or not 16 <= spec.bc <= 256:
        p.append(
            f"bc={spec.bc}: the backward's key tile must be a multiple of 16 in [16, 256]; try 64"
        )
    elif spec.warps != spec.bc // 16:
        p.append(
            f"warps={spec.warps}: the backward gives each warp 16 of the bc={spec.bc} keys "
            f"(warps = bc/16 = {spec.bc // 16}); leave warps unset"
        )
    if spec.stages not in (1, 2):
        p.append(f"stages={spec.stages}: the Q/dO ring depth must be 1 or 2; try 1")
    if is_deterministic(spec) and not p and spec.br != spec.bc:
        # the dQ kernel runs with the main kernel's bc/16 warps, each owning 16 query rows
        p.append(
            f"br={spec.br}, bc={spec.bc}: the deterministic backward's dQ kernel gives each of "
            f"the bc/16 = {spec.bc // 16} warps 16 of the br query rows, so it needs br = bc; "
            f"try br={spec.bc}"
        )
    if not p:
        regs = register_estimate(spec)
        if regs > BWD_REG_BUDGET:
            p.append(
                f"d={spec.d}, br={spec.br}: ~{regs} registers per thread of the backward "
                f"(dp + 5*br/4, dp = d rounded up to 16) exceed {BWD_REG_BUDGET} and would "
                "spill; "
                + (
                    "lower br (e.g. 32)"
                    if spec.br > 32 and register_estimate(spec, br=32) <= BWD_REG_BUDGET
                    else "this head dim has no backward variant yet (d <= 128)"
                )
            )
        p += fam.smem_rule(
            spec,
            "2*(2*bc*(dp+8) + 2*stages*br*(dp+8) + bc*(br+8)) + 8*stages*br",
            "lower bc, br or stages",
        )
        if is_deterministic(spec):
            limit, need = fam.smem_limit(), dq_smem_bytes(spec)
            if need > limit:
                p.append(
                    f"smem={need} B: the deterministic dQ kernel (2*(dp+8)*(2*br + "
                    f"{dq_stages(spec)}*2*bc)) exceeds the {limit} B per block of the family's "
                    "tightest arch; lower br and bc"
                )
    return p




def context(fam: Family, spec: KernelSpec) -> dict[str, Any]:
    """The template values of templates/mma_bwd.cu.j2 (all derived here)."""
    dp = fam.d_pad(spec)
    det = is_deterministic(spec)
    return {
        "row_pad": BWD_ROW_PAD,
        "mma_type": "bf16" if spec.dtype == "bf16" else "f16",
        "pack_type": "bf16x2" if spec.dtype == "bf16" else "f16x2",
        "deterministic": det,
        "pre_name": kernel_names(spec)[0],
        # the third kernel: `_post` (accumulator -> dq) or, deterministic, `_dq`
        "last_name": kernel_names(spec)[2],
        "dq_stages": dq_stages(spec) if det else 0,
        "dq_smem_bytes": dq_smem_bytes(spec) if det else 0,
        "pre_lanes": PRE_LANES_PER_ROW,
        "pre_rows": pre_rows(spec),
        # dQ = dS K is computed in units of 16 query rows x DQ_COLS columns (16 fp32
        # accumulators a thread at 32), shared round-robin by the warps
        "dq_cols": 32 if dp % 32 == 0 else 16,
        # dP^T is computed this many k-steps (16 queries) at a time; see BWD_DP_CHUNK_MAX_D
        "dp_chunk": spec.br // 16 if dp <= BWD_DP_CHUNK_MAX_D else 1,
    }
