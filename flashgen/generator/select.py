"""Pick a shipped variant for a call: (d, dtype, causal, arch) -> KernelSpec.

A tuning table for the GPU (`tuning.lookup`, by GPU name) wins when it has an entry. Otherwise
the default preference:
- the `wgmma` family on Hopper (sm_90) when the dtype is fp16/bf16 and `wgmma` ships that d:
  br=128, bc=128, stages=2, else the nearest shipped `wgmma` variant;
- the `mma` family when the dtype is fp16/bf16, the GPU is sm_80 or newer and `mma` ships
  that d: br=128, bc=64, stages=2, else the shipped `mma` variant nearest to that;
- otherwise the `simt` family: br=32, bc=32, else the nearest shipped tile.
"Nearest" is the distance in log2 of the tiles (a tile twice or half as large is one step), with
a stages mismatch counting half a step; ties go to the earlier variant in `shipped()` order.

Features (`features`: the tokens the call uses) pick a variant compiled with exactly those: the
shipped one when there is one, else the variant chosen as above with the features added. A
head dim nothing ships (d = 80, ...) gets the family's default tile for it. Such a spec is
compiled on demand (and cached) like any other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .dtypes import DTYPES
from .space import shipped
from .spec import KernelSpec


@dataclass(frozen=True)
class Preference:
    """The tile shape a family is best at when nothing better is known."""

    family: str
    br: int
    bc: int
    stages: int
    min_major: int  # oldest GPU generation the family runs on (compute capability major)
    tensor_core_only: bool
    max_major: int = 99  # newest generation (wgmma is Hopper-only: sm_90a code runs on 9.0)


# In order: the first family that applies and ships the head dim wins.
PREFERENCES: tuple[Preference, ...] = (
    Preference("wgmma", br=128, bc=128, stages=2, min_major=9, tensor_core_only=True, max_major=9),
    Preference("mma", br=128, bc=64, stages=2, min_major=8, tensor_core_only=True),
    Preference("simt", br=32, bc=32, stages=1, min_major=0, tensor_core_only=False),
)

_ARCH_RE = re.compile(r"sm_(\d+)[a-z]?")


def arch_major(arch: str) -> int:
    """Compute-capability major of an `sm_XY[a]` name: sm_80 -> 8, sm_90a -> 9, sm_100 -> 10."""
    m = _ARCH_RE.fullmatch(arch)
    if m is None:
        raise ValueError(f"arch={arch!r}: not an sm_XY name; e.g. sm_90")
    return int(m.group(1)) // 10


def _distance(spec: KernelSpec, pref: Preference) -> float:
    return (
        abs(math.log2(spec.br / pref.br))
        + abs(math.log2(spec.bc / pref.bc))
        + 0.5 * abs(spec.stages - pref.stages)
    )


def select(
    d: int,
    dtype: str,
    causal: bool,
    arch: str,
    *,
    alignment: int | None = None,
    candidates: Sequence[KernelSpec] | None = None,
    gpu_name: str | None = None,
    features: tuple[str, ...] = (),
    dv: int | None = None,
    kv_group: int = 1,
    tq: int | None = None,
    kv_heads: int | None = None,
) -> KernelSpec:
    """The variant to run for this call; ValueError naming what is shipped when none fits.

    `alignment` is the element alignment the problem's strides and pointers allow (None: any);
    a variant that needs more is skipped. `candidates` replaces `shipped()` (and then no tuning
    table is read and nothing is generated on demand); `gpu_name` (e.g. 'NVIDIA H200') names
    the tuning table to consult. `features` are the feature tokens the call uses: the variant
    is the plain choice compiled with them (features never change the tile). `dv` is the
    value head dim (None: d); a dv nothing ships takes the tile of d's choice. `kv_group`
    (query heads per K/V head), `tq` (query length) and `kv_heads` (batch x K/V heads) let
    grouped-query calls with short queries take family mma's `gqapack` variant (`packs_gqa`),
    whose tiles hold the query heads of one K/V head, so K and V are read once per group.
    """
    feats = tuple(features)
    packed = None
    if packs_gqa(kv_group, tq, kv_heads) and candidates is None:
        packed = _gqapack(d, dtype, causal, arch, alignment, dv or d, feats)
    if packed is not None:
        return packed
    plain = _select_plain(d, dtype, causal, arch, alignment, candidates, gpu_name, dv or d)
    if not feats:
        return plain
    want = feature_variant(plain, feats)
    if want is None or (candidates is not None and want not in candidates):
        raise ValueError(
            f"d={d}, dtype={dtype}, causal={causal}, features={','.join(feats)}, arch={arch}: "
            f"no variant fits; {plain.name} serves the call without features, and "
            + (
                "the candidates hold no variant of it with them; add one"
                if want is not None
                else f"family {plain.family} cannot compile it with them"
            )
        )
    return want


GQAPACK_MAX_TQ = 16
"""Grouped-query calls with at most this many query tokens may take the `gqapack` variant..."""
GQAPACK_MIN_KV_HEADS = 128
"""... when their packed grid (batch x K/V heads blocks) fills the GPU (H200: 132 SMs)."""


def packs_gqa(kv_group: int, tq: int | None, kv_heads: int | None) -> bool:
    """Whether a call of this shape takes a `gqapack` variant (where one fits)."""
    return (
        kv_group > 1 and tq is not None and tq <= GQAPACK_MAX_TQ
        and kv_heads is not None and kv_heads >= GQAPACK_MIN_KV_HEADS
    )  # fmt: skip


def _gqapack(
    d: int, dtype: str, causal: bool, arch: str, alignment: int | None, dv: int,
    feats: tuple[str, ...],
) -> KernelSpec | None:
    """Family mma's plain choice with `gqapack` added; None where it cannot serve."""
    if (
        "alibi" in feats or dtype not in DTYPES or not DTYPES[dtype].tensor_core
        or arch_major(arch) < 8
    ):  # fmt: skip
        return None
    pool = [s for s in shipped() if s.family == "mma"]
    plain: KernelSpec | None
    try:
        plain = _select_plain(d, dtype, causal, arch, alignment, pool, None, dv)
    except ValueError:  # no mma variant of this d ships: the family default, on demand
        plain = _with(KernelSpec(family="mma", d=d, dtype=dtype, causal=causal), dv=dv)
    return _with(plain, features=(*feats, "gqapack"))


