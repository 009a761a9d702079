"""The tile policy: which family and tile serve a call, chosen from a pool of variants.

Pure functions of a candidate pool, no catalog: `space` uses them to decide where the shipped
feature variants go, `select` to pick among the shipped variants (or a family default,
compiled on demand). The default preference: the families in the order of their
`Family.preference.rank`, the first that runs on the GPU (compute capability within the
preference's range; tensor-core families only for fp16/bf16) and ships the head dim, at the
variant nearest its preferred tile (today wgmma 128x128 on Hopper, mma 128x64 from sm_80,
simt 32x32 otherwise). "Nearest" is the distance in log2 of
the tiles (a tile twice or half as large is one step), a stages mismatch half a step; ties go
to the earlier variant of the pool.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from flashgen.generator.dtypes import DTYPES
from flashgen.generator.families import FAMILIES, Family, Preference
from flashgen.generator.spec import KernelSpec


def preferences() -> list[Family]:
    """The families in default-dispatch order (`Family.preference.rank`)."""
    return sorted(FAMILIES.values(), key=lambda f: f.preference.rank)


_ARCH_RE = re.compile(r"sm_(\d+)[a-z]?")


def arch_major(arch: str) -> int:
    """Compute-capability major of an `sm_XY[a]` name: sm_80 -> 8, sm_90a -> 9, sm_100 -> 10."""
    m = _ARCH_RE.fullmatch(arch)
    if m is None:
        raise ValueError(f"arch={arch!r}: not an sm_XY name; e.g. sm_90")
    return int(m.group(1)) // 10


def distance(spec: KernelSpec, pref: Preference) -> float:
    """How far a tile is from a family's preferred one (log2 of the tile ratios + stages/2)."""
    return (
        abs(math.log2(spec.br / pref.br))
        + abs(math.log2(spec.bc / pref.bc))
        + 0.5 * abs(spec.stages - pref.stages)
    )


def choose(
    pool: Sequence[KernelSpec], d: int, dtype: str, causal: bool, major: int,
    aligned: Callable[[KernelSpec], bool], dv: int, *, on_demand: bool,
) -> KernelSpec | None:  # fmt: skip
    """The preferred variant for (d, dtype, causal, dv) on a GPU of compute capability
    `major`: the pool's nearest plain variant of the first family that applies; with
    `on_demand`, where the pool has none, d's tile with v's head dim or the family's default
    tile (compiled on demand). None when nothing serves."""
    for fam in preferences():
        pref = fam.preference
        runs_here = pref.min_major <= major <= pref.max_major
        if not runs_here or (fam.tensor_cores and not DTYPES[dtype].tensor_core):
            continue
        same_d = [
            s
            for s in pool
            if s.family == fam.name and s.d == d and s.dtype == dtype and s.causal == causal
            and not s.features and aligned(s)
        ]  # fmt: skip
        fits = [s for s in same_d if s.dv == dv]
        if fits:
            return min(fits, key=lambda s: distance(s, pref))  # min keeps the first of ties
        if not on_demand:
            continue
        if same_d:  # a dv nothing ships: d's tile with v's head dim, compiled on demand
            best = _with(min(same_d, key=lambda s: distance(s, pref)), dv=dv)
            if best is not None:
                return best
        try:  # a head dim nothing ships: the family's default tile for it, compiled on demand
            fresh: KernelSpec | None = KernelSpec(
                family=fam.name, d=d, dv=dv, dtype=dtype, causal=causal
            )
        except ValueError:
            fresh = None
        if fresh is not None and aligned(fresh):
            return fresh
        # the default tile does not take this d (simt fp32 at d >= 200) or does not fit the
        # GPU: the shipped tiles of the nearest head dims, retried at this one
        near = [
            s for s in pool
            if s.family == fam.name and s.dtype == dtype and s.causal == causal and not s.features
        ]  # fmt: skip
        for s in sorted(near, key=lambda s: (abs(s.d - d), distance(s, pref))):
            tile = _with(s, d=d, dv=dv)
            if tile is not None and aligned(tile):
                return tile
    return None


def feature_variant(plain: KernelSpec, feats: tuple[str, ...]) -> KernelSpec | None:
    """`plain` compiled with features `feats`: the same tile, or where the features do not fit
    it (wgmma br=192 has no registers for a score mod) the family's default tile; None if
    neither takes them."""
    same = _with(plain, features=feats)
    if same is not None:
        return same
    try:
        default = KernelSpec(
            family=plain.family, d=plain.d, dv=plain.dv, dtype=plain.dtype, causal=plain.causal,
            direction=plain.direction,
        )  # fmt: skip
    except ValueError:
        return None
    return _with(default, features=feats)


def _with(spec: KernelSpec | None, **changes: object) -> KernelSpec | None:
    """`spec` with some fields changed (features, dv); None if that is not a valid spec."""
    if spec is None or all(getattr(spec, k) == v for k, v in changes.items()):
        return spec
    try:
        return spec.replace(**changes)
    except ValueError:
        return None
