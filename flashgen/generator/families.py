"""Kernel families: each owns its validation rules, its knobs and its derived sizes.

A family is a small object, not a subclass tree: `check(spec)` lists every broken rule as
"value: rule; fix", and the derived values (warps, shared memory) are plain functions of the
spec, so nothing is stored twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import backward, wgmma_bwd
from .arch import ARCHS

if TYPE_CHECKING:
    from .spec import KernelSpec

# Lanes that cooperate on one query row in the simt family (a power of two <= 32).
SIMT_LANES_PER_ROW = 4
# Extra 16-byte pad per shared-memory row in the mma family: it shifts successive rows by 4
# banks, so the 8 row addresses of every ldmatrix phase hit 8 distinct bank quads.
MMA_ROW_PAD = 8
# From this head dim on, S = Q K^T is accumulated in two chains (even and odd k-steps) summed
# at the end: one chain of 16 tensor-core accumulations moved LSE by 1.08e-4 at logits of 60
# (fp16, d=256, H200), over the 1e-4 the correctness rule allows.
MMA_SPLIT_QK_FROM_D = 256
# Ceiling for MmaFamily.register_estimate: above it ptxas 13.0 spills (255 registers max).
# A two-stage ring keeps a second buffer's addresses and a deeper cp.async queue live, and the
# masked copy of the loop body needs row/key indices: measured, 2-stage variants spill from an
# estimate of 192 (d=128, bc=32, 32 rows/warp, causal), 1-stage ones not below 255.
MMA_REG_BUDGET = {1: 232, 2: 190}
# Extra registers a feature variant's score loop needs per 16-row tile beyond the first (see
# MmaFamily.register_estimate).
MMA_FEATURE_REGS = 16
# Registers beyond the estimate that addresses, indices and softmax state take (see min_blocks).
MMA_INDEX_REGS = 64
# Q fragments (registers per thread) kept resident across the key loop when at most this many.
MMA_Q_REGS = 32


def _pick(values: list[int], ok: Any) -> str:
    good = [str(v) for v in values if ok(v)]
    return " or ".join(good[:3]) if good else "another value"


PERSISTENT_MAX_KEY_TILES = 32
"""wgmma: query tiles seeing at most this many key tiles on average take persistent blocks.
H200, bf16, B*T = 16k (bench/NOTES.md): persistent vs a block per tile was +11/+7/+3/-1% at
4/8/32/128 key tiles (d = 128, full) and +15/+10/+5% at 2.5/4.5/16.5 (causal), but slower at
33 (causal window 4096) and 64.5 (causal T = 16k)."""


def key_tiles(spec: KernelSpec, tq: int, tk: int, window: tuple[int, int]) -> float:
    """Average key tiles of BC a query row sees (bottom-right causal, window sides)."""
    keys = float(tk)
    if spec.causal:  # row i sees i + tk - tq + 1 keys
        keys = max(0.0, tk - tq / 2) if tk >= tq else tk / 2
    left, right = window
    if left >= 0 or right >= 0:
        reach = (left if left >= 0 else tk) + 1
        reach += 0 if spec.causal else (right if right >= 0 else tk)
        keys = min(keys, float(reach))
    return keys / spec.bc


@dataclass(frozen=True)
class Family:
    """Rules and derived values shared by every family; subclasses fill in the specifics."""

    name: str
    template: str
    archs: tuple[str, ...]
    # (KernelSpec field, name token) for each performance knob, in name order: ("warps", "w")
    # puts `_w4` in the name and lets `from_name` read it back
    knobs: tuple[tuple[str, str], ...]
    axes: dict[str, tuple[Any, ...]]  # the shipped space: every axis of KernelSpec
    # the compile-time feature tokens it supports
    features: frozenset[str] = frozenset({"window", "softcap", "alibi"})
    # the feature sets shipped (compiled ahead) at the default and tuned tiles; any other
    # combination is compiled on demand
    shipped_features: tuple[tuple[str, ...], ...] = (("window",), ("softcap",), ("alibi",))
    default_dtype: str = "bf16"  # what a spec that names no dtype gets
    default_br: int = 128  # ... and no tiles (see default_tile)
    default_bc: int = 64
    # the backward pass (direction "bwd"): its template ("" = the family has none yet) and
    # the (br, bc) a backward spec that names no tiles gets. 64 queries x 64 keys, 4 warps of
    # 16 keys: dK and dV of d=128 take 128 fp32 registers a thread, P^T and dP^T 16 keys x br,
    # so br=64 is the widest query tile d=128 compiles without spills (255 registers); bc=64
    # keeps smem at 64 KiB (d=64, two Q/dO stages) / 77.5 KiB (d=128, one): two blocks per sm_80 SM
    bwd_template: str = ""
    bwd_tile: tuple[int, int] = (64, 64)
    # the feature tokens its backward supports (the rest are refused for direction "bwd")
    bwd_features: frozenset[str] = frozenset()

    def d_pad(self, spec: KernelSpec) -> int:
        """The head dim the math runs at: d rounded up to the family's MMA granularity (the
        extra columns are zeros in shared memory, never a copy of the user's tensors)."""
        return spec.d

    def dv_pad(self, spec: KernelSpec) -> int:
        """The value head dim the math runs at (P V's columns), padded like `d_pad`."""
        return spec.dv

    def dv_rule(self, spec: KernelSpec) -> list[str]:
        """The value head dim's rule: a multiple of 8 in [8, 256], like d (dv = d: d's rule)."""
        if spec.dv != spec.d and (spec.dv % 8 or not 8 <= spec.dv <= 256):
            return [
                f"dv={spec.dv}: must be a multiple of 8 in [8, 256] for family {self.name}; "
                "leave it unset for dv = d"
            ]
        return []

    def default_tile(self, d: int) -> tuple[int, int]:
        """(br, bc) for a spec that names no tiles: the family's usual tile for head dim d."""
        return self.default_br, self.default_bc

    def default_warps(self, spec: KernelSpec) -> int:
        """The warps a spec gets when it does not name them."""
        raise NotImplementedError

    def align_elems(self, spec: KernelSpec) -> int:
        """Elements every base pointer and token/head/batch stride must be a multiple of."""
        return 1

    def default_stages(self, spec: KernelSpec) -> int:
        """The pipeline stages a spec gets when it does not name them."""
        raise NotImplementedError

    def grid(
        self, spec: KernelSpec, batch: int, heads: int, tq: int, tk: int, sms: int,
        window: tuple[int, int] = (-1, -1), kv_group: int = 1,
    ) -> tuple[int, int, int]:
        """Launch grid for a problem on a GPU with `sms` SMs (window: the kernel's sides,
        -1 unbounded; kv_group: query heads per K/V head). Here (query tiles, heads, batch), a
        block per query tile; GQAPACK variants (packed-row tiles, K/V heads, batch)."""
        if "gqapack" in spec.features:
            return (-(-tq * kv_group // spec.br), heads // kv_group, batch)
        return spec.grid(batch, heads, tq)

    def check(self, spec: KernelSpec) -> list[str]:
        """Every broken rule as 'value: rule; fix' (empty when the spec is valid)."""
        raise NotImplementedError

    def smem_bytes(self, spec: KernelSpec) -> int:
        """Dynamic shared memory one block needs."""
        raise NotImplementedError

    def context(self, spec: KernelSpec) -> dict[str, Any]:
        """Family-specific values handed to the template (all derived in Python)."""
        return {}

    def min_blocks(self, spec: KernelSpec) -> int:
        """Blocks per SM promised to ptxas in `__launch_bounds__` (caps registers per thread)."""
        return 1

    def tensor_core_rule(self, spec: KernelSpec) -> list[str]:
        """The dtype rule of the tensor-core families: 16-bit operands only."""
        if spec.dtype_info.tensor_core:
            return []
        return [
            f"dtype={spec.dtype}: family {self.name} needs a tensor-core dtype; use fp16 or "
            "bf16, or family simt for fp32"
        ]

    def smem_limit(self) -> int:
        """Shared memory per block on the tightest arch the family ships for."""
        return min(ARCHS[a].smem_per_block for a in self.archs)

    def smem_rule(self, spec: KernelSpec, formula: str, fix: str) -> list[str]:
        """The shared-memory rule: the block must fit every arch the family ships for."""
        limit = self.smem_limit()
        need = self.smem_bytes(spec)
        if need > limit:
            arch = min(self.archs, key=lambda a: ARCHS[a].smem_per_block)
            # a shipped variant runs on every arch of its family: the smallest limit decides,
            # whatever arch this particular build targets
            ships = "/".join(self.archs)
            return [
                f"smem={need} B: exceeds the {limit} B per block of {arch}, the tightest of the "
                f"archs family {self.name} ships for ({ships}; {formula}); {fix}"
            ]
        return []


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


@dataclass(frozen=True)
class MmaFamily(Family):
    """FlashAttention-2 on mma.sync tensor cores: each warp owns 16 or 32 query rows.

    A backward spec (direction "bwd") takes its rules and sizes from `backward.py`.
    """

    def default_warps(self, spec: KernelSpec) -> int:
        if spec.direction == "bwd":
            return backward.default_warps(spec)
        return max(1, spec.br // 16)

    def d_pad(self, spec: KernelSpec) -> int:
        # m16n8k16: Q K^T takes the head dim in k-steps of 16
        return -(-spec.d // 16) * 16

    def dv_pad(self, spec: KernelSpec) -> int:
        # P V's columns go through ldmatrix.trans 16 at a time
        return -(-spec.dv // 16) * 16

    def default_stages(self, spec: KernelSpec) -> int:
        if spec.direction == "bwd":
            return backward.default_stages(spec)
        # two stages unless their registers would spill or their shared memory not fit (then
        # one: e.g. d=256 at 128x64)
        two = self.register_estimate(spec, stages=2)
        fits = self.smem_bytes(spec, stages=2) <= self.smem_limit()
        return 2 if two <= MMA_REG_BUDGET[2] and fits else 1

    def align_elems(self, spec: KernelSpec) -> int:
        # K/V/Q tiles move in 16-byte cp.async chunks
        return 16 // spec.dtype_info.itemsize

    def register_estimate(self, spec: KernelSpec, stages: int | None = None) -> int:
        """Registers a thread needs for its live arrays: O (d/2 per 16 rows), fp32 S (bc/2),
        packed P (bc/4), plus the second stage's addresses. Calibrated on ptxas 13.0: every
        variant at or under MMA_REG_BUDGET compiles without spills on sm_80 and sm_90.
        `stages` overrides the spec's (to choose a default)."""
        mt = self.rows_per_warp(spec) // 16
        chains = self.qk_chains(spec)
        n_stages = spec.stages if stages is None else stages
        # features keep row/key indices live through the score loop: measured, one-stage
        # variants with 32 rows per warp spill with them from an estimate of 224 (d=32 bc=128
        # with alibi; d=128 bc=64 causal with window+softcap), 16-row ones never
        feature_regs = MMA_FEATURE_REGS * (mt - 1) if spec.features and n_stages == 1 else 0
        return (
            mt * (self.dv_pad(spec) // 2 + 3 * spec.bc // 4 + (chains - 1) * spec.bc // 2)
            + 16 * (n_stages - 1)
            + feature_regs
        )

    def qk_chains(self, spec: KernelSpec) -> int:
        """Independent fp32 accumulator sets for S = Q K^T (more = shorter rounding chains)."""
        return 2 if spec.d >= MMA_SPLIT_QK_FROM_D else 1

    def min_blocks(self, spec: KernelSpec) -> int:
        if spec.direction == "bwd":
            return backward.min_blocks(spec)
        # The most blocks (up to 4) whose register share still holds the estimate plus ~64
        # registers of addresses and indices: more resident warps hide the latency of the
        # S -> softmax -> P V chain. Calibrated like MMA_REG_BUDGET; the zero-spill compile
        # test over the whole space guards it.
        need = self.register_estimate(spec) + MMA_INDEX_REGS
        fits = [n for n in (1, 2, 3, 4) if need <= min(255, 65536 // (n * spec.threads))]
        return max(fits, default=1)

    def rows_per_warp(self, spec: KernelSpec) -> int:
        """Query rows each warp owns (16 per m16n8k16 row tile)."""
        return spec.br // max(spec.warps, 1)

    def smem_bytes(self, spec: KernelSpec, stages: int | None = None) -> int:
        """Shared memory of Q, the K ring and the V ring; `stages` overrides the spec's."""
        if spec.direction == "bwd":
            return backward.smem_bytes(spec, stages)
        n = spec.stages if stages is None else stages
        item = spec.dtype_info.itemsize
        qk_row = (self.d_pad(spec) + MMA_ROW_PAD) * item  # Q and K rows
        v_row = (self.dv_pad(spec) + MMA_ROW_PAD) * item
        return qk_row * (spec.br + n * spec.bc) + v_row * n * spec.bc

    def check(self, spec: KernelSpec) -> list[str]:
        if spec.direction == "bwd":
            return self.tensor_core_rule(spec) + backward.check(self, spec)
        p = self.tensor_core_rule(spec)
        if spec.d < 8 or spec.d > 256 or spec.d % 8:
            p.append(f"d={spec.d}: must be a multiple of 8 in [8, 256] for family mma; try 64")
        p += self.dv_rule(spec)
        if "gqapack" in spec.features and "alibi" in spec.features:
            p.append(
                "features=gqapack,alibi: a packed tile mixes query heads, and ALiBi's slope is "
                "per head; drop gqapack (or alibi)"
            )
        if spec.br % 16 or not 16 <= spec.br <= 256:
            p.append(f"br={spec.br}: must be a multiple of 16 in [16, 256] for family mma; try 128")
        if spec.bc % 16 or not 16 <= spec.bc <= 256:
            p.append(f"bc={spec.bc}: must be a multiple of 16 in [16, 256] for family mma; try 64")
        if spec.warps not in (1, 2, 4, 8, 16):
            p.append(f"warps={spec.warps}: must be 1, 2, 4, 8 or 16; try 4")
        elif spec.br % 16 == 0 and spec.br % (16 * spec.warps):
            fix = _pick([4, 8, 2], lambda w: spec.br % (16 * w) == 0)
            p.append(
                f"warps={spec.warps}: br={spec.br} must split into 16-row tiles per warp "
                f"(br % (16*warps) == 0); try warps={fix}"
            )
        elif spec.br % 16 == 0 and self.rows_per_warp(spec) > 32:
            p.append(
                f"warps={spec.warps}: each warp would own {self.rows_per_warp(spec)} rows of "
                f"br={spec.br}; at most 32; try warps={spec.br // 16}"
            )
        if spec.stages not in (1, 2):
            p.append(f"stages={spec.stages}: K/V pipeline depth must be 1 or 2; try 2")
        if not p:
            regs = self.register_estimate(spec)
            budget = MMA_REG_BUDGET.get(spec.stages, 0)
            if regs > budget:
                p.append(
                    f"d={spec.d}, bc={spec.bc}, rows/warp={self.rows_per_warp(spec)}, "
                    f"stages={spec.stages}: ~{regs} registers per thread "
                    "(rows/16*(dvp/2 + 3*bc/4, + bc/2 if d >= 256) + 16*(stages-1), + "
                    "16*(rows/16-1) with features at stages=1, dvp = dv rounded up to 16) exceed "
                    f"{budget} and would spill; lower bc, use stages=1, or more warps"
                )
            p += self.smem_rule(
                spec,
                "2*((dp+8)*(br + stages*bc) + (dvp+8)*stages*bc)",
                "lower bc or stages, or use br=64",
            )
        return p

    def context(self, spec: KernelSpec) -> dict[str, Any]:
        if spec.direction == "bwd":
            return backward.context(self, spec)
        m_tiles = self.rows_per_warp(spec) // 16
        q_regs = m_tiles * self.d_pad(spec) // 16 * 4
        return {
            "row_pad": MMA_ROW_PAD,
            "m_tiles": m_tiles,
            "qk_chains": self.qk_chains(spec),
            "mma_type": "bf16" if spec.dtype == "bf16" else "f16",
            "pack_type": "bf16x2" if spec.dtype == "bf16" else "f16x2",
            # Q fragments stay in registers when they are few (<= 32 per thread); with its own
            # dv, also only when the O, S and P arrays leave room for them: O grows with dv
            # while Q stays small (measured: d=64 dv=128 w4 s1 spilled 100 B with Q held, 0
            # without). dv = d keeps the rule its variants were proven with.
            "q_in_regs": q_regs <= MMA_Q_REGS
            and (spec.dv == spec.d or self.register_estimate(spec) + q_regs <= MMA_REG_BUDGET[1]),
        }


# wgmma: registers per thread after setmaxnreg, by consumer warpgroups. The 65,536 registers
# of an SM go to one block: 128 * (producer + consumers * consumer) must fit.
WGMMA_REGS = {1: (56, 240), 2: (24, 240), 3: (32, 160)}  # consumers -> (producer, consumer)
# Registers a consumer thread needs beyond its accumulators: descriptors, indices, softmax state.
WGMMA_INDEX_REGS = 32
# Bytes of the dynamic shared memory spent on aligning the base to a swizzle atom.
WGMMA_SMEM_ALIGN = 1024


@dataclass(frozen=True)
class WgmmaFamily(Family):
    """FlashAttention-3 on Hopper: TMA + mbarrier ring, a producer warpgroup, 64-row consumers.

    A backward spec (direction "bwd") takes its rules and sizes from `wgmma_bwd.py`.
    """

    def consumers(self, spec: KernelSpec) -> int:
        """Consumer warpgroups: one per 64 query rows (backward: one per 64 keys)."""
        if spec.direction == "bwd":
            return wgmma_bwd.consumers(spec)
        return max(1, spec.br // 64)

    def default_warps(self, spec: KernelSpec) -> int:
        return 4 * (self.consumers(spec) + 1)

    def register_split(self, spec: KernelSpec) -> tuple[int, int]:
        """(producer, consumer) registers per thread after setmaxnreg (WGMMA_REGS)."""
        return WGMMA_REGS[self.consumers(spec)]

    def default_stages(self, spec: KernelSpec) -> int:
        if spec.direction == "bwd":
            return wgmma_bwd.default_stages(spec)
        return 2

    def d_pad(self, spec: KernelSpec) -> int:
        # tiles are loaded as 64-column (128-byte) swizzled slabs; the TMA fills the columns
        # past d with zeros
        return -(-spec.d // 64) * 64

    def dv_pad(self, spec: KernelSpec) -> int:
        return -(-spec.dv // 64) * 64

    def default_tile(self, d: int) -> tuple[int, int]:
        # 128 x 128 (two consumers); d = 256 has registers for bc = 64 only
        return (128, 64) if d > 128 else (128, 128)

    def align_elems(self, spec: KernelSpec) -> int:
        # TMA: the base address and every stride of a tensor map are multiples of 16 bytes
        return 16 // spec.dtype_info.itemsize

    def register_estimate(self, spec: KernelSpec) -> int:
        """Consumer registers: O (d/2), S (bc/2) and the P in flight beside it (bc/4), plus
        WGMMA_INDEX_REGS; the zero-spill compile test guards it."""
        return self.dv_pad(spec) // 2 + spec.bc // 2 + spec.bc // 4 + WGMMA_INDEX_REGS

    def smem_bytes(self, spec: KernelSpec) -> int:
        if spec.direction == "bwd":
            return wgmma_bwd.smem_bytes(spec)
        dp, dvp = self.d_pad(spec), self.dv_pad(spec)
        tiles = spec.dtype_info.itemsize * (
            dp * (spec.br + spec.stages * spec.bc) + dvp * spec.stages * spec.bc
        )
        return WGMMA_SMEM_ALIGN + tiles + 8 * (2 + 4 * spec.stages)

    def grid(
        self, spec: KernelSpec, batch: int, heads: int, tq: int, tk: int, sms: int,
        window: tuple[int, int] = (-1, -1), kv_group: int = 1,
    ) -> tuple[int, int, int]:
        # One-dimensional (wgmma.cu.j2 decodes the work): persistent blocks, one per SM, when
        # there are more query tiles than SMs and each sees few key tiles (its load latency
        # and epilogue then weigh: measured on the H200, bench/NOTES.md), else a block per
        # query tile.
        tiles = -(-tq // spec.br) * heads * batch
        if 0 < sms < tiles and key_tiles(spec, tq, tk, window) <= PERSISTENT_MAX_KEY_TILES:
            return (sms, 1, 1)
        return (tiles, 1, 1)

    def check(self, spec: KernelSpec) -> list[str]:
        if spec.direction == "bwd":
            return wgmma_bwd.check(self, spec)
        p = self.tensor_core_rule(spec)
        if spec.d % 8 or not 8 <= spec.d <= 256:
            p.append(
                f"d={spec.d}: must be a multiple of 8 in [8, 256] for family wgmma (rows of "
                "16-byte multiples, as the TMA needs); try 128"
            )
        p += self.dv_rule(spec)
        if spec.br not in (64, 128, 192):
            p.append(
                f"br={spec.br}: must be 64, 128 or 192 for family wgmma (64 rows per consumer "
                "warpgroup); try 128"
            )
        if spec.bc % 16 or not 16 <= spec.bc <= 256:
            p.append(
                f"bc={spec.bc}: must be a multiple of 16 in [16, 256] for family wgmma; try 128"
            )
        if spec.br in (64, 128, 192) and spec.warps != self.default_warps(spec):
            p.append(
                f"warps={spec.warps}: family wgmma derives warps from br (4 * (br/64 + 1) = "
                f"{self.default_warps(spec)}); leave warps unset"
            )
        if spec.stages not in (2, 3, 4):
            p.append(f"stages={spec.stages}: K/V ring depth must be 2, 3 or 4; try 2")
        mods = sorted({"softcap", "alibi"} & set(spec.features))
        if spec.br == 192 and mods:
            # ptxas spills them (20-68 B; measured): 3 consumers get 160 registers each, and O,
            # S and P take ~128 of them before the score mod's constants
            p.append(
                f"features={','.join(mods)} with br=192: three consumer warpgroups have no "
                "registers for the score mod; use br=128"
            )
        if not p:
            budget = WGMMA_REGS[self.consumers(spec)][1]
            regs = self.register_estimate(spec)
            if regs > budget:
                p.append(
                    f"d={spec.d}, bc={spec.bc}, br={spec.br}: ~{regs} registers per consumer "
                    f"thread (dvp/2 + bc/2 + bc/4 + {WGMMA_INDEX_REGS}, dvp = dv rounded up to 64) "
                    f"exceed the {budget} "
                    f"that {self.consumers(spec)} consumer warpgroups get; lower bc or br"
                )
            p += self.smem_rule(
                spec,
                "2*(dp*(br + stages*bc) + dvp*stages*bc) + 1024 + barriers",
                "lower bc or stages",
            )
        return p

    def context(self, spec: KernelSpec) -> dict[str, Any]:
        if spec.direction == "bwd":
            return wgmma_bwd.context(self, spec)
        from .wgmma_ptx import Wgmma, wrappers

        mma_type = "bf16" if spec.dtype == "bf16" else "f16"
        qk = Wgmma(n=spec.bc, a_regs=False, trans_b=False, mma_type=mma_type)
        pv = Wgmma(n=self.dv_pad(spec), a_regs=True, trans_b=True, mma_type=mma_type)
        producer, consumer = WGMMA_REGS[self.consumers(spec)]
        return {
            "consumers": self.consumers(spec),
            "producer_regs": producer,
            "consumer_regs": consumer,
            "pack_type": "bf16x2" if spec.dtype == "bf16" else "f16x2",
            "qk_fn": qk.fn,
            "pv_fn": pv.fn,
            "wgmma_wrappers": wrappers([qk, pv]),
        }


FAMILIES: dict[str, Family] = {
    "simt": SimtFamily(
        name="simt",
        template="simt.cu.j2",
        archs=("sm_80", "sm_90"),
        knobs=(),
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
    ),
    "mma": MmaFamily(
        name="mma",
        template="mma.cu.j2",
        bwd_template="mma_bwd.cu.j2",
        # the forward's run-time features, and dQ without atomics (backward.py)
        bwd_features=frozenset({"deterministic", "window", "softcap", "alibi"}),
        archs=("sm_80", "sm_90"),
        knobs=(("warps", "w"), ("stages", "s")),
        features=frozenset({"window", "softcap", "alibi", "gqapack", "deterministic"}),
        # Gemma 2's sliding window with softcap, beside each feature alone; GQA decoding
        shipped_features=(
            ("window",), ("softcap",), ("alibi",), ("window", "softcap"), ("gqapack",),
        ),
        axes={
            "d": (32, 64, 96, 128, 256),
            "br": (64, 128),
            "bc": (32, 64, 128),
            "dtype": ("fp16", "bf16"),
            "causal": (False, True),
            "warps": (4, 8),
            "stages": (1, 2),
        },
    ),
    "wgmma": WgmmaFamily(
        name="wgmma",
        template="wgmma.cu.j2",
        # the backward: 64 query rows per step, 128 keys (two consumer warpgroups) per block;
        # the forward's run-time features, no deterministic mode (wgmma_bwd.py)
        bwd_template="wgmma_bwd.cu.j2",
        bwd_tile=wgmma_bwd.DEFAULT_TILE,
        bwd_features=frozenset({"window", "softcap", "alibi"}),
        archs=("sm_90a",),
        knobs=(("stages", "s"),),
        shipped_features=(("window",), ("softcap",), ("alibi",), ("window", "softcap")),
        axes={
            "d": (64, 128, 256),
            "br": (128, 192),
            "bc": (64, 128, 176),
            "dtype": ("fp16", "bf16"),
            "causal": (False, True),
            "warps": (0,),
            "stages": (2, 3),
        },
    ),
}


def family_of(name: str) -> Family:
    """Return the family called `name`; KeyError carries a message naming the choices."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(
            f"family={name!r}: unknown family; choose one of {', '.join(FAMILIES)}"
        ) from None
