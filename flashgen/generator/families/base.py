"""The family base: the rules and derived values every kernel family shares.

A family is a small object, not a subclass tree: `check(spec)` lists every broken rule as
"value: rule; fix", and the derived values (warps, shared memory) are plain functions of the
spec, so nothing is stored twice. Each family is a folder beside this file (its forward and
backward rules, its template values) and one line of the registry in `__init__.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flashgen.generator.abi import Param
from flashgen.generator.arch import ARCHS
from flashgen.generator.features import TOKENS
from flashgen.generator.schedulers import SINGLE_TILE, Scheduler

if TYPE_CHECKING:
    from flashgen.generator.spec import KernelSpec


def _pick(values: list[int], ok: Any) -> str:
    good = [str(v) for v in values if ok(v)]
    return " or ".join(good[:3]) if good else "another value"


@dataclass(frozen=True)
class Preference:
    """Where a family stands in the default dispatch, and the tile it is best at when nothing
    better is known (`policy.choose`: lowest `rank` first among the families that apply)."""

    rank: int
    br: int
    bc: int
    stages: int
    min_major: int  # oldest GPU generation the family runs on (compute capability major)
    max_major: int = 99  # newest generation (wgmma is Hopper-only: sm_90a code runs on 9.0)


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
    # (every run-time feature: each family's templates carry every feature's hook)
    features: frozenset[str] = frozenset(TOKENS)
    # the feature sets shipped (compiled ahead) at the default and tuned tiles; any other
    # combination is compiled on demand
    shipped_features: tuple[tuple[str, ...], ...] = (("window",), ("softcap",), ("alibi",))
    preference: Preference = Preference(rank=99, br=128, bc=64, stages=2, min_major=8)
    # tensor-core math (16-bit operands only, fp32 accumulation); False: CUDA cores, fp32
    tensor_cores: bool = True
    # its forward kernels take TMA tensor maps (a bundle's launcher encodes them)
    tensor_maps: bool = False
    # the module that registers the builders of its kernels' leading by-value arguments
    # (runtime.launch / runtime.backward import it on the family's first launch); "" = none
    host_provider: str = ""
    # by-value kernel arguments ahead of the ABI every family shares (generator/abi.py), forward
    # and backward: the Hopper tensor maps
    fwd_prefix: tuple[Param, ...] = ()
    bwd_prefix: tuple[Param, ...] = ()
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
    # the backward variants shipped (compiled ahead, `space.shipped(direction="bwd")`) at the
    # backward's default tile: the axes multiplied out ({}: none ship; any valid backward spec
    # still compiles on demand)
    bwd_axes: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # the decode kernel (direction "decode": a few query rows per sequence against a K/V cache,
    # contiguous or paged, keys split across blocks): its template ("" = none), the (br, bc) a
    # decode spec that names no tiles gets (br: packed rows of a GQA group, bc: keys per warp
    # tile) and the feature tokens it supports
    decode_template: str = ""
    decode_tile: tuple[int, int] = (16, 32)
    decode_features: frozenset[str] = frozenset()
    # the backward's fp32 scratch covers whole query tiles (its main kernel reads LSE and D and
    # adds into the dQ accumulator a tile at a time): generator/backward.py `scratch_rows`
    bwd_whole_tiles: bool = False
    # how its deterministic backward fixes the order of dQ's sums (generator/backward.py):
    # False, a kernel of its own computes dQ a query tile at a time (no accumulator); True,
    # the main kernel's blocks add into the accumulator in a fixed order, one after another
    # per query tile, through semaphores the scratch holds after the accumulator
    bwd_ordered_dq: bool = False

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

    def default_bwd_tile(
        self, d: int, features: tuple[str, ...], stages: int = 0
    ) -> tuple[int, int]:
        """(br, bc) for a backward spec that names no tiles: `bwd_tile`, whatever d, the
        features and the stages named (0: none; a family whose best tile depends on them
        overrides this)."""
        return self.bwd_tile

    def default_warps(self, spec: KernelSpec) -> int:
        """The warps a spec gets when it does not name them."""
        raise NotImplementedError

    def align_elems(self, spec: KernelSpec) -> int:
        """Elements every base pointer and token/head/batch stride must be a multiple of."""
        return 1

    def default_stages(self, spec: KernelSpec) -> int:
        """The pipeline stages a spec gets when it does not name them."""
        raise NotImplementedError

    def scheduler(self, spec: KernelSpec) -> Scheduler:
        """The forward's tile scheduler (generator/schedulers.py): which work item each block
        takes, its launch grid and the device code the template includes. Here a block per
        (query tile, head, batch); GQAPACK variants a block per tile of packed rows of one
        K/V head. (The backward's grids are runtime/backward.py's.)"""
        return SINGLE_TILE

    def serves_backward(
        self, major: int, d: int, dv: int, dtype: str, deterministic: bool, strided: bool
    ) -> bool:
        """Whether this family's backward takes a call on a GPU of compute capability `major`
        (`select.backward_family`): it has one, runs on that generation, and has a
        deterministic mode when asked. `strided`: every axis longer than 1 has a non-zero
        stride (what a TMA can step)."""
        pref = self.preference
        return (
            bool(self.bwd_template)
            and pref.min_major <= major <= pref.max_major
            and (not deterministic or "deterministic" in self.bwd_features)
        )

    def check(self, spec: KernelSpec) -> list[str]:
        """Every broken rule as 'value: rule; fix' (empty when the spec is valid)."""
        raise NotImplementedError

    def smem_bytes(self, spec: KernelSpec) -> int:
        """Dynamic shared memory one block needs."""
        raise NotImplementedError

    def context(self, spec: KernelSpec) -> dict[str, Any]:
        """Family-specific values handed to the template (all derived in Python)."""
        return {}

    def fwd_prefix_of(self, spec: KernelSpec) -> tuple[Param, ...]:
        """The leading by-value parameters of `spec`'s forward kernel: `fwd_prefix`, unless
        the variant takes more (wgmma's O tensor map, O_TMA_STORE)."""
        return self.fwd_prefix

    def bwd_dq_regions(self, spec: KernelSpec) -> int:
        """With `bwd_ordered_dq`: the column ranges of a query tile's dQ whose adds are ordered
        separately (a semaphore each per query tile)."""
        return 1

    def bwd_dq_smem_bytes(self, spec: KernelSpec) -> int:
        """Dynamic shared memory of a deterministic backward's dQ kernel (0: none)."""
        return 0

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
