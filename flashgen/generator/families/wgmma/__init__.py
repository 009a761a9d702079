"""Family wgmma: FlashAttention-3 on Hopper (templates/wgmma.cu.j2); its backward's rules are
`bwd.py` (templates/wgmma_bwd.cu.j2), its wgmma PTX wrappers `ptx.py`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flashgen.generator.abi import Param, tensor_map
from flashgen.generator.families.base import Family, Preference
from flashgen.generator.families.wgmma import bwd as wgmma_bwd
from flashgen.generator.features import TOKENS
from flashgen.generator.features.hook import hook_tokens, token_kind
from flashgen.generator.schedulers import STATIC_PERSISTENT, VARLEN_PERSISTENT, Scheduler

if TYPE_CHECKING:
    from flashgen.generator.spec import KernelSpec

# wgmma: registers per thread after setmaxnreg, by consumer warpgroups. The 65,536 registers
# of an SM go to one block: 128 * (producer + consumers * consumer) must fit.
WGMMA_REGS = {1: (56, 240), 2: (24, 240), 3: (32, 160)}  # consumers -> (producer, consumer)
# Registers a consumer thread needs beyond its accumulators: descriptors, indices, softmax state.
WGMMA_INDEX_REGS = 32
# Bytes of the dynamic shared memory spent on aligning the base to a swizzle atom.
WGMMA_SMEM_ALIGN = 1024
# varlen: at most this many sequences are ordered longest first in shared memory (a rank per
# sequence, quadratic in their number); more are walked in the order given.
VARLEN_SORT_MAX = 256
# varlen: the work ring through which the scheduler thread hands each item it draws to the load
# issuer and the consumers (templates/wgmma.cu.j2): slots, words per slot (a Work's 7 ints,
# padded to 16 bytes), and the bytes of shared memory it takes beside the sequences' order
# (the slots and a full and an empty mbarrier per slot). One slot: an item is drawn once the
# issuer has issued the last one's loads (about two key tiles before the block needs it) and
# the consumers have read it; two would draw a whole item earlier (hiding the atomic's latency
# behind more work, but committing items to blocks earlier, which is what a dynamic scheduler
# avoids at the end).
VARLEN_WORK_SLOTS = 1
VARLEN_WORK_INTS = 8
VARLEN_WORK_BYTES = VARLEN_WORK_SLOTS * (2 * 8 + 4 * VARLEN_WORK_INTS)
# The forward's O through shared memory and TMA stores (templates/wgmma.cu.j2, O_TMA_STORE) for
# the unhooked forwards (dense and varlen) whose staging fits; "0" in this variable keeps the
# register-to-global epilogue everywhere (the renders of the tree without it).
O_TMA_STORE_ENV = "FLASHGEN_WGMMA_O_TMA"


@dataclass(frozen=True)
class WgmmaFamily(Family):
    """FlashAttention-3 on Hopper: TMA + mbarrier ring, a producer warpgroup, 64-row consumers.

    A backward spec (direction "bwd") takes its rules and sizes from `bwd.py` beside this file.
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

    def default_bwd_tile(
        self, d: int, features: tuple[str, ...], stages: int = 0
    ) -> tuple[int, int]:
        return wgmma_bwd.default_tile(d, features, stages)

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

    def _fwd_smem(self, spec: KernelSpec) -> int:
        """The forward's shared memory without O's staging (O_TMA_STORE)."""
        dp, dvp = self.d_pad(spec), self.dv_pad(spec)
        tiles = spec.dtype_info.itemsize * (
            dp * (spec.br + spec.stages * spec.bc) + dvp * spec.stages * spec.bc
        )
        # varlen: the sequences' order and the work ring
        order = 4 * VARLEN_SORT_MAX + VARLEN_WORK_BYTES if "varlen" in spec.features else 0
        return WGMMA_SMEM_ALIGN + tiles + 8 * (2 + 4 * spec.stages) + order

    def o_stage_bytes(self, spec: KernelSpec) -> int:
        """O's staging for the TMA store: BR rows of DVP columns (each consumer's 64 rows)."""
        return spec.dtype_info.itemsize * spec.br * self.dv_pad(spec)

    def o_tma_store(self, spec: KernelSpec) -> bool:
        """Whether the forward writes O through shared memory and TMA stores (a fourth tensor
        map, tm_o): unhooked forwards (hooked variants keep their renders), and only where the
        staging fits the block's shared memory (not d 128 at 3 stages or bc 176, nor d 256;
        varlen: the same, its sequences' order included in `_fwd_smem`). A varlen kernel
        stores only the 64-row blocks wholly inside their sequence so (a box must not run
        into the next sequence's rows) and writes the others from the registers."""
        if os.environ.get(O_TMA_STORE_ENV, "1") == "0" or spec.direction != "fwd":
            return False
        if not isinstance(spec.features, (tuple, list)):
            return False
        if hook_tokens(spec.features):
            return False
        return self._fwd_smem(spec) + self.o_stage_bytes(spec) <= self.smem_limit()

    def fwd_prefix_of(self, spec: KernelSpec) -> tuple[Param, ...]:
        # O_TMA_STORE: O's tensor map after V's, ahead of the heads and batch
        if self.o_tma_store(spec):
            return (*self.fwd_prefix[:3], tensor_map("tm_o"), *self.fwd_prefix[3:])
        return self.fwd_prefix

    def smem_bytes(self, spec: KernelSpec) -> int:
        if spec.direction == "bwd":
            return wgmma_bwd.smem_bytes(spec)
        stage = self.o_stage_bytes(spec) if self.o_tma_store(spec) else 0
        return self._fwd_smem(spec) + stage

    def scheduler(self, spec: KernelSpec) -> Scheduler:
        # persistent blocks over a one-dimensional grid (the kernel takes the heads and batch);
        # packed sequences: the same over each sequence's own query tiles
        return VARLEN_PERSISTENT if "varlen" in spec.features else STATIC_PERSISTENT

    def serves_backward(
        self, major: int, d: int, dv: int, dtype: str, deterministic: bool, strided: bool
    ) -> bool:
        # its backward's rules (bwd.py): d a multiple of 8 up to 128, dv = d, 16-bit storage,
        # and TMA-loadable strides (the deterministic mode too: `Family.bwd_ordered_dq`)
        return (
            super().serves_backward(major, d, dv, dtype, deterministic, strided)
            and wgmma_bwd.takes_head_dim(d) and dv == d and dtype in ("fp16", "bf16") and strided
        )  # fmt: skip

    def bwd_dq_regions(self, spec: KernelSpec) -> int:
        return wgmma_bwd.dq_regions(spec)

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
        p += self.hook_rule(spec)
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

    def hook_rule(self, spec: KernelSpec) -> list[str]:
        """What a hooked forward or backward (features/hook.py; templates/wgmma.cu.j2,
        wgmma_bwd.cu.j2) refuses beyond the rules every family shares (spec.py
        `_check_hooks`): packed sequences, and a score_mod at (forward) br=192, whose
        consumers have no registers to spare for one (as for the built-in mods)."""
        hooks = hook_tokens(spec.features) if isinstance(spec.features, (tuple, list)) else ()
        if not hooks:
            return []
        p = []
        if "varlen" in spec.features:
            where = "backward" if spec.direction == "bwd" else "forward"
            p.append(
                f"features: varlen with {', '.join(hooks)}: family wgmma's packed-sequence "
                f"{where} takes no hooks yet (a hook's b and q_idx/kv_idx would have to be the "
                "sequence's); drop the hook, or run the sequences as a padded batch"
            )
        if spec.br == 192 and any(token_kind(t) == "scoremod" for t in hooks):
            # 160 registers per consumer thread, ~128 of them O, S and P at d 64: the built-in
            # softcap and ALiBi spill there, and so would a score_mod. A mask_mod is taken: some
            # fit (ptxas 13.0, d 64 bc 128: causal_hook, document_hook, prefix_lm_hook
            # non-causal), others spill (window_hook 40-108 B, prefix_lm_hook 124 B causal),
            # which the torch front door reads from ptxas' report before it picks the tile
            # (hooked._forward_spec)
            p.append(
                "features: a scoremod hook with br=192: three consumer warpgroups have no "
                "registers to spare for a score_mod (the built-in softcap and ALiBi spill there "
                "too); use br=128"
            )
        return p

    def context(self, spec: KernelSpec) -> dict[str, Any]:
        if spec.direction == "bwd":
            return wgmma_bwd.context(self, spec)
        from flashgen.generator.families.wgmma.ptx import Wgmma, wrappers

        mma_type = "bf16" if spec.dtype == "bf16" else "f16"
        qk = Wgmma(n=spec.bc, a_regs=False, trans_b=False, mma_type=mma_type)
        pv = Wgmma(n=self.dv_pad(spec), a_regs=True, trans_b=True, mma_type=mma_type)
        producer, consumer = WGMMA_REGS[self.consumers(spec)]
        return {
            "consumers": self.consumers(spec),
            "producer_regs": producer,
            "consumer_regs": consumer,
            "pack_type": "bf16x2" if spec.dtype == "bf16" else "f16x2",
            "varlen_sort_max": VARLEN_SORT_MAX,
            "varlen_work_slots": VARLEN_WORK_SLOTS,
            "varlen_work_ints": VARLEN_WORK_INTS,
            "o_tma_store": self.o_tma_store(spec),
            "qk_fn": qk.fn,
            "pv_fn": pv.fn,
            "wgmma_wrappers": wrappers([qk, pv]),
        }


