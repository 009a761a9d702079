"""Prove variants against the oracle on the GPU: one problem (`check`) or Hypothesis (`fuzz`).

The pieces are shared with the GPU test suite (tests/gpu/): the same problem generator, the
same strategies (`strategies.py`), the same property runner. Outputs are poisoned with NaN
before every launch, so an element a kernel never writes fails the check.
"""

from __future__ import annotations

import hashlib
import math
import os
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashgen.generator.compile import CompiledKernel, compile_kernel
from flashgen.generator.features import RUNTIME_FEATURES, FeatureArgs
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.runtime.gpu import GpuUnavailable
from flashgen.runtime.validate import check_scale
from flashgen.verify.cases import LAYOUTS, Case, feature_pairs
from flashgen.verify.oracle import check_outputs, error_ratio, feature_values, max_abs_logit

__all__ = [
    "LAYOUTS",
    "Case",
    "CheckResult",
    "GpuUnavailable",
    "MAX_CHECK_ELEMENTS",
    "VariantResult",
    "check_problem",
    "check_variant",
    "compile_all",
    "failure_text",
    "gpu_execute",
    "layout_backing",
    "layout_view",
    "make_inputs",
    "property_check",
    "run_case",
    "run_fuzz",
]

# Input entries are kept below this many standard deviations' worth of scaling, so reaching a
# target logit on a degenerate problem (Tq = Tk = 1, q.k ~ 0) never overflows fp16.
MAX_INPUT_GAIN = 64.0
# `check_variant` generates Q, K and V on the host for the float64 oracle: a problem with more
# elements than this (b*h*(tq + 2*tk)*d; 512 MiB as float64) is refused before anything is
# allocated, so a typo (`--tq 2000000000`) is an error, not an out-of-memory crash.
MAX_CHECK_ELEMENTS = 1 << 26


PAD_ELEMS = 8  # extra elements per padded row: 16 bytes in fp16/bf16, 32 in fp32
V_CLIP = 1e4


def layout_backing(x: np.ndarray, layout: str, fill: float | None = None) -> np.ndarray:
    """The contiguous buffer that holds (B, H, T, d) `x` in `layout` (`fill`: pad value)."""
    if layout == "bhtd":
        return np.ascontiguousarray(x)
    if layout == "bthd":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    if layout == "hbtd":
        return np.ascontiguousarray(x.transpose(1, 0, 2, 3))
    if layout == "pad":
        b, h, t, d = x.shape
        out = np.full((b, h, t, d + PAD_ELEMS), np.nan if fill is None else fill, x.dtype)
        out[..., :d] = x
        return out
    raise ValueError(f"layout={layout!r}: unknown; choose one of {', '.join(LAYOUTS)}")


def layout_view(backing: np.ndarray, layout: str, d: int) -> np.ndarray:
    """The (B, H, T, d) view of a buffer made by `layout_backing` (shares its memory)."""
    if layout == "bhtd":
        return backing
    if layout in ("bthd", "hbtd"):
        view: np.ndarray = backing.transpose((0, 2, 1, 3) if layout == "bthd" else (1, 0, 2, 3))
        return view
    if layout == "pad":
        return backing[..., :d]
    raise ValueError(f"layout={layout!r}: unknown; choose one of {', '.join(LAYOUTS)}")


@dataclass(frozen=True)
class CheckResult:
    """One variant on one problem, judged by the correctness rule (docs/design.md)."""

    spec: KernelSpec
    b: int
    h: int
    tq: int
    tk: int
    o_err: float
    o_bound: float
    lse_err: float
    lse_bound: float
    has_nan: bool
    passed: bool
    scale: float
    seed: int

    @property
    def ratio(self) -> float:
        """The worse of error/bound for O and LSE: <= 1 passes, inf on NaN."""
        if self.has_nan:
            return math.inf
        return max(error_ratio(self.o_err, self.o_bound), error_ratio(self.lse_err, self.lse_bound))

    def describe(self) -> str:
        """One line: the problem, both errors against their bounds, the verdict."""
        verdict = "pass" if self.passed else "FAIL"
        nan = " NaN in output;" if self.has_nan else ""
        return (
            f"{verdict}: {self.spec.name} B={self.b} H={self.h} Tq={self.tq} Tk={self.tk} "
            f"scale={self.scale:.6g} seed={self.seed}:{nan} O err {self.o_err:.3g} "
            f"(bound {self.o_bound:.3g}), LSE err {self.lse_err:.3g} (bound {self.lse_bound:.3g})"
        )


