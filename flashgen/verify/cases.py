"""One random problem of the property suite (`Case`) and the memory layouts it draws from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


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
    # features (used by variants compiled with them): a sliding window (left, right), -1 for
    # unbounded; a softcap c; ALiBi with slopes alibi * 2^(-8 (i + 1) / H) for head i
    window: tuple[int, int] | None = None
    softcap: float | None = None
    alibi: float | None = None

    def alibi_slopes(self) -> np.ndarray | None:
        """The case's per-head ALiBi slopes (float32, as the kernel reads them), or None."""
        if self.alibi is None:
            return None
        heads = np.arange(self.h, dtype=np.float64)
        return (self.alibi * 2.0 ** (-8.0 * (heads + 1) / self.h)).astype(np.float32)

    def feature_kwargs(self) -> dict[str, Any]:
        """window / softcap / alibi_slopes as `reference` and `check_outputs` take them."""
        return {"window": self.window, "softcap": self.softcap, "alibi_slopes": self.alibi_slopes()}

    @property
    def has_features(self) -> bool:
        """Whether the case uses any feature (its variant must be compiled with them)."""
        return self.window is not None or self.softcap is not None or self.alibi is not None

    @property
    def kv_heads(self) -> int:
        """Heads of K and V."""
        return self.h_kv or self.h


# How one (B, H, T, d) tensor may sit in memory: its own order of axes or padded rows, so that
# q, k, v and o each get strides of their own (a kernel that read V with K's strides, or wrote
# O with Q's, fails). Every layout keeps d contiguous and 16-byte aligned rows.
LAYOUTS = ("bhtd", "bthd", "hbtd", "pad")
