"""Family mma's decode kernel (templates/mma_decode.cu.j2): its variant rules, sizes and values.

`MmaFamily` hands a spec with direction "decode" here. A block owns `br` packed rows (the query
heads of one K/V head times the new tokens, 16 a tile) and one split of the keys they see;
each of its `warps` warps streams every warps-th tile of `bc` keys through a ring of `stages`
tiles of its own. The run-time features (`window`, `softcap`, `alibi`) are compile-time tokens
as in the forward; the kernel always packs a GQA group's query heads (no `gqapack` token) and
has no backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashgen.generator import abi
from flashgen.generator.families.base import _pick

if TYPE_CHECKING:
    from flashgen.generator.families.base import Family
    from flashgen.generator.spec import KernelSpec

# Extra 16-byte pad per shared-memory row (as the forward's): the 8 rows one ldmatrix phase
# reads start in 8 different bank quads.
DECODE_ROW_PAD = 8
# Registers a thread's live arrays may take (Q fragments, O, S, packed P): measured with ptxas
# 13.0, d 256 at 16x16 (an estimate of 204) compiles without spills on sm_80 and sm_90; 16x32
# (216) too on sm_90, but Q held at 32 rows spilled 12 B on sm_80 (d 128 32x16, 216 then).
DECODE_REG_BUDGET = 208


DECODE_MERGE_MAX = 16
"""Split results one block merges at most: a row tile's splits merge in one level when there
are at most this many, else in groups of about sqrt(splits) and then the groups (so at most
DECODE_MERGE_MAX**2 splits)."""
DECODE_COMBINE_THREADS = 128
"""The block of the variant's split-merge kernel (`<name>_combine`, sm_90): threads over a
row's 8-column chunks, the rest taking every C_SUB-th split (templates/mma_decode.cu.j2)."""


def merge_group_size(splits: int) -> int:
    """Splits per merge group (the template's `merge_group_size`): all of them when at most
    DECODE_MERGE_MAX, else ceil(sqrt(splits))."""
    if splits > DECODE_MERGE_MAX**2:
        raise ValueError(f"splits={splits}: the decode merge takes at most {DECODE_MERGE_MAX**2}")
    if splits <= DECODE_MERGE_MAX:
        return splits
    g = 1
    while g * g < splits:
        g += 1
    return g


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


def smem_bytes(spec: KernelSpec, stages: int | None = None) -> int:
    """Q [br][dp+pad], then each warp's ring [stages][bc][(dp+pad) + (dvp+pad)]."""
    n = spec.stages if stages is None else stages
    item = spec.dtype_info.itemsize
    qk_row = (_pad16(spec.d) + DECODE_ROW_PAD) * item
    v_row = (_pad16(spec.dv) + DECODE_ROW_PAD) * item
    return qk_row * spec.br + spec.warps * n * spec.bc * (qk_row + v_row)


def register_estimate(d: int, dv: int, br: int, bc: int) -> int:
    """Live arrays per thread: O (dvp/2 per 16 rows), S in fp32 (bc/2 per 16 rows), P packed
    (bc/4 per 16 rows), and with one 16-row tile its Q fragments (dp/4; more tiles re-read Q
    from shared memory each key tile)."""
    q_regs = _pad16(d) // 4 if br == 16 else 0
    return q_regs + br // 16 * (_pad16(dv) // 2 + bc // 2 + bc // 4)


def default_warps(spec: KernelSpec) -> int:
    """Four warps (measured on the H200 against two at 16 rows: +1-16% on every decode row,
    most where few blocks share a row tile's keys; bench/NOTES.md)."""
    return 4


def default_stages(fam: Family, spec: KernelSpec) -> int:
    """A two-tile ring: on the H200 the smallest blocks streamed fastest (bench/NOTES.md)."""
    return 2


def merge_fits(spec: KernelSpec, stages: int) -> bool:
    """The warps' results (O [warps][br][dvp] and max, sum [2][warps][br], fp32) meet in the
    rings' space at the end."""
    need = spec.warps * spec.br * (_pad16(spec.dv) + 2) * 4
    return (
        need
        <= smem_bytes(spec, stages)
        - (_pad16(spec.d) + DECODE_ROW_PAD) * spec.br * spec.dtype_info.itemsize
    )


def check(fam: Family, spec: KernelSpec) -> list[str]:
    """Every broken rule of a decode spec as 'value: rule; fix'."""
    p: list[str] = []
    if spec.d < 8 or spec.d > 256 or spec.d % 8:
        p.append(f"d={spec.d}: must be a multiple of 8 in [8, 256] for the decode kernel; try 128")
    p += fam.dv_rule(spec)
    if spec.br not in (16, 32, 48, 64):
        p.append(
            f"br={spec.br}: the decode kernel's packed rows per block are 16, 32, 48 or 64 "
            "(query heads per K/V head x new tokens, 16 a tile); try 16"
        )
    if spec.bc not in (16, 32, 48, 64):
        p.append(f"bc={spec.bc}: keys per warp tile must be 16, 32, 48 or 64; try 32")
    if spec.warps not in (1, 2, 4, 8):
        p.append(f"warps={spec.warps}: must be 1, 2, 4 or 8; try 4")
    if spec.stages not in (2, 3, 4):
        p.append(f"stages={spec.stages}: each warp's K/V ring holds 2, 3 or 4 tiles; try 2")
    if p:
        return p
    regs = register_estimate(spec.d, spec.dv, spec.br, spec.bc)
    if regs > DECODE_REG_BUDGET:
        fix = _pick(
            [16, 32],
            lambda bc: register_estimate(spec.d, spec.dv, spec.br, bc) <= DECODE_REG_BUDGET,
        )
        p.append(
            f"d={spec.d}, br={spec.br}, bc={spec.bc}: ~{regs} registers per thread "
            f"((br = 16: dp/4) + br/16*(dvp/2 + 3*bc/4)) exceed {DECODE_REG_BUDGET} and would "
            "spill; try "
            f"bc={fix} or a smaller br"
        )
    p += fam.smem_rule(
        spec,
        "2*((dp+8)*br + warps*stages*bc*((dp+8) + (dvp+8)))",
        "lower bc, stages or warps",
    )
    if not p and not merge_fits(spec, spec.stages):
        p.append(
            f"warps={spec.warps}, stages={spec.stages}, bc={spec.bc}: the warps' fp32 results "
            "(warps*br*(dvp+2)*4 B) must fit the rings' shared memory to be merged; raise "
            "stages or bc"
        )
    return p


def combine_name(spec: KernelSpec) -> str:
    """The decode variant's split-merge kernel (`abi.DECODE_COMBINE`), in the same source."""
    return f"{spec.name}_combine"


def context(spec: KernelSpec) -> dict[str, Any]:
    """The template values of templates/mma_decode.cu.j2."""
    return {
        "row_pad": DECODE_ROW_PAD,
        "merge_max": DECODE_MERGE_MAX,
        "combine_name": combine_name(spec),
        "combine_threads": DECODE_COMBINE_THREADS,
        "combine_params": [
            {"decl": p.declaration("elem_t"), "note": p.note} for p in abi.DECODE_COMBINE
        ],
        "mma_type": "bf16" if spec.dtype == "bf16" else "f16",
        "pack_type": "bf16x2" if spec.dtype == "bf16" else "f16x2",
    }