@dataclass(frozen=True)
class VariantResult:
    """The property run of one variant: examples run, worst error/bound, and the failure."""

    spec: KernelSpec
    examples: int
    worst_ratio: float
    passed: bool
    failure: str | None


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]
# Runs a variant on host inputs and returns host (O, LSE); the GPU by default, replaceable so
# the property machinery itself can be tested on a CPU.
Execute = Callable[[KernelSpec, np.ndarray, np.ndarray, np.ndarray, float], tuple[Any, Any]]


def make_inputs(spec: KernelSpec, case: Case) -> Arrays:
    """Seeded random Q, K, V of the case's sizes, rounded to the spec's storage dtype."""
    rng = np.random.default_rng(case.seed)
    q = rng.standard_normal((case.b, case.h, case.tq, spec.d))
    k = rng.standard_normal((case.b, case.kv_heads, case.tk, spec.d))
    shape_v = (case.b, case.kv_heads, case.tk, spec.dv)
    if case.v_dof is None:
        v = rng.standard_normal(shape_v)
    else:
        v = np.clip(rng.standard_t(case.v_dof, shape_v), -V_CLIP, V_CLIP)
    v = v + case.v_mean
    if case.logit_max is not None:
        peak = max_abs_logit(q, k, check_scale(case.scale, spec.d))
        gain = math.sqrt(case.logit_max / peak) if peak > 0 else MAX_INPUT_GAIN
        gain = min(gain, MAX_INPUT_GAIN)
        q, k = q * gain, k * gain
    store = np.dtype(spec.dtype_info.numpy)
    return q.astype(store), k.astype(store), v.astype(store)


