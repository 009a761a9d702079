"""One random problem of the property suite (`Case`) and the memory layouts it draws from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flashgen.generator.features import BY_TOKEN, RUNTIME_FEATURES

FeaturePairs = tuple[tuple[str, Any], ...]


def feature_pairs(**values: Any) -> FeaturePairs:
    """A `Case`'s features from token=value keywords (None: off), in registry order:
    `feature_pairs(window=(64, 0), softcap=30.0)`. TypeError on an unknown token."""
    unknown = sorted(set(values) - set(BY_TOKEN))
    if unknown:
        raise TypeError(
            f"unknown feature {', '.join(unknown)}; the features are {', '.join(BY_TOKEN)}"
        )
    return tuple(
        (f.token, values[f.token]) for f in RUNTIME_FEATURES if values.get(f.token) is not None
    )


@dataclass(frozen=True)
class Case:
    """One random problem: sizes, softmax scale (None: 1/sqrt(d)), logit magnitude, seed.

    With `logit_max` set, Q and K are scaled so that the largest |scale * q.k| equals it (up to
    MAX_INPUT_GAIN); with None they stay standard normal.
    """

    b: int
    h: int
    tq: int
    tk: int
    scale: float | None = None
    logit_max: float | None = None
    seed: int = 0
    # memory layout of q, k, v and o on the GPU (LAYOUTS); each tensor its own strides
    layouts: tuple[str, str, str, str] = ("bhtd", "bhtd", "bhtd", "bhtd")
    # V = v_mean + noise; noise standard normal, or Student-t with v_dof degrees of freedom
    # (heavy tails, clipped to +-V_CLIP so fp16 holds it)
    v_mean: float = 0.0
    v_dof: float | None = None
    # K/V heads (grouped-query attention: H a multiple of it); 0 means H (multi-head)
    h_kv: int = 0
    # features (used by variants compiled with them): (token, value) pairs (`feature_pairs`),
    # each value as its feature's `Case` value: a window (left, right), -1 unbounded; a
    # softcap c; ALiBi's scale s of slopes s * 2^(-8 (i + 1) / H) for head i
    features: FeaturePairs = ()

    def feature(self, token: str) -> Any:
        """The case's value of feature `token`, or None when off."""
        return dict(self.features).get(token)

    def feature_kwargs(self) -> dict[str, Any]:
        """The features' oracle values by keyword, as `reference` and `check_outputs` take
        them (`window`, `softcap`, `alibi_slopes`: the slopes as the kernel reads them)."""
        return {f.keyword: f.case_value(self.feature(f.token), self.h) for f in RUNTIME_FEATURES}

    @property
    def has_features(self) -> bool:
        """Whether the case uses any feature (its variant must be compiled with them)."""
        return bool(self.features)

    @property
    def kv_heads(self) -> int:
        """Heads of K and V."""
        return self.h_kv or self.h


# How one (B, H, T, d) tensor may sit in memory: its own order of axes or padded rows, so that
# q, k, v and o each get strides of their own (a kernel that read V with K's strides, or wrote
# O with Q's, fails). Every layout keeps d contiguous and 16-byte aligned rows.
LAYOUTS = ("bhtd", "bthd", "hbtd", "pad")
