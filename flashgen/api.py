"""`flashgen.attention`: run a generated FlashAttention kernel on NumPy arrays or GPUArrays."""

from __future__ import annotations

from typing import Any

import numpy as np

from .generator import runtime
from .generator.runtime import GpuUnavailable
from .generator.select import select
from .generator.spec import KernelSpec
from .generator.validate import Problem, check_layout, check_scale, check_spec

__all__ = ["GpuUnavailable", "attention"]


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    spec: KernelSpec | None = None,
    return_lse: bool = False,
) -> Any:
    """softmax(Q·Kᵀ·scale + mask)·V with a generated kernel; O (and LSE) like the inputs.

    q is (B, H, Tq, d), k and v are (B, H, Tk, d), all of one dtype (float32, float16 or
    ml_dtypes.bfloat16). Any strided view works as long as the last (d) axis is contiguous.
    NumPy inputs are copied to the GPU and the output comes back as a NumPy array; PyCUDA
    GPUArrays are used in place and the output is a new GPUArray. `causal` masks key j for
    query i when j > i + Tk - Tq (bottom-right aligned); a row that sees no key outputs zeros
    and LSE -inf. `scale` defaults to 1/sqrt(d). `spec=None` picks a shipped variant for
    (d, dtype, causal, this GPU); a given spec must match the call's d, dtype and causal.
    With `return_lse`, returns (O, LSE) where LSE is float32 (B, H, Tq), natural log.

    Inputs are validated before the GPU is touched (ValueError naming value, rule and fix);
    without PyCUDA, a driver or a GPU the call raises GpuUnavailable.

    Example (needs an NVIDIA GPU and PyCUDA)::

        import numpy as np
        import flashgen

        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((2, 8, 300, 64)).astype(np.float16) for _ in range(3))
        o, lse = flashgen.attention(q, k, v, causal=True, return_lse=True)
        print(o.shape, o.dtype, lse.shape)  # (2, 8, 300, 64) float16 (2, 8, 300)
    """
    host = _is_host(q, k, v)
    if host:  # copied anyway: make the copies contiguous so any NumPy view is accepted
        q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    problem = check_layout(q, k, v)
    value = check_scale(scale, problem.d)
    if not isinstance(causal, bool):
        raise ValueError(f"causal={causal!r}: must be True or False")
    if spec is not None:
        _check_spec_fits_call(spec, problem, causal)
        check_spec(spec, problem, check_pointers=not host)

    # Validation is done; from here on the GPU is needed.
    if spec is None:
        spec = select(
            problem.d,
            problem.dtype,
            causal,
            runtime.device_arch(),
            alignment=problem.alignment(pointers=not host),
            gpu_name=runtime.device_name(),
        )
    dq, dk, dv = (runtime.to_device(x) for x in (q, k, v)) if host else (q, k, v)
    o = runtime.empty((problem.b, problem.h, problem.tq, problem.d), problem.dtype)
    lse = runtime.empty((problem.b, problem.h, problem.tq), np.float32)
    runtime.launch(spec, dq, dk, dv, o, lse, value)
    if host:
        o, lse = runtime.to_host(o), runtime.to_host(lse)
    return (o, lse) if return_lse else o


def _is_host(q: Any, k: Any, v: Any) -> bool:
    kinds = [isinstance(x, np.ndarray) for x in (q, k, v)]
    if all(kinds):
        return True
    if any(kinds):
        names = ", ".join(f"{n}={type(x).__name__}" for n, x in zip("qkv", (q, k, v), strict=True))
        raise ValueError(
            f"{names}: mixed host and device arrays; pass all three as NumPy arrays or all "
            "three as GPUArrays"
        )
    return False


def _check_spec_fits_call(spec: KernelSpec, problem: Problem, causal: bool) -> None:
    if not isinstance(spec, KernelSpec):
        raise ValueError(
            f"spec={spec!r}: must be a KernelSpec; e.g. KernelSpec(d=64, dtype='fp16')"
        )
    if spec.causal != causal:
        raise ValueError(
            f"causal={causal}: spec {spec.name} is compiled with causal={spec.causal}; "
            f"pass causal={spec.causal} or a spec with causal={causal}"
        )
    # d and dtype: check_spec names them with the same value/rule/fix shape
