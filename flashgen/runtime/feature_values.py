"""A front door's feature keywords -> what its launcher takes (`FeatureArgs`), for any feature.

The front doors (`flashgen.attention`, `flashgen.torch.attention`, `runtime.backward`) take
each feature by its keyword (`Feature.keyword`) and hand the values here in registry order:
a scalar feature's value checked by its feature, an array feature's value (ALiBi's slopes)
as the caller's array, which each front door turns into a device pointer its own way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flashgen.generator.features import BY_KEYWORD, RUNTIME_FEATURES, Feature, FeatureArgs

Values = tuple[Any, ...]
"""One value per feature, in registry order (None: off)."""


def from_keywords(features: Mapping[str, object], caller: str) -> Values:
    """The call's feature values in registry order: scalar ones checked (`Feature.check`:
    ValueError naming value, rule and fix), array ones as given. TypeError on a keyword that
    is no feature's (as Python's own for a misspelt argument)."""
    if not features:
        return NO_VALUES  # the common call: nothing to check (host time per call)
    unknown = sorted(set(features) - set(BY_KEYWORD))
    if unknown:
        raise TypeError(
            f"{caller}() got an unexpected keyword argument {unknown[0]!r}; its features are "
            f"{', '.join(BY_KEYWORD)}"
        )
    return tuple(_checked(f, features.get(f.keyword)) for f in RUNTIME_FEATURES)


NO_VALUES: Values = (None,) * len(RUNTIME_FEATURES)
"""Every feature off (`from_keywords` of no keywords)."""


def _checked(feature: Feature, value: Any) -> Any:
    return value if value is None or feature.array else feature.check(value)


def uses(values: Values) -> FeatureArgs:
    """FeatureArgs that says which features the call uses (an array feature's value replaced by
    a placeholder): for `check_fits` and variant selection before any pointer exists."""
    return FeatureArgs(
        **{f.token: (1 if f.array else v) for f, v in zip(RUNTIME_FEATURES, values, strict=True)
           if v is not None}
    )  # fmt: skip


def bind(values: Values, pointer: Callable[[Feature, Any], int]) -> FeatureArgs:
    """The launcher's FeatureArgs: scalar values as they are, each array value replaced by
    `pointer(feature, array)` (the front door's check of the array and its device pointer)."""
    return FeatureArgs(
        **{f.token: (pointer(f, v) if f.array else v)
           for f, v in zip(RUNTIME_FEATURES, values, strict=True) if v is not None}
    )  # fmt: skip


def arrays(values: Values) -> list[tuple[Feature, Any]]:
    """The (feature, array) pairs of the array features the call uses."""
    return [
        (f, v) for f, v in zip(RUNTIME_FEATURES, values, strict=True) if f.array and v is not None
    ]


def signature(values: Values, array_key: Callable[[Any], tuple[Any, ...]]) -> Values:
    """What a remembered call signature must match of the features: scalar values, and of each
    array its `array_key` (pointer, shape, strides, dtype: the pointer alone let a view at the
    same address skip validation)."""
    return tuple(
        (array_key(v) if f.array and v is not None else v)
        for f, v in zip(RUNTIME_FEATURES, values, strict=True)
    )
