"""The shipped variants: each family's axes multiplied out and filtered by validation, plus
the feature variants `select` picks (`Family.shipped_features` at the family's default and
tuned tiles). Every other valid spec is compiled on demand into the cache."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache

from .families import FAMILIES, family_of
from .spec import KernelSpec, SpecError


@dataclass(frozen=True)
class Pruned:
    """A point of a family's product that is not shipped, with the rules it broke."""

    fields: dict[str, object]
    reasons: tuple[str, ...]

    @property
    def label(self) -> str:
        """A readable description of the point (it has no valid name)."""
        return " ".join(f"{k}={v}" for k, v in self.fields.items())


@cache
def _walk(family: str) -> tuple[tuple[KernelSpec, ...], tuple[Pruned, ...]]:
    fam = family_of(family)
    keys = list(fam.axes)
    kept: dict[str, KernelSpec] = {}
    pruned: list[Pruned] = []
    for values in itertools.product(*(fam.axes[k] for k in keys)):
        fields = dict(zip(keys, values, strict=True))
        try:
            spec = KernelSpec(family=family, **fields)  # type: ignore[arg-type]
        except SpecError as exc:
            pruned.append(Pruned(fields, tuple(exc.problems)))
            continue
        kept.setdefault(spec.name, spec)
    from .select import feature_variant  # select reads `shipped` itself

    picked = _picked_tiles(family, list(kept.values()))
    for spec in list(kept.values()):
        if spec not in picked:
            continue
        for feats in fam.shipped_features:
            # the variant select serves these features with: this tile, or where they do not
            # fit it (wgmma br=192 and a score mod) the family's default tile
            with_feats = feature_variant(spec, feats)
            if with_feats is not None:
                kept.setdefault(with_feats.name, with_feats)
    return tuple(kept.values()), tuple(pruned)


# the arch whose preference `select` applies to pick a family's own variants
_PICK_ARCH = {"wgmma": "sm_90"}


def _picked_tiles(family: str, plain: list[KernelSpec]) -> set[KernelSpec]:
    """The plain variants `select` picks within the family for each (d, dtype, causal), and
    those the packaged tuning tables name: where the feature variants ship."""
    from .select import select  # select and tuning read `shipped` themselves
    from .tuning import table_variants

    picked = {s for s in table_variants() if s.family == family}
    arch = _PICK_ARCH.get(family, "sm_80")
    for d, dtype, causal in dict.fromkeys((s.d, s.dtype, s.causal) for s in plain):
        picked.add(select(d, dtype, causal, arch, candidates=plain))
    return picked


# The backward variants shipped (compiled ahead, `shipped(direction="bwd")`), at the backward's
# default tile: the head dims and dtypes training uses most, each in the fast mode (dQ by fp32
# atomics) and the deterministic one (bit-identical gradients). Everything else compiles on
# demand.
BWD_AXES: dict[str, dict[str, tuple[object, ...]]] = {
    "mma": {
        "d": (64, 128),
        "dtype": ("fp16", "bf16"),
        "causal": (False, True),
        "features": ((), ("deterministic",)),
    },
    # Hopper: the default tile (br 64, bc 128) and stages (3 at d 64, 2 at d 128); no
    # deterministic variant (the mma one serves that mode on every GPU)
    "wgmma": {
        "d": (64, 128),
        "dtype": ("fp16", "bf16"),
        "causal": (False, True),
    },
}


@cache
def _walk_bwd(family: str) -> tuple[KernelSpec, ...]:
    axes = BWD_AXES.get(family, {})
    keys = list(axes)
    return tuple(
        KernelSpec(family=family, direction="bwd", **dict(zip(keys, values, strict=True)))  # type: ignore[arg-type]
        for values in itertools.product(*(axes[k] for k in keys))
    ) if axes else ()


def shipped(family: str | None = None, direction: str = "fwd") -> list[KernelSpec]:
    """Every shipped variant (of one family, or of all), in a stable order: the forward ones
    (what `select` picks from), or with direction="bwd" the backward ones."""
    names = [family] if family else list(FAMILIES)
    if direction == "bwd":
        return [s for f in names for s in _walk_bwd(f)]
    return [s for f in names for s in _walk(f)[0]]


def pruned(family: str | None = None) -> list[Pruned]:
    """Every point of the families' axes that validation rejects, with its reasons."""
    names = [family] if family else list(FAMILIES)
    return [p for f in names for p in _walk(f)[1]]