def gpu_execute(
    spec: KernelSpec,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    layouts: tuple[str, str, str, str] | None = None,
    **features: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """Run `spec` on the GPU with NaN-poisoned outputs; return host (O, LSE).

    `layouts` (q, k, v, o; see LAYOUTS) places each tensor in its own memory layout; O's
    whole buffer is poisoned, so a write outside O's view (into padding) is reported.
    The features' oracle values by keyword (`window=`, `softcap=`, `alibi_slopes=`) go to a
    variant compiled with them; an array-valued one (ALiBi's slopes) is copied to the GPU.
    """
    b, h, tq, _ = q.shape
    d = v.shape[3]  # o has v's head dim
    lq, lk, lv, lo = layouts or ("bhtd",) * 4
    dq, dk, dv = (_device_view(x, lay) for x, lay in ((q, lq), (k, lk), (v, lv)))
    o_host = layout_backing(np.zeros((b, h, tq, d), q.dtype), lo)
    o_buf = runtime.empty(o_host.shape, spec.dtype)
    runtime.poison(int(o_buf.gpudata), o_host.size, spec.dtype)
    o = _gpu_view(o_buf, layout_view(o_host, lo, d))
    lse = runtime.empty((b, h, tq), np.float32)
    runtime.poison(int(lse.gpudata), b * h * tq, "fp32")
    values, arrays = {}, []
    for feature, value in feature_values(features):
        if value is not None and feature.array:
            arrays.append(runtime.to_device(np.asarray(value, np.float32)))
            value = int(arrays[-1].gpudata)
        values[feature.token] = feature.check(value)
    feats = FeatureArgs(**values)
    runtime.launch(spec, dq, dk, dv, o, lse, scale, features=feats)  # waits: arrays outlive it
    backing = runtime.to_host(o_buf)
    out = np.array(layout_view(backing, lo, d))
    if lo == "pad" and not np.isnan(backing[..., d:].astype(np.float32)).all():
        raise AssertionError(f"{spec.name}: the kernel wrote into o's row padding (layout pad)")
    return out, runtime.to_host(lse)


def _gpu_view(buf: Any, view: np.ndarray) -> Any:
    """A GPUArray with `view`'s shape and byte strides over the device buffer `buf`."""
    from pycuda import gpuarray

    return gpuarray.GPUArray(
        view.shape, buf.dtype, gpudata=buf.gpudata, strides=view.strides, base=buf
    )


def _device_view(x: np.ndarray, layout: str) -> Any:
    backing = layout_backing(x, layout, fill=0.0)
    return _gpu_view(runtime.to_device(backing), layout_view(backing, layout, x.shape[3]))


def run_case(spec: KernelSpec, case: Case, execute: Execute | None = None) -> CheckResult:
    """Generate the case's inputs, run the variant, and judge the outputs."""
    q, k, v = make_inputs(spec, case)
    scale = check_scale(case.scale, spec.d)
    feats = case.feature_kwargs()
    if execute is None:
        o, lse = gpu_execute(spec, q, k, v, scale, case.layouts, **feats)
    elif case.has_features:
        o, lse = execute(spec, q, k, v, scale, **feats)
    else:
        o, lse = execute(spec, q, k, v, scale)
    out = check_outputs(
        np.asarray(o), np.asarray(lse), q, k, v, causal=spec.causal, scale=scale,
        dtype=spec.dtype, **feats,
    )  # fmt: skip
    return CheckResult(
        spec, case.b, case.h, case.tq, case.tk, out.o_err, out.o_bound, out.lse_err,
        out.lse_bound, out.has_nan, out.passed, scale, case.seed,
    )  # fmt: skip


def check_problem(
    spec: KernelSpec, *, b: int, h: int, tq: int, tk: int, seed: int, scale: float | None
) -> float:
    """Validate a `check_variant` request before anything is allocated; return the scale.

    Sizes must be >= 1 and fit MAX_CHECK_ELEMENTS, the seed >= 0 (NumPy's generators take no
    negative seed), the scale what `validate.check_scale` accepts. Raises ValueError.
    """
    if spec.direction == "decode":
        raise ValueError(
            f"{spec.name}: a decode variant; `check` runs forward and backward variants (decode "
            "kernels are checked by tests/gpu/test_decode.py and run through "
            "flashgen.torch.attention_with_kvcache)"
        )
    if "varlen" in spec.features:
        raise ValueError(
            f"{spec.name}: a varlen variant; `check` runs dense batches (varlen kernels are "
            "checked by tests/gpu/test_varlen.py and run through "
            "flashgen.torch.flash_attn_varlen_func)"
        )
    for label, value in (("b", b), ("h", h), ("tq", tq), ("tk", tk)):
        if value < 1:
            raise ValueError(f"{label}={value}: must be >= 1; attention needs a non-empty problem")
    elements = b * h * (tq + tk) * spec.d + b * h * (tq + tk) * spec.dv
    if elements > MAX_CHECK_ELEMENTS:
        raise ValueError(
            f"b*h*(tq+2*tk)*d={elements:,} elements: a check holds its inputs on the host for "
            f"the float64 oracle, at most {MAX_CHECK_ELEMENTS:,}; pick smaller sizes"
        )
    if seed < 0:
        raise ValueError(f"seed={seed}: must be >= 0; pass a non-negative seed")
    return check_scale(scale, spec.d)


def check_variant(
    spec: KernelSpec,
    *,
    b: int,
    h: int,
    tq: int,
    tk: int,
    seed: int,
    scale: float | None = None,
    logit_max: float | None = None,
    execute: Execute | None = None,
) -> CheckResult:
    """Run one variant on one random problem (standard normal inputs unless `logit_max`); a
    feature variant runs with each feature's `check_value` (a window of 64 keys back and 16
    ahead, a softcap of 30, ALiBi slopes 0.5 * 2^(-8 (h + 1) / H)).

    The request is validated first (`check_problem`: ValueError before any allocation).
    """
    check_problem(spec, b=b, h=h, tq=tq, tk=tk, seed=seed, scale=scale)
    feats = {f.token: f.check_value for f in RUNTIME_FEATURES if f.token in spec.features}
    case = Case(b, h, tq, tk, scale, logit_max, seed, features=feature_pairs(**feats))
    return run_case(spec, case, execute)


def compile_all(
    specs: Sequence[KernelSpec],
    *,
    arch: str | None = None,
    workers: int | None = None,
) -> dict[KernelSpec, CompiledKernel | Exception]:
    """Compile every spec in parallel (nvcc runs as subprocesses); failures are returned.

    `arch=None` compiles each variant for the local GPU (`runtime.kernel_arch`).
    """
    archs = {s: arch or runtime.kernel_arch(s) for s in specs}  # in this thread: may start CUDA
    out: dict[KernelSpec, CompiledKernel | Exception] = {}

    def one(spec: KernelSpec) -> CompiledKernel | Exception:
        try:
            return compile_kernel(spec, archs[spec])
        except Exception as exc:  # reported per variant; one broken variant stops nothing
            return exc

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 4) as pool:
        for spec, result in zip(specs, pool.map(one, specs), strict=True):
            out[spec] = result
    return out


