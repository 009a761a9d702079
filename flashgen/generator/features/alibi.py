"""ALiBi: logits - slope[head] * |p - j|, one fp32 slope per query head (natural-log units)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from flashgen.generator.features.base import U32, Feature
from flashgen.generator.param import Param

ALIBI_ALIGN = 4  # bytes: the kernels load each slope as one fp32


class Alibi(Feature):
    """`alibi_slopes`: a float32 (H,) array on the device (the launcher's value: its pointer;
    the oracle's: the slopes; a `Case`'s: one scale s, slopes s * 2^(-8 (h + 1) / H))."""

    token = "alibi"
    summary = "ALiBi: logits - slope[head] * |i - j| (per-head fp32 slopes)"
    keyword = "alibi_slopes"
    params = (
        Param("alibi_slopes", "const float*", "P", "feature", "ALIBI: fp32 slope per query head"),
    )
    pin_value = 1.0
    array = True
    check_value = 0.5

    def check(self, value: Any) -> int | None:
        """The slopes' device pointer: set and 4-byte aligned (None: off)."""
        if value is None:
            return None
        check_alibi_pointer(value)
        return int(value)

    def encode(self, value: Any) -> tuple[int]:
        return (int(value or 0),)

    def decode(self, args: tuple[Any, ...]) -> int | None:
        return int(args[0]) or None

    def check_array(self, shape: tuple[int, ...], dtype: Any, heads: int) -> None:
        check_alibi_shape(shape, dtype, heads)

    def host_array(self, value: Any, heads: int) -> np.ndarray:
        out = alibi_host(value, heads)
        assert out is not None  # value is not None here
        return out

    def logits(self, value: Any, s: np.ndarray, heads: npt.NDArray[np.int_]) -> np.ndarray:
        """s - slope[h] * |p - j|, with p = i + Tk - Tq (bottom-right alignment)."""
        if value is None:
            return s
        tq, tk = s.shape[1], s.shape[2]
        dist = np.abs(np.arange(tq)[:, None] + (tk - tq) - np.arange(tk)[None, :])
        slopes = np.asarray(value, np.float64)[heads]
        bias = -slopes[:, None, None] * dist.astype(np.float64)[None]
        out: np.ndarray = (s + bias.astype(s.dtype)).astype(s.dtype)
        return out

    def lse_terms(self, value: Any, big_m: float, tq: int, tk: int) -> tuple[float, float]:
        """slope * log2 e and the fused add of -slope * dist: 2 * U32 * (A + M), A = max slope
        * (Tq + Tk) the largest |bias|; the logits grow to M + A."""
        if value is None or not len(value):
            return 0.0, big_m
        bias = float(np.max(np.abs(np.asarray(value, np.float64)))) * (tq + tk)
        return 2 * U32 * (bias + big_m), big_m + bias

    def draw(self, draw: Callable[..., Any], tq: int, tk: int) -> float:
        """The slopes' scale, from 1e-3 to 1 (the largest slope of a model's set)."""
        from hypothesis import strategies as st  # the suite's dependency, not the launcher's

        return float(draw(st.floats(min_value=1e-3, max_value=1.0), label="alibi"))

    def case_value(self, value: Any, heads: int) -> np.ndarray | None:
        """Slopes value * 2^(-8 (h + 1) / H) for head h, float32 as the kernel reads them."""
        if value is None:
            return None
        h = np.arange(heads, dtype=np.float64)
        slopes: np.ndarray = (value * 2.0 ** (-8.0 * (h + 1) / heads)).astype(np.float32)
        return slopes


def check_alibi_pointer(ptr: int | None) -> None:
    """ValueError unless ALiBi slopes' device pointer is set and 4-byte aligned (the kernels
    load fp32 slopes; the bundle's launcher refuses the same)."""
    if not ptr:
        raise ValueError(
            "alibi_slopes: no device pointer; pass the slopes as a device array like q"
        )
    if ptr % ALIBI_ALIGN:
        raise ValueError(
            f"alibi_slopes pointer {ptr:#x}: must be {ALIBI_ALIGN}-byte aligned (the kernels "
            "load fp32 slopes); pass a fresh float32 array (not a view at a byte offset)"
        )


def check_alibi_shape(shape: tuple[int, ...], dtype: Any, heads: int) -> None:
    """ValueError unless ALiBi slopes are a (H,) float32 array, one slope per query head."""
    if tuple(shape) != (heads,):
        raise ValueError(
            f"alibi_slopes.shape={tuple(shape)}: must be ({heads},), one slope per query head; "
            "e.g. 2 ** (-8 * (h + 1) / H) for h in range(H)"
        )
    if np.dtype(str(dtype).replace("torch.", "")) != np.float32:
        raise ValueError(
            f"alibi_slopes.dtype={dtype}: must be float32; cast it (.astype(np.float32) or "
            ".float())"
        )


def alibi_host(slopes: Any, heads: int) -> np.ndarray | None:
    """Host ALiBi slopes as a contiguous float32 (H,) array, validated (None passes)."""
    if slopes is None:
        return None
    arr = np.asarray(slopes)
    check_alibi_shape(arr.shape, arr.dtype, heads)
    if not np.isfinite(arr).all():
        raise ValueError("alibi_slopes: every slope must be finite; pass real numbers")
    return np.ascontiguousarray(arr, np.float32)


ALIBI = Alibi()
