"""The shipped variants: each family's axes multiplied out and filtered by validation, plus
the feature variants `select` picks (`Family.shipped_features` at the family's default and
tuned tiles). Every other valid spec is compiled on demand into the cache."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache

from flashgen.generator.families import FAMILIES, family_of
from flashgen.generator.policy import arch_major, choose, feature_variant
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.generator.tables import table_variants


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


def _picked_tiles(family: str, plain: list[KernelSpec]) -> set[KernelSpec]:
    """The plain variants `select` picks within the family for each (d, dtype, causal) (the
    preference for the family's first arch), and those the packaged tuning tables name: where
    the feature variants ship."""
    picked = {s for s in table_variants() if s.family == family}
    major = arch_major(family_of(family).archs[0])
    for d, dtype, causal in dict.fromkeys((s.d, s.dtype, s.causal) for s in plain):
        found = choose(plain, d, dtype, causal, major, lambda s: True, d, on_demand=False)
        if found is None:
            raise ValueError(f"family {family}: nothing of its own serves d={d} {dtype}")
        picked.add(found)
    return picked


@cache
def _walk_bwd(family: str) -> tuple[KernelSpec, ...]:
    axes = family_of(family).bwd_axes
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
