"""The sliding window: query i (key position p) sees keys p - left .. p + right."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from flashgen.generator.features.base import Feature
from flashgen.generator.param import Param


class Window(Feature):
    """`window=(left, right)`: key counts a query sees on each side of its position (-1:
    unbounded on that side). The kernels also skip the key tiles outside the window."""

    token = "window"
    summary = "sliding-window mask (left, right) with the tiles outside the window skipped"
    keyword = "window"
    params = (
        Param("window_left", "int", "i", "feature", "WINDOW: keys p - left .. p + right"),
        Param("window_right", "int", "i", "feature"),
    )
    check_value = (64, 16)

    def check(self, value: Any) -> tuple[int, int] | None:
        """None, or (left, right) of ints >= -1; (-1, -1) is no window."""
        if value is None:
            return None
        ok = (
            isinstance(value, (tuple, list))
            and len(value) == 2
            and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in value)
        )
        if not ok:
            raise ValueError(
                f"window={value!r}: must be a pair (left, right) of integers; e.g. "
                "window=(4096, 0) for a causal sliding window of 4096 keys back, -1 for unbounded"
            )
        left, right = int(value[0]), int(value[1])
        if left < -1 or right < -1:
            raise ValueError(
                f"window={value!r}: each side must be >= 0 keys, or -1 for unbounded; "
                "e.g. window=(256, 0)"
            )
        if left == -1 and right == -1:
            return None
        return left, right

    def encode(self, value: Any) -> tuple[int, int]:
        return value if value is not None else (-1, -1)  # type: ignore[no-any-return]

    def decode(self, args: tuple[Any, ...]) -> tuple[int, int] | None:
        return self.check((int(args[0]), int(args[1])))

    def kernel_args(self, value: Any, tq: int, tk: int) -> tuple[int, int]:
        """A side that reaches every key of every row is passed as -1 (unbounded): a left side
        of Tk keys or more (query positions p < Tk: p - left < 0), a right side of Tq or more
        (p >= Tk - Tq: p + right >= Tk). So both fit the kernel's int arguments whatever Tq
        and Tk are (a side of 2^31 or more would wrap to a negative int)."""
        left, right = value if value is not None else (-1, -1)
        return (-1 if left >= tk else left), (-1 if right >= tq else right)

    def visible(self, value: Any, tq: int, tk: int) -> npt.NDArray[np.bool_] | None:
        """p - left <= j <= p + right (a negative side is unbounded)."""
        if value is None:
            return None
        left, right = value
        p = np.arange(tq)[:, None] + (tk - tq)
        j = np.arange(tk)[None, :]
        ok = np.ones((tq, tk), np.bool_)
        if left >= 0:
            ok &= j >= p - left
        if right >= 0:
            ok &= j <= p + right
        return ok

    def draw(self, draw: Callable[..., Any], tq: int, tk: int) -> tuple[int, int]:
        """Each side -1 (unbounded), 0 (empty side), a few keys, anything up to past the whole
        sequence, exactly Tq + Tk, or either side of the lengths from which the host passes a
        side as unbounded (left >= Tk, right >= Tq reach every key: `kernel_args`)."""
        from hypothesis import strategies as st  # the suite's dependency, not the launcher's

        reach = tq + tk
        side = st.one_of(
            st.sampled_from([-1, 0, 1, tq - 1, tq, tk - 1, tk, reach]),
            st.integers(min_value=0, max_value=reach + 2),
        )
        return tuple(draw(st.tuples(side, side), label="window"))  # type: ignore[return-value]


WINDOW = Window()
