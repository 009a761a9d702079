"""Run-time values of the compile-time features: a call's window, softcap and ALiBi slopes.

A feature is compiled into a variant as a token of its name (`KernelSpec.features`: `window`,
`softcap`, `alibi`); its values are kernel arguments (the last four of the C ABI, see
templates/_common.cuh.j2), so one compiled variant serves every window size, cap and slope set.
`FeatureArgs` carries one call's values, validated here, and says which tokens the call needs:
a call with a window runs a `window` variant, a plain call a variant without features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashgen.generator.spec import KernelSpec

# softcap * log2(e) is one fp32 number in the kernel, and so is scale / softcap
SOFTCAP_MIN = 1e-6
SOFTCAP_MAX = 1e6


@dataclass(frozen=True)
class FeatureArgs:
    """One call's feature values (all off by default).

    window   (left, right) key counts a query sees on each side of its position (-1:
             unbounded on that side); None: no window.
    softcap  c > 0: logits s -> c * tanh(s / c); None: off.
    alibi    device pointer of H contiguous fp32 slopes (natural-log units, one per query
             head); None: off. The slopes' values are the caller's to keep alive.
    """

    window: tuple[int, int] | None = None
    softcap: float | None = None
    alibi: int | None = None

    @property
    def tokens(self) -> tuple[str, ...]:
        """The feature tokens a variant needs to serve this call, in canonical order."""
        return tuple(
            t
            for t, on in (
                ("window", self.window is not None),
                ("softcap", self.softcap is not None),
                ("alibi", self.alibi is not None),
            )
            if on
        )

    def kernel_args(self, tq: int, tk: int) -> tuple[int, int, float, int]:
        """(window_left, window_right, softcap, alibi pointer) as the kernel takes them.

        A side that reaches every key of every row is passed as -1 (unbounded): a left side
        of Tk keys or more (query positions p < Tk: p - left < 0), a right side of Tq or more
        (p >= Tk - Tq: p + right >= Tk). So both fit the kernel's int arguments whatever Tq
        and Tk are (a side of 2^31 or more would wrap to a negative int).
        """
        left, right = self.window if self.window is not None else (-1, -1)
        left = -1 if left >= tk else left
        right = -1 if right >= tq else right
        return left, right, float(self.softcap or 0.0), int(self.alibi or 0)


NO_FEATURES = FeatureArgs()


def check_window(window: Any) -> tuple[int, int] | None:
    """A validated window: None, or (left, right) of ints >= -1; (-1, -1) is no window."""
    if window is None:
        return None
    ok = (
        isinstance(window, (tuple, list))
        and len(window) == 2
        and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in window)
    )
    if not ok:
        raise ValueError(
            f"window={window!r}: must be a pair (left, right) of integers; e.g. window=(4096, 0) "
            "for a causal sliding window of 4096 keys back, -1 for unbounded"
        )
    left, right = int(window[0]), int(window[1])
    if left < -1 or right < -1:
        raise ValueError(
            f"window={window!r}: each side must be >= 0 keys, or -1 for unbounded; "
            "e.g. window=(256, 0)"
        )
    if left == -1 and right == -1:
        return None
    return left, right


def check_softcap(softcap: Any) -> float | None:
    """A validated softcap: None (or 0.0, FlashAttention's "off") or a finite c > 0."""
    if softcap is None:
        return None
    try:
        value = float(softcap)
    except (TypeError, ValueError):
        raise ValueError(f"softcap={softcap!r}: must be a real number; e.g. softcap=30.0") from None
    if value == 0.0:
        return None
    if not math.isfinite(value) or not SOFTCAP_MIN <= value <= SOFTCAP_MAX:
        raise ValueError(
            f"softcap={softcap!r}: must be in [{SOFTCAP_MIN:g}, {SOFTCAP_MAX:g}] (logits become "
            "c * tanh(s / c)), or 0/None for no softcap; e.g. softcap=30.0 (Gemma 2: 50.0)"
        )
    return value


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


ALIBI_ALIGN = 4  # bytes: the kernels load each slope as one fp32


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


def alibi_host(slopes: Any, heads: int) -> np.ndarray | None:
    """Host ALiBi slopes as a contiguous float32 (H,) array, validated (None passes)."""
    if slopes is None:
        return None
    arr = np.asarray(slopes)
    check_alibi_shape(arr.shape, arr.dtype, heads)
    if not np.isfinite(arr).all():
        raise ValueError("alibi_slopes: every slope must be finite; pass real numbers")
    return np.ascontiguousarray(arr, np.float32)


def check_fits(spec: KernelSpec, features: FeatureArgs) -> None:
    """ValueError unless `spec` compiles in every feature the call uses (a variant without
    `window` would ignore the window and return attention over every key: wrong output)."""
    if "softcap" in spec.features and features.softcap is None:
        plain = spec.replace(features=tuple(f for f in spec.features if f != "softcap"))
        raise ValueError(
            f"spec {spec.name}: compiled with softcap, so it needs softcap > 0 (its tanh has "
            f"no 'off'); pass softcap=c, or use {plain.name}"
        )
    missing = [t for t in features.tokens if t not in spec.features]
    if missing:
        want = spec.replace(features=tuple(sorted({*spec.features, *missing})))
        raise ValueError(
            f"spec {spec.name}: the call uses {', '.join(missing)} but the variant is not "
            f"compiled with it; use {want.name} (or spec=None to let flashgen choose)"
        )
