"""Family simt: the seed's algorithm on CUDA cores, fp32 math (templates/simt.cu.j2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flashgen.generator.families.base import Family, Preference, _pick

if TYPE_CHECKING:
    from flashgen.generator.spec import KernelSpec

# Lanes that cooperate on one query row in the simt family (a power of two <= 32).
SIMT_LANES_PER_ROW = 4


@dataclass(frozen=True)
class SimtFamily(Family):
    """The seed's algorithm on CUDA cores, fp32 math; `SIMT_LANES_PER_ROW` lanes per query row."""

    def default_warps(self, spec: KernelSpec) -> int:
        return max(1, spec.br * SIMT_LANES_PER_ROW // 32)

    def default_stages(self, spec: KernelSpec) -> int:
        return 1

    def smem_bytes(self, spec: KernelSpec) -> int:
        # fp32 tiles, each row padded by one word so lanes of different rows hit different banks
        # Q and K rows of d, V rows of dv (+1 word each), and the row's probabilities
        return 4 * (
            (spec.br + spec.bc) * (spec.d + 1) + spec.bc * (spec.dv + 1) + spec.br * (spec.bc + 1)
        )

    def check(self, spec: KernelSpec) -> list[str]:
        p: list[str] = []
        g = SIMT_LANES_PER_ROW
        if spec.d < 8 or spec.d > 256 or spec.d % 8:
            p.append(f"d={spec.d}: must be a multiple of 8 in [8, 256] for family simt; try 64")
        p += self.dv_rule(spec)
        if spec.br < 8 or spec.br > 128 or spec.br % 8:
            fix = _pick([16, 32, 64], lambda v: True)
            p.append(
                f"br={spec.br}: must be a multiple of 8 in [8, 128] for family simt; try {fix}"
            )
        if spec.bc < g or spec.bc > 128 or spec.bc % 16:
            p.append(f"bc={spec.bc}: must be a multiple of 16 in [16, 128] for family simt; try 32")
        if spec.warps != self.default_warps(spec):
            p.append(
                f"warps={spec.warps}: family simt derives warps from br (br*{g}/32 = "
                f"{self.default_warps(spec)}); leave warps unset"
            )
        if spec.stages != 1:
            p.append(f"stages={spec.stages}: family simt has no pipeline; leave stages unset")
        if not p:
            # registers: each lane holds d/G output columns and bc/G scores of its row, each
            # score with its Kahan compensation term
            regs = spec.dv // g + 2 * spec.bc // g
            if regs > 64:
                dim = "d" if spec.dv == spec.d else "dv"  # the output columns are v's
                p.append(
                    f"{dim}={spec.dv}, bc={spec.bc}: {regs} accumulators per thread "
                    f"({dim}/{g} + 2*bc/{g}) exceed 64 and would spill; lower bc or {dim}"
                )
            p += self.smem_rule(spec, "4*((br+bc)*(d+1) + bc*(dv+1) + br*(bc+1))", "lower bc or br")
        return p

    def context(self, spec: KernelSpec) -> dict[str, Any]:
        return {"lanes_per_row": SIMT_LANES_PER_ROW}


SIMT = SimtFamily(
    name="simt",
    template="simt.cu.j2",
    archs=("sm_80", "sm_90"),
    knobs=(),
    preference=Preference(rank=2, br=32, bc=32, stages=1, min_major=0),
    tensor_cores=False,
    default_dtype="fp32",
    default_br=32,
    default_bc=32,
    axes={
        "d": (16, 32, 64, 96, 128),
        "br": (16, 32, 64),
        "bc": (16, 32, 64),
        "dtype": ("fp32", "fp16", "bf16"),
        "causal": (False, True),
        "warps": (0,),
        "stages": (0,),
    },
)
