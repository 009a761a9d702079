"""The shipped space: each family's axes multiplied out, filtered by validation, with reasons."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from flashgen.generator.arch import ARCHS
from flashgen.generator.families import FAMILIES
from flashgen.generator.space import pruned, shipped
from flashgen.generator.spec import KernelSpec, SpecError

FIELDS = ("d", "br", "bc", "dtype", "causal", "warps", "stages")


def _fields(spec: KernelSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in FIELDS}


def _plain(family: str) -> list[KernelSpec]:
    return [s for s in shipped(family) if not s.features]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_ships_something(family: str) -> None:
    assert shipped(family), f"family {family} ships no variant"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_shipped_variants_are_valid_and_belong_to_their_family(family: str) -> None:
    for spec in shipped(family):
        assert spec.family == family
        again = KernelSpec(**{"family": family, "features": spec.features, **_fields(spec)})
        assert again == spec  # validates again


def test_all_families_is_the_concatenation_in_a_stable_order() -> None:
    assert shipped() == [s for f in FAMILIES for s in shipped(f)]
    assert pruned() == [p for f in FAMILIES for p in pruned(f)]
    assert shipped() == shipped()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pruned_points_fail_validation_with_their_recorded_reasons(family: str) -> None:
    for point in pruned(family):
        assert point.reasons, f"{point.label}: pruned without a reason"
        for reason in point.reasons:
            assert reason.strip()
        with pytest.raises(SpecError) as info:
            KernelSpec(family=family, **point.fields)  # type: ignore[arg-type]
        assert tuple(info.value.problems) == point.reasons
        for key, value in point.fields.items():
            assert f"{key}={value}" in point.label


@pytest.mark.parametrize("family", list(FAMILIES))
def test_shipped_plus_pruned_is_the_whole_product(family: str) -> None:
    axes = FAMILIES[family].axes
    assert set(axes) == set(FIELDS), "every KernelSpec field except family is an axis"
    total = math.prod(len(v) for v in axes.values())
    product_pruned = [p for p in pruned(family) if "features" not in p.fields]
    assert len(_plain(family)) + len(product_pruned) == total
    names = [s.name for s in shipped(family)]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_product_point_is_shipped_or_pruned(family: str) -> None:
    axes = FAMILIES[family].axes
    keys = list(axes)
    kept = {s.name for s in shipped(family)}
    dropped = [
        tuple(sorted(p.fields.items())) for p in pruned(family) if "features" not in p.fields
    ]
    for values in itertools.product(*(axes[k] for k in keys)):
        fields = dict(zip(keys, values, strict=True))
        try:
            spec = KernelSpec(family=family, **fields)
        except SpecError:
            assert tuple(sorted(fields.items())) in dropped, fields
        else:
            assert spec.name in kept, spec.name


def test_simt_space_is_the_issues_axes() -> None:
    axes = FAMILIES["simt"].axes
    assert axes["d"] == (16, 32, 64, 96, 128)
    assert axes["br"] == (16, 32, 64)
    assert axes["bc"] == (16, 32, 64)
    assert set(axes["dtype"]) == {"fp32", "fp16", "bf16"}
    assert set(axes["causal"]) == {False, True}
    seen = {f: {getattr(s, f) for s in shipped("simt")} for f in ("d", "br", "bc", "dtype")}
    assert seen["dtype"] == {"fp32", "fp16", "bf16"}, "every dtype must ship"
    assert {s.causal for s in shipped("simt")} == {False, True}
    assert seen["d"] <= set(axes["d"])


def test_mma_space_uses_families_axes_and_tensor_core_dtypes() -> None:
    axes = FAMILIES["mma"].axes
    for spec in shipped("mma"):
        for f in FIELDS:
            assert getattr(spec, f) in axes[f], (spec.name, f)
        assert spec.dtype_info.tensor_core, spec.name
    assert {s.dtype for s in shipped("mma")} == {"fp16", "bf16"}
    assert {s.causal for s in shipped("mma")} == {False, True}
    # the two head dims every benchmark uses must ship
    assert {64, 128} <= {s.d for s in shipped("mma")}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_shipped_variants_fit_every_arch_they_ship_for(family: str) -> None:
    for spec in shipped(family):
        assert 32 <= spec.threads <= 1024 and spec.threads % 32 == 0, spec.name
        for arch in spec.archs:
            assert spec.smem_bytes <= ARCHS[arch].smem_per_block, (spec.name, arch)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_feature_variants_ship_only_where_select_picks(family: str) -> None:
    from flashgen.generator.select import feature_variant, select
    from flashgen.generator.tables import table_variants

    fam = FAMILIES[family]
    tuned = {s for s in table_variants() if s.family == family}
    plain = _plain(family)
    arch = "sm_90" if family == "wgmma" else "sm_80"
    picked = {select(s.d, s.dtype, s.causal, arch, candidates=plain) for s in plain} | tuned
    with_feats = [s for s in shipped(family) if s.features]
    # each picked tile with each shipped feature set: there, or (features that do not fit the
    # tile: wgmma br=192 with a score mod) at the family's default tile
    want = {feature_variant(base, feats) for base in picked for feats in fam.shipped_features}
    assert None not in want and set(with_feats) == want
    moved = [w for w in want if w is not None and w.replace(features=()) not in picked]
    assert all((w.br, w.bc) == FAMILIES[family].default_tile(w.d) for w in moved)
    # the space stays a small multiple of the plain product, not the Cartesian product
    assert len(with_feats) <= len(fam.shipped_features) * len(picked)
