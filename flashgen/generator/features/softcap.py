"""Logit softcapping (Gemma 2): scores s -> c * tanh(s / c) before the softmax."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from flashgen.generator.features.base import U32, Feature
from flashgen.generator.param import Param

# softcap * log2(e) is one fp32 number in the kernel, and so is scale / softcap
SOFTCAP_MIN = 1e-6
SOFTCAP_MAX = 1e6


class Softcap(Feature):
    """`softcap=c`, c > 0 (0 or None: off; a softcap variant needs one, its tanh has no off)."""

    token = "softcap"
    summary = "logit softcapping: scores s -> c * tanh(s / c) before the softmax"
    keyword = "softcap"
    params = (Param("softcap", "float", "f", "feature", "SOFTCAP: c"),)
    required = "softcap > 0 (its tanh has no 'off'); pass softcap=c"
    pin_value = 30.0
    check_value = 30.0

    def check(self, value: Any) -> float | None:
        """None (or 0.0, FlashAttention's "off") or a finite c in [SOFTCAP_MIN, SOFTCAP_MAX]."""
        if value is None:
            return None
        try:
            c = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"softcap={value!r}: must be a real number; e.g. softcap=30.0"
            ) from None
        if c == 0.0:
            return None
        if not math.isfinite(c) or not SOFTCAP_MIN <= c <= SOFTCAP_MAX:
            raise ValueError(
                f"softcap={value!r}: must be in [{SOFTCAP_MIN:g}, {SOFTCAP_MAX:g}] (logits become "
                "c * tanh(s / c)), or 0/None for no softcap; e.g. softcap=30.0 (Gemma 2: 50.0)"
            )
        return c

    def encode(self, value: Any) -> tuple[float]:
        return (float(value or 0.0),)

    def decode(self, args: tuple[Any, ...]) -> float | None:
        return self.check(args[0])

    def logits(self, value: Any, s: np.ndarray, heads: npt.NDArray[np.int_]) -> np.ndarray:
        if value is None:
            return s
        t = s.dtype.type
        out: np.ndarray = t(value) * np.tanh(s / t(value))
        return out

    def dlogits(self, value: Any, raw: np.ndarray) -> np.ndarray | None:
        """d/ds c * tanh(s / c) = 1 - tanh^2(s / c)."""
        if value is None:
            return None
        t = raw.dtype.type
        th = np.tanh(raw / t(value))
        out: np.ndarray = t(1.0) - th * th
        return out

    def lse_terms(self, value: Any, big_m: float, tq: int, tk: int) -> tuple[float, float]:
        """tanh on the SFU (a few 1e-7 absolute, times c) and the roundings of s * scale / c and
        c * log2 e: 8 * U32 * c + 4 * U32 * M; the logits shrink to |.| <= c."""
        if value is None:
            return 0.0, big_m
        return 8 * U32 * value + 4 * U32 * big_m, min(big_m, value)

    def draw(self, draw: Callable[..., Any], tq: int, tk: int) -> float:
        """Models' values (Gemma 2: 50 and 30) and anything from 0.5 to 100."""
        from hypothesis import strategies as st  # the suite's dependency, not the launcher's

        caps = st.one_of(
            st.sampled_from([1.0, 30.0, 50.0]), st.floats(min_value=0.5, max_value=100.0)
        )
        return float(draw(caps, label="softcap"))


SOFTCAP = Softcap()