WGMMA = WgmmaFamily(
    name="wgmma",
    template="wgmma.cu.j2",
    preference=Preference(rank=0, br=128, bc=128, stages=2, min_major=9, max_major=9),
    tensor_maps=True,
    host_provider="flashgen.runtime.tma",
    # Q with BR-row boxes, K and V with BC-row boxes (64 columns each, 128-byte swizzle; V's
    # innermost dimension is DV), then the problem's heads and batch (a one-dimensional grid)
    fwd_prefix=(
        tensor_map("tm_q"), tensor_map("tm_k"), tensor_map("tm_v"),
        Param("n_heads", "int", "i", "size"), Param("n_batch", "int", "i", "size"),
    ),
    bwd_prefix=(tensor_map("tm_q"), tensor_map("tm_k"), tensor_map("tm_v"), tensor_map("tm_do")),
    # the backward: 64 query rows per step, 128 keys (two consumer warpgroups) per block;
    # the forward's run-time features, the deterministic mode (dQ's adds ordered by
    # semaphores: bwd_ordered_dq; not with hooks or varlen: bwd.py); user hooks as in the
    # forward (templates/wgmma_bwd.cu.j2; not with varlen: `hook_rule`)
    bwd_template="wgmma_bwd.cu.j2",
    bwd_tile=wgmma_bwd.DEFAULT_TILE,
    bwd_features=frozenset({*TOKENS, "varlen", "scoremod", "maskmod", "deterministic"}),
    bwd_ordered_dq=True,
    # scoremod / maskmod: user hooks in the forward (features/hook.py; templates/wgmma.cu.j2;
    # not with varlen, nor at br 192: `hook_rule`)
    features=frozenset({*TOKENS, "varlen", "scoremod", "maskmod"}),
    bwd_whole_tiles=True,
    # shipped at the default tile (br 64, bc 128) and stages (3 at d 64, 2 at d 128), fast and
    # deterministic
    bwd_axes={
        "d": (64, 128),
        "dtype": ("fp16", "bf16"),
        "causal": (False, True),
        "features": ((), ("deterministic",)),
    },
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
)
