"""Family mma: FlashAttention-2 on mma.sync tensor cores (templates/mma.cu.j2); its backward's
rules are `bwd.py` (templates/mma_bwd.cu.j2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flashgen.generator.families.base import Family, Preference, _pick
from flashgen.generator.families.mma import bwd, decode
from flashgen.generator.features import TOKENS

if TYPE_CHECKING:
    from flashgen.generator.spec import KernelSpec

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


@dataclass(frozen=True)
class MmaFamily(Family):
    """FlashAttention-2 on mma.sync tensor cores: each warp owns 16 or 32 query rows.

    A backward spec (direction "bwd") takes its rules and sizes from `bwd.py` beside this file.
    """

    def default_warps(self, spec: KernelSpec) -> int:
        if spec.direction == "bwd":
            return bwd.default_warps(spec)
        if spec.direction == "decode":
            return decode.default_warps(spec)
        return max(1, spec.br // 16)

    def d_pad(self, spec: KernelSpec) -> int:
        # m16n8k16: Q K^T takes the head dim in k-steps of 16
        return -(-spec.d // 16) * 16

    def dv_pad(self, spec: KernelSpec) -> int:
        # P V's columns go through ldmatrix.trans 16 at a time
        return -(-spec.dv // 16) * 16

    def default_stages(self, spec: KernelSpec) -> int:
        if spec.direction == "bwd":
            return bwd.default_stages(spec)
        if spec.direction == "decode":
            return decode.default_stages(self, spec)
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

    def bwd_dq_smem_bytes(self, spec: KernelSpec) -> int:
        return bwd.dq_smem_bytes(spec)

    def qk_chains(self, spec: KernelSpec) -> int:
        """Independent fp32 accumulator sets for S = Q K^T (more = shorter rounding chains)."""
        return 2 if spec.d >= MMA_SPLIT_QK_FROM_D else 1

    def min_blocks(self, spec: KernelSpec) -> int:
        if spec.direction == "bwd":
            return bwd.min_blocks(spec)
        if spec.direction == "decode":
            return 1
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
            return bwd.smem_bytes(spec, stages)
        if spec.direction == "decode":
            return decode.smem_bytes(spec, stages)
        n = spec.stages if stages is None else stages
        item = spec.dtype_info.itemsize
        qk_row = (self.d_pad(spec) + MMA_ROW_PAD) * item  # Q and K rows
        v_row = (self.dv_pad(spec) + MMA_ROW_PAD) * item
        return qk_row * (spec.br + n * spec.bc) + v_row * n * spec.bc

    def check(self, spec: KernelSpec) -> list[str]:
        if spec.direction == "bwd":
            return self.tensor_core_rule(spec) + bwd.check(self, spec)
        if spec.direction == "decode":
            return self.tensor_core_rule(spec) + decode.check(self, spec)
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
            return bwd.context(self, spec)
        if spec.direction == "decode":
            return decode.context(spec)
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


MMA = MmaFamily(
    name="mma",
    template="mma.cu.j2",
    preference=Preference(rank=1, br=128, bc=64, stages=2, min_major=8),
    bwd_template="mma_bwd.cu.j2",
    decode_template="mma_decode.cu.j2",
    decode_tile=(16, 16),
    decode_features=frozenset(TOKENS),
    # the forward's run-time features, dQ without atomics (backward.py), and user hooks
    # (features/hook.py; templates/mma_bwd.cu.j2)
    bwd_features=frozenset({"deterministic", *TOKENS, "scoremod", "maskmod"}),
    # shipped: the head dims and dtypes training uses most, in the fast mode (dQ by fp32
    # atomics) and the deterministic one (bit-identical gradients)
    bwd_axes={
        "d": (64, 128),
        "dtype": ("fp16", "bf16"),
        "causal": (False, True),
        "features": ((), ("deterministic",)),
    },
    archs=("sm_80", "sm_90"),
    knobs=(("warps", "w"), ("stages", "s")),
    # scoremod / maskmod: user hooks in the forward (features/hook.py; templates/mma.cu.j2)
    features=frozenset({*TOKENS, "gqapack", "deterministic", "scoremod", "maskmod"}),
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
)
