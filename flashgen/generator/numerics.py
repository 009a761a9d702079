"""Numeric constants the generated kernels and the host code agree on."""

from __future__ import annotations

import math

LOG2E = math.log2(math.e)
"""log2(e): the kernels run the softmax in base 2 with it folded into the scale
(scale_log2 = scale * LOG2E), so every host computes the kernel argument the same way."""
