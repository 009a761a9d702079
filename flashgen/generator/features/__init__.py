"""The run-time features, one object each (`base.Feature`), and one call's values of them.

`RUNTIME_FEATURES` is the registry: a feature is one module here plus its line below (then
its template hook and tests). Its position fixes its canonical order (in variant names and
the ABI). Each object carries its token, kernel arguments, validation, oracle terms and
property-suite values; the rest of flashgen loops over the registry. `FeatureArgs` is one
call's values, as the launchers take them; it says which tokens a variant needs to serve it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from flashgen.generator.features.alibi import (
    ALIBI,
    ALIBI_ALIGN,
    alibi_host,
    check_alibi_pointer,
    check_alibi_shape,
)
from flashgen.generator.features.base import Feature
from flashgen.generator.features.softcap import SOFTCAP, SOFTCAP_MAX, SOFTCAP_MIN
from flashgen.generator.features.window import WINDOW

if TYPE_CHECKING:
    from flashgen.generator.spec import KernelSpec

RUNTIME_FEATURES: tuple[Feature, ...] = (
    WINDOW,
    SOFTCAP,
    ALIBI,
)
"""Every run-time feature, in canonical order."""



class FeatureKeywords(TypedDict, total=False):
    """The front doors' feature keywords (`flashgen.attention(..., **features)`), one per
    feature: its `keyword` and the value type a user passes."""

    window: tuple[int, int] | None
    softcap: float | None
    alibi_slopes: Any  # a float32 (H,) array: NumPy, GPUArray, CUDA-array object, torch tensor


BY_TOKEN: dict[str, Feature] = {f.token: f for f in RUNTIME_FEATURES}
BY_KEYWORD: dict[str, Feature] = {f.keyword: f for f in RUNTIME_FEATURES}
TOKENS: tuple[str, ...] = tuple(BY_TOKEN)


class FeatureArgs:
    """One call's feature values as the launchers take them, by token (all off by default):
    `FeatureArgs(window=(256, 0), softcap=30.0, alibi=ptr)`. A value of None is off. Read one
    as an attribute (`args.window`). Values are taken as given (the front doors check them)."""

    __slots__ = ("_values",)

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(BY_TOKEN))
        if unknown:
            raise TypeError(
                f"FeatureArgs: unknown feature {', '.join(unknown)}; the features are "
                f"{', '.join(TOKENS)}"
            )
        object.__setattr__(self, "_values", tuple(values.get(t) for t in TOKENS))

    def __getattr__(self, token: str) -> Any:
        try:
            return self._values[TOKENS.index(token)]
        except ValueError:
            raise AttributeError(token) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FeatureArgs is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FeatureArgs) and self._values == other._values

    def __hash__(self) -> int:
        return hash(self._values)

    def __repr__(self) -> str:
        pairs = zip(TOKENS, self._values, strict=True)
        on = ", ".join(f"{t}={v!r}" for t, v in pairs if v is not None)
        return f"FeatureArgs({on})"

    def items(self) -> tuple[tuple[Feature, Any], ...]:
        """(feature, value) of every feature, in canonical order (None: off)."""
        return tuple(zip(RUNTIME_FEATURES, self._values, strict=True))

    @property
    def tokens(self) -> tuple[str, ...]:
        """The feature tokens a variant needs to serve this call, in canonical order."""
        return tuple(t for t, v in zip(TOKENS, self._values, strict=True) if v is not None)

    def check(self) -> None:
        """ValueError unless every value passes its feature's rule (`Feature.check`)."""
        for feature, value in self.items():
            if value is not None:
                feature.check(value)

    def kernel_args(self, tq: int, tk: int) -> tuple[Any, ...]:
        """Every feature's kernel arguments, in ABI order (`Feature.kernel_args`)."""
        return tuple(a for f, v in self.items() for a in f.kernel_args(v, tq, tk))


NO_FEATURES = FeatureArgs()

check_window = WINDOW.check
check_softcap = SOFTCAP.check


def check_fits(spec: KernelSpec, features: FeatureArgs) -> None:
    """ValueError unless `spec` compiles in every feature the call uses (a variant without
    `window` would ignore the window and return attention over every key: wrong output)."""
    for feature, value in features.items():
        if feature.required and feature.token in spec.features and value is None:
            plain = _with_features(spec, tuple(f for f in spec.features if f != feature.token))
            raise ValueError(
                f"spec {spec.name}: compiled with {feature.token}, so it needs "
                f"{feature.required}, or use {plain.name}"
            )
    missing = [t for t in features.tokens if t not in spec.features]
    if missing:
        want = _with_features(spec, tuple(sorted({*spec.features, *missing})))
        raise ValueError(
            f"spec {spec.name}: the call uses {', '.join(missing)} but the variant is not "
            f"compiled with it; use {want.name} (or spec=None to let flashgen choose)"
        )


__all__ = [
    "ALIBI",
    "ALIBI_ALIGN",
    "BY_KEYWORD",
    "BY_TOKEN",
    "RUNTIME_FEATURES",
    "NO_FEATURES",
    "SOFTCAP",
    "SOFTCAP_MAX",
    "SOFTCAP_MIN",
    "TOKENS",
    "WINDOW",
    "Feature",
    "FeatureArgs",
    "FeatureKeywords",
    "alibi_host",
    "check_alibi_pointer",
    "check_alibi_shape",
    "check_fits",
    "check_softcap",
    "check_window",
]


def _with_features(spec: KernelSpec, features: tuple[str, ...]) -> KernelSpec:
    """`spec` with other features; where its tile does not take them (the wgmma backward's
    128-row tile refuses softcap), the tile the spec's family gives those features."""
    try:
        return spec.replace(features=features)
    except ValueError:  # SpecError (this layer does not import spec.py)
        return type(spec)(
            family=spec.family, d=spec.d, dv=spec.dv, dtype=spec.dtype, causal=spec.causal,
            direction=spec.direction, features=features,
        )  # fmt: skip
