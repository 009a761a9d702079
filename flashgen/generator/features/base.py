"""What a run-time feature is: one object from the user's keyword down to the oracle's term.

A feature (a sliding window, a softcap, ALiBi, later a user's score or mask function) is
compiled into a variant as a token (`KernelSpec.features`) and a template flag (`WINDOW`, ...
in templates/_common.cuh.j2: the device code hook); its values travel as kernel arguments
(`params`, appended to the ABI in registry order), so one compiled variant serves every value.
The same object says how a user's value is checked, what the kernel is passed for it, how the
float64 oracle applies it (a mask, a logit term, the logit term's derivative for the
backward, what fp32 evaluation of it may miss), and which values the property suite draws.

Values by layer: the front door's value (`keyword`: `window=(256, 0)`); the launcher's value in
`FeatureArgs` (the same, except ALiBi: a device pointer); the oracle's value (ALiBi: the
slopes); the property suite's value in `Case` (ALiBi: one scale for the per-head slopes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from flashgen.generator.param import Param

# U32: float32's unit roundoff (the oracle's error terms are multiples of it)
U32 = 2.0**-24


class Feature:
    """A run-time feature. Subclasses set the class attributes and override the hooks they use;
    every hook's default is "this feature does not touch that"."""

    token: str = ""
    """Its name in `KernelSpec.features` and variant names (`..._window`)."""
    summary: str = ""
    """One line: what it computes (shown by `flashgen list`, spec errors)."""
    keyword: str = ""
    """The front doors' and the oracle's keyword for its value (`alibi_slopes` for `alibi`)."""
    params: tuple[Param, ...] = ()
    """Its kernel arguments (role `feature`), appended to the forward and backward ABI."""
    array: bool = False
    """Its value is a float32 array the kernels read on the device (the launcher's value: the
    array's device pointer; the oracle's: the array)."""
    required: str = ""
    """When a variant compiled with it cannot turn it off: what a call must pass (and why)."""

    # ---- the launcher ---------------------------------------------------------------------
    def check(self, value: Any) -> Any:
        """A user's value validated and normalised; None when the value means "off"."""
        return value

    def kernel_args(self, value: Any, tq: int, tk: int) -> tuple[Any, ...]:
        """Its kernel arguments for launcher value `value` (None: off), one per `params`, for a
        problem of Tq queries and Tk keys (the default: `encode`)."""
        return self.encode(value)

    def encode(self, value: Any) -> tuple[Any, ...]:
        """A checked value as its `params`' values, whatever the problem (None: the values
        that mean off). The torch op passes a feature as these (an array as the tensor)."""
        raise NotImplementedError

    def decode(self, args: tuple[Any, ...]) -> Any:
        """`encode`'s inverse: the value its params' values stand for (None: off)."""
        raise NotImplementedError

    # ---- the front doors (an array feature's value is a float32 array) -------------------------
    def check_array(self, shape: tuple[int, ...], dtype: Any, heads: int) -> None:
        """ValueError unless an array value has the shape and dtype the kernels read."""

    def host_array(self, value: Any, heads: int) -> np.ndarray:
        """A host array value checked and made contiguous float32, ready to copy to the GPU."""
        arr = np.asarray(value)
        self.check_array(arr.shape, arr.dtype, heads)
        return np.ascontiguousarray(arr, np.float32)

    # ---- the float64 oracle (verify/oracle.py, oracle_bwd.py) ------------------------------
    def visible(self, value: Any, tq: int, tk: int) -> npt.NDArray[np.bool_] | None:
        """(Tq, Tk) keys each query sees under this feature (None: every key). Query i sits at
        key position p = i + Tk - Tq (bottom-right alignment)."""
        return None

    def logits(self, value: Any, s: np.ndarray, heads: npt.NDArray[np.int_]) -> np.ndarray:
        """Scores s (heads, Tq, Tk) of the given query heads -> this feature's logits, in s's
        own float type. Applied in registry order, before the mask."""
        return s

    def dlogits(self, value: Any, raw: np.ndarray) -> np.ndarray | None:
        """d logits / d s at the raw scores (the chain rule's factor on dS; None: 1)."""
        return None

    def lse_terms(self, value: Any, big_m: float, tq: int, tk: int) -> tuple[float, float]:
        """(error, M'): what fp32 evaluation of the term may add to one logit's error, and the
        largest |logit| after it, given the largest |scaled score| M (see oracle.lse_bound)."""
        return 0.0, big_m

    # ---- the property suite (verify/strategies.py, cases.py) -------------------------------
    def draw(self, draw: Callable[..., Any], tq: int, tk: int) -> Any:
        """A random value for a problem of Tq queries and Tk keys (`draw`: Hypothesis')."""
        raise NotImplementedError

    def case_value(self, value: Any, heads: int) -> Any:
        """The oracle's value for a `Case`'s value (ALiBi: slopes from one scale)."""
        return value

    check_value: Any = None
    """The value `flashgen check` runs a variant with, and the property suite's plain pins a
    variant that cannot turn it off (a `Case` value)."""
    pin_value: Any = None
    """The value the property suite's pinned feature problems run with: the hardest one (a
    `Case` value; None: the pins choose their own, as the window's do)."""

    def __repr__(self) -> str:
        return f"<feature {self.token}>"