def _select_plain(
    d: int,
    dtype: str,
    causal: bool,
    arch: str,
    alignment: int | None,
    candidates: Sequence[KernelSpec] | None,
    gpu_name: str | None,
    dv: int,
) -> KernelSpec:
    """`select` without features: tuned, shipped, or (no candidates) the family default tile."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: unknown dtype; choose one of {', '.join(DTYPES)}")
    major = arch_major(arch)

    def aligned(s: KernelSpec) -> bool:
        return alignment is None or alignment % s.align_elems == 0

    if gpu_name is not None and candidates is None:
        from .tuning import lookup

        tuned = _with(lookup(gpu_name, d, dtype, causal), dv=dv)
        if tuned is not None and aligned(tuned):
            return tuned
    pool = list(shipped()) if candidates is None else list(candidates)
    for pref in PREFERENCES:
        runs_here = pref.min_major <= major <= pref.max_major
        if not runs_here or (pref.tensor_core_only and not DTYPES[dtype].tensor_core):
            continue
        same_d = [
            s
            for s in pool
            if s.family == pref.family and s.d == d and s.dtype == dtype and s.causal == causal
            and not s.features and aligned(s)
        ]  # fmt: skip
        fits = [s for s in same_d if s.dv == dv]
        if fits:
            return min(fits, key=lambda s: _distance(s, pref))  # min keeps the first of ties
        if candidates is not None:
            continue
        if same_d:  # a dv nothing ships: d's tile with v's head dim, compiled on demand
            best = _with(min(same_d, key=lambda s: _distance(s, pref)), dv=dv)
            if best is not None:
                return best
        try:  # a head dim nothing ships: the family's default tile for it, compiled on demand
            fresh = KernelSpec(family=pref.family, d=d, dv=dv, dtype=dtype, causal=causal)
        except ValueError:
            continue
        if aligned(fresh):
            return fresh
    dims = sorted({s.d for s in pool if s.dtype == dtype})
    raise ValueError(
        f"d={d}, dtype={dtype}, causal={causal}, arch={arch}: no variant fits; "
        f"shipped head dims for {dtype} are {dims} (any multiple of 8 up to 256 is generated "
        "on demand): pad d to a multiple of 8, or generate one with `flashgen build` and pass "
        "it as spec="
    )


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
