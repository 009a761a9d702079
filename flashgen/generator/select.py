"""Pick a shipped variant for a call: (d, dtype, causal, arch) -> KernelSpec.

A tuning table for the GPU (`lookup`, by GPU name) wins when it has an entry. Otherwise the
default preference of `policy.choose` over the shipped variants (`space.shipped()` order).

Features (`features`: the tokens the call uses) pick a variant compiled with exactly those: the
shipped one when there is one, else the variant chosen as above with the features added. A
head dim nothing ships (d = 80, ...) gets the family's default tile for it. Such a spec is
compiled on demand (and cached) like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flashgen.generator.arch import smem_per_block
from flashgen.generator.dtypes import DTYPES
from flashgen.generator.families import FAMILIES, family_of
from flashgen.generator.policy import _with, arch_major, choose, distance, feature_variant
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.generator.tables import arch_table, entry_key, load_table


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
    if want is not None and candidates is None and want.smem_bytes > smem_per_block(arch):
        want = _fitting_feature_variant(plain, feats, arch, alignment)
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


def _fitting_feature_variant(
    plain: KernelSpec, feats: tuple[str, ...], arch: str, alignment: int | None
) -> KernelSpec | None:
    """Where `feature_variant` falls back to a tile the GPU's shared memory cannot hold (its
    family default on sm_86/89/120), the shipped tile of the same key nearest the family's
    preference that takes the features and fits; None if none does."""
    room = smem_per_block(arch)
    pref = family_of(plain.family).preference
    same = [
        s for s in shipped()
        if s.family == plain.family and (s.d, s.dv, s.dtype, s.causal)
        == (plain.d, plain.dv, plain.dtype, plain.causal) and not s.features
    ]  # fmt: skip
    for s in sorted(same, key=lambda s: distance(s, pref)):
        v = _with(s, features=feats)
        if (
            v is not None and v.smem_bytes <= room
            and (alignment is None or alignment % v.align_elems == 0)
        ):  # fmt: skip
            return v
    return None


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
    """The plain choice of the family that packs GQA heads (its `features` hold `gqapack`),
    with `gqapack` added; None where it cannot serve."""
    if (
        "alibi" in feats or dtype not in DTYPES or not DTYPES[dtype].tensor_core
        or arch_major(arch) < 8
    ):  # fmt: skip
        return None
    packer = next(f.name for f in FAMILIES.values() if "gqapack" in f.features)
    pool = [s for s in shipped() if s.family == packer]
    plain: KernelSpec | None
    try:
        plain = _select_plain(d, dtype, causal, arch, alignment, pool, None, dv)
    except ValueError:  # no variant of this d ships: the family default, on demand
        plain = _with(KernelSpec(family=packer, d=d, dtype=dtype, causal=causal), dv=dv)
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
    room = smem_per_block(arch)

    def aligned(s: KernelSpec) -> bool:
        # the call's alignment, and the GPU's shared memory per block: sm_86/89/120 give a
        # block 99 KiB where the families' shipped tiles may take up to sm_80's 163 KiB
        return (alignment is None or alignment % s.align_elems == 0) and s.smem_bytes <= room

    if gpu_name is not None and candidates is None:
        tuned = _with(lookup(gpu_name, d, dtype, causal, arch), dv=dv)
        if tuned is not None and aligned(tuned):
            return tuned
    pool = list(shipped()) if candidates is None else list(candidates)
    found = choose(pool, d, dtype, causal, major, aligned, dv, on_demand=candidates is None)
    if found is not None:
        return found
    dims = sorted({s.d for s in pool if s.dtype == dtype})
    why = ""
    if candidates is None and d % 8 == 0 and 8 <= d <= 256:
        # a head dim the families' rules refuse for this dtype (simt fp32 holds d <= 224 in
        # registers): say which rule, not "pad d"
        try:
            KernelSpec(d=d, dv=dv, dtype=dtype, causal=causal)
        except ValueError as exc:
            why = f" ({exc}); fp16 or bf16 run every d up to 256"
    raise ValueError(
        f"d={d}, dtype={dtype}, causal={causal}, arch={arch}: no variant fits{why}; "
        f"shipped head dims for {dtype} are {dims} (any multiple of 8 up to 256 is generated "
        "on demand for fp16/bf16): pad d to a multiple of 8, or generate one with `flashgen "
        "build` and pass it as spec="
    )


def backward_family(
    arch: str, d: int, dv: int, dtype: str, *, deterministic: bool = False,
    strided: bool = True, tensor_maps: bool = True,
) -> str:  # fmt: skip
    """The family whose backward a call runs on GPU `arch`: the best-ranked family
    (`Preference.rank`) whose backward takes it (`Family.serves_backward`); `tensor_maps=False`
    leaves out the families whose kernels take TMA descriptors (FLASHGEN_WGMMA_BWD=0).
    Window, softcap and ALiBi do not enter the choice: every backward takes them."""
    major = arch_major(arch)
    fits = [
        f for f in FAMILIES.values()
        if f.serves_backward(major, d, dv, dtype, deterministic, strided)
        and (tensor_maps or not f.tensor_maps)
    ]  # fmt: skip
    if not fits:
        raise ValueError(
            f"arch={arch} d={d} dv={dv} dtype={dtype} deterministic={deterministic}: no family's "
            "backward takes this call; see docs/usage.md (training) for what the backward serves"
        )
    return min(fits, key=lambda f: f.preference.rank).name


def lookup(
    gpu_name: str, d: int, dtype: str, causal: bool, arch: str | None = None
) -> KernelSpec | None:
    """The tuned variant for this GPU and call shape, if its table has a valid, shipped one.
    With `arch` (e.g. 'sm_90'), a GPU flashgen ships no table for reads the table of a GPU of
    the same compute capability (`tables.arch_table`)."""
    table = load_table(gpu_name)
    if not table and arch is not None:
        table = arch_table(arch_major(arch))[1]
    entry = table.get(entry_key(d, dtype, causal))
    if not isinstance(entry, dict) or "variant" not in entry:
        return None
    try:
        spec = KernelSpec.from_name(str(entry["variant"]))
    except ValueError:
        return None
    # a plain variant only: the call's features are added to it later (`select`)
    return spec if spec in shipped(spec.family) and not spec.features else None


def family_defaults(family: str, d: int) -> dict[str, Any]:
    """The tiles and dtype a spec of `family` gets when the command names none (the family's)."""
    try:
        fam = family_of(family)
    except KeyError:
        return {}
    br, bc = fam.default_tile(d)
    return {"br": br, "bc": bc, "dtype": fam.default_dtype}


def default_fields(
    fam: str,
    d: int,
    br: int | None,
    bc: int | None,
    dtype: str | None,
    causal: bool,
    warps: int | None,
    stages: int | None,
) -> dict[str, Any]:
    """What a command that names some fields gets: br, bc, dtype, warps and stages, the unset
    ones filled in (0: the family's default); `flashgen build` and friends use it.

    When a tile is unset, from the family's shipped variants for this d (its usual tile when
    that one is shipped, else the largest shipped tile: `--family mma --d 256` gets a variant
    that fits, with its knobs), else from the family's defaults, so the spec's own rules
    explain what does not fit.
    """
    defaults = family_defaults(fam, d)
    want_dtype = dtype or defaults.get("dtype")
    fields: dict[str, Any] = {"br": br, "bc": bc, "dtype": want_dtype}
    knobs: dict[str, Any] = {"warps": warps or 0, "stages": stages or 0}
    if br is None or bc is None or want_dtype is None:
        matches = [
            s
            for s in shipped(fam)
            if s.d == d and s.causal == causal
            and all(
                want is None or getattr(s, key) == want
                for key, want in (
                    ("dtype", want_dtype), ("br", br), ("bc", bc), ("warps", warps),
                    ("stages", stages),
                )
            )
        ]  # fmt: skip
        if matches:
            usual = [s for s in matches if (s.br, s.bc) == (defaults.get("br"), defaults.get("bc"))]
            others = sorted(matches, key=lambda s: (-s.br * s.bc, -s.br, s.name))
            ordered = usual + [s for s in others if s not in usual]
            keys = ("br", "bc", "dtype", "warps", "stages")
            space = set(matches)
            for cand in ordered:  # the family's default knobs when that variant is shipped
                try:
                    plain = KernelSpec(
                        family=fam, d=d, br=cand.br, bc=cand.bc, dtype=cand.dtype,
                        causal=causal, **knobs,
                    )  # fmt: skip
                except SpecError:
                    continue
                if plain in space:
                    return {k: getattr(plain, k) for k in keys}
            # else the shipped variant's own knobs: the default ones may not fit its tile
            return {k: getattr(ordered[0], k) for k in keys}
    for key, value in fields.items():
        if value is None:
            if key not in defaults:
                raise ValueError(f"--{key} is required for family {fam} (it has no default)")
            fields[key] = defaults[key]
    return {**fields, **knobs}


__all__ = [
    "arch_major", "backward_family", "default_fields", "family_defaults", "feature_variant",
    "lookup", "packs_gqa", "select",
]