def _stable_seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def failure_text(exc: BaseException) -> str:
    """The exception and Hypothesis' notes (the falsifying example), as text."""
    subs = getattr(exc, "exceptions", None)
    if subs:  # several distinct failures: an ExceptionGroup
        return "\n".join(failure_text(e) for e in subs)
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    # Python >= 3.11 prints the notes itself; 3.10 does not
    missing = [n for n in getattr(exc, "__notes__", ()) if n not in text]
    return "\n".join([text, *missing])


def property_check(
    spec: KernelSpec,
    *,
    examples: int,
    profile: str | None = None,
    compiled: CompiledKernel | None = None,
    execute: Execute | None = None,
    shrink: bool = True,
) -> VariantResult:
    """Hypothesis over random problems for one variant, plus the pinned examples.

    Records how many problems ran and the worst error/bound; on a failure Hypothesis shrinks
    to a minimal problem (unless `shrink=False`) and `failure` carries it. Under a
    derandomized profile each variant gets its own fixed seed, so variants see different
    problems and every run sees the same ones.
    """
    from hypothesis import Phase, example, given, seed, settings

    from flashgen.verify.strategies import cases, pinned_cases, settings_for

    if execute is None:
        try:
            runtime.get_function(spec, compiled)  # compile and load once, outside Hypothesis
        except GpuUnavailable:
            raise
        except Exception as exc:
            return VariantResult(spec, 0, math.inf, False, f"load failed: {failure_text(exc)}")

    runs = [0]
    worst = [0.0]

    def prop(case: Case) -> None:
        result = run_case(spec, case, execute)
        runs[0] += 1
        worst[0] = max(worst[0], result.ratio)
        if not result.passed:  # not `assert`: python -O must not turn the check off
            raise AssertionError(result.describe())

    base = settings_for(profile)
    phases = tuple(p for p in base.phases if shrink or p != Phase.shrink)
    test: Any = given(case=cases(spec))(prop)
    for pinned in reversed(pinned_cases(spec)):  # the outermost @example runs first
        test = example(case=pinned)(test)
    test = settings(base, max_examples=examples, phases=phases)(test)
    if base.derandomize:
        test = seed(_stable_seed(spec.name))(test)
    try:
        test()
    except GpuUnavailable:
        raise
    except Exception as exc:  # the property failed (or Hypothesis gave up): report it
        return VariantResult(spec, runs[0], worst[0], False, failure_text(exc))
    return VariantResult(spec, runs[0], worst[0], True, None)


def run_fuzz(
    family: str | None,
    examples: int | None,
    profile: str | None,
    progress: Callable[[VariantResult], None] | None = None,
    *,
    specs: Iterable[KernelSpec] | None = None,
    shrink: bool = True,
) -> list[VariantResult]:
    """The property suite over every shipped variant (of `family`, or all); one result each.

    Compiles every variant in parallel first, so the run is bound by the GPU. `examples=None`
    takes the profile's per-variant count (FLASHGEN_GPU_EXAMPLES overrides it); `progress` is
    called with each variant's result as soon as it is known.
    """
    from flashgen.verify.strategies import gpu_examples

    todo = list(specs) if specs is not None else shipped(family)
    count = examples if examples is not None else gpu_examples(profile)
    runtime.gpu()  # no GPU: one GpuUnavailable now, not one per variant
    compiled = compile_all(todo)
    results = []
    for spec in todo:
        built = compiled[spec]
        if isinstance(built, Exception):
            result = VariantResult(spec, 0, math.inf, False, f"compile failed: {built}")
        else:
            result = property_check(
                spec, examples=count, profile=profile, compiled=built, shrink=shrink
            )
        results.append(result)
        if progress is not None:
            progress(result)
    return results
