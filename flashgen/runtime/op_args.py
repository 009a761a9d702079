"""The run-time features as arguments of a torch custom op (no torch needed here).

Each feature's kernel arguments are op arguments, in registry order, after an op's fixed ones
(an array feature's as the tensor itself): window_left, window_right, softcap, alibi_slopes.
`FEATURE_SCHEMA` is their part of an op schema; `op_args` turns a call's feature values into
them and `values_of` back. The ops of `flashgen.torch` and `flashgen.kvcache` share them.
"""

from __future__ import annotations

from typing import Any

from flashgen.generator.features import RUNTIME_FEATURES, Feature
from flashgen.runtime import feature_values


def _schema_arg(feature: Feature, name: str, ctype: str, off: Any) -> str:
    if feature.array:
        return f"Tensor? {name}=None"
    kind = {"int": "int", "float": "float"}[ctype]
    return f"{kind} {name}={off!r}" if kind == "int" else f"{kind} {name}={float(off)!r}"


FEATURE_SCHEMA = ", ".join(
    _schema_arg(f, p.name, p.ctype, off)
    for f in RUNTIME_FEATURES
    for p, off in zip(f.params, f.encode(None), strict=True)
).replace("=0.0", "=0.")  # the schema parser's spelling of a float default
"""The features' op arguments: `int window_left=-1, ..., Tensor? alibi_slopes=None`."""


def op_args(values: feature_values.Values) -> tuple[Any, ...]:
    """A call's feature values (registry order) as op arguments: each feature's `encode`, an
    array feature's value (a tensor or None) as it is."""
    if values is feature_values.NO_VALUES:
        return OFF  # every feature off: encoded once (host time per call)
    return tuple(
        a
        for f, v in zip(RUNTIME_FEATURES, values, strict=True)
        for a in ((v,) if f.array else f.encode(v))
    )


# a tuple equal to NO_VALUES but not it: op_args(NO_VALUES) would return OFF before it exists
OFF = op_args((None, *((None,) * (len(RUNTIME_FEATURES) - 1))))
"""Every feature off, as op arguments."""

N_FEATURE_ARGS = sum(len(f.params) for f in RUNTIME_FEATURES)
"""How many op arguments the features take."""


def full(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The feature arguments with the defaults the caller left out (the schema's: off)."""
    return args if len(args) == N_FEATURE_ARGS else (*args, *OFF[len(args) :])


def values_of(args: tuple[Any, ...]) -> feature_values.Values:
    """`op_args`' inverse: the feature values (scalar ones decoded and checked)."""
    args = full(args)
    out, i = [], 0
    for f in RUNTIME_FEATURES:
        n = len(f.params)
        out.append(args[i] if f.array else f.decode(tuple(args[i : i + n])))
        i += n
    return tuple(out)


def arrays_of(args: tuple[Any, ...]) -> list[tuple[Feature, Any]]:
    """(feature, tensor) of each array feature the op arguments carry (not None)."""
    args = full(args)
    out, i = [], 0
    for f in RUNTIME_FEATURES:
        if f.array and args[i] is not None:
            out.append((f, args[i]))
        i += len(f.params)
    return out
