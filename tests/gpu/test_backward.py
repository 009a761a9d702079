"""The backward variants on the GPU: dQ, dK, dV of every shipped one against the float64 oracle.

Every shipped variant runs in both modes: the fast one (dQ by fp32 atomics) and the
deterministic one (feature `deterministic`: dQ's sums in a fixed order), and the
deterministic one must also give bit-identical gradients on two runs of a problem with many key
and query tiles.

For each variant and each pinned problem: the forward (the runtime's mma path, at the family's
default tile) writes O and LSE, the backward computes the gradients into NaN-poisoned arrays,
and `oracle_bwd.check_grads` applies FlashAttention's gradient rule (error <= 2x a same-
precision reference's error against float64, plus one storage ulp at max|g64|). The problems
cover one token, ragged Tq and Tk (not multiples of the tiles, primes), Tq != Tk both ways,
causal with Tq > Tk (rows that see no key: their dQ must be exactly zero), grouped-query heads
(groups of 2 and 4), every tensor in its own strided layout, and logits scaled up to +-30.

The run-time features (a sliding window, softcap, ALiBi) have probes of their own: backward
variants of both families compiled with them, run after the forward variant with the same
features, on problems chosen for each feature (empty, one-sided and over-wide windows, softcaps
from 0.5 to 50 on logits up to +-30, ALiBi slopes 2^(-8 (i + 1) / H) and steeper), judged by the
same rule with the same feature values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from flashgen.generator import backward as bwd_shape
from flashgen.generator.compile import CompiledKernel
from flashgen.generator.dtypes import DTYPES
from flashgen.generator.features import FeatureArgs
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.runtime import backward
from flashgen.runtime import gpu as runtime
from flashgen.runtime.validate import check_scale
from flashgen.verify.checks import Case, compile_all, layout_backing, layout_view, make_inputs
from flashgen.verify.oracle import visible
from flashgen.verify.oracle_bwd import GradOutcome, check_grads

pytestmark = pytest.mark.gpu

# Shipped variants (both modes), plus probes at a head dim that is padded in-kernel (40 -> 48).
PROBE = KernelSpec(family="mma", d=40, dtype="fp16", causal=True, direction="bwd")
# Unshipped wgmma backward tiles (sm_90a): one and two consumers, d 64/128, both dtypes; and head
# dims that are not a multiple of 64 (run at d_pad: 96 and 72 -> 128, 40 -> 64). 64-row query
# tiles by name: d 64's default is the 128-row tile (shipped, and the probes below).
WGMMA_PROBES = [
    KernelSpec(family="wgmma", direction="bwd", d=d, br=64, bc=bc, dtype=dt, causal=c)
    for d, bc, dt, c in ((64, 128, "bf16", True), (128, 128, "bf16", False),
                         (128, 64, "fp16", True), (64, 64, "fp16", False),
                         (96, 128, "bf16", True), (96, 128, "fp16", False),
                         (72, 128, "bf16", False), (40, 64, "fp16", True),
                         (24, 128, "bf16", False))
] + [  # d 64's 128 x 128 tile
    KernelSpec(family="wgmma", direction="bwd", d=64, br=128, bc=128, dtype=dt, causal=c)
    for dt, c in (("bf16", True), ("fp16", False))
]  # fmt: skip
SPECS = shipped(direction="bwd") + [PROBE, PROBE.replace(features=("deterministic",))]
SPECS += WGMMA_PROBES
# the wgmma deterministic mode with one consumer (bc 64: one dQ region, no turns)
SPECS += [WGMMA_PROBES[2].replace(features=("deterministic",))]
# and at a padded head dim (d 96 run at DP 128: the semaphores after a DP-wide accumulator)
SPECS += [WGMMA_PROBES[4].replace(features=("deterministic",))]
DETERMINISTIC = [s for s in SPECS if bwd_shape.is_deterministic(s)]

# (B, H, H_kv, Tq, Tk, logit_max, layouts of q/k/v/o and of do/dq/dk/dv)
PLAIN = ("bhtd",) * 4
STRIDED = ("bthd", "hbtd", "pad", "bthd")
STRIDED_GRADS = ("pad", "bthd", "hbtd", "pad")
CASES: list[tuple[int, int, int, int, int, float | None, tuple[str, ...], tuple[str, ...]]] = [
    (1, 1, 1, 1, 1, None, PLAIN, PLAIN),
    (2, 2, 2, 97, 131, None, PLAIN, PLAIN),  # ragged, Tq < Tk
    (1, 2, 2, 200, 67, None, PLAIN, PLAIN),  # Tq > Tk: causal rows with no key
    (1, 4, 2, 130, 130, 30.0, PLAIN, PLAIN),  # GQA group 2, logits up to +-30
    (2, 4, 1, 64, 193, 30.0, STRIDED, STRIDED_GRADS),  # group 4 (MQA), strided everything
    (1, 8, 2, 257, 129, 30.0, STRIDED, STRIDED_GRADS),  # group 4, Tq > Tk, ragged
]


def _device_view(x: np.ndarray, layout: str, fill: float = 0.0) -> Any:
    from pycuda import gpuarray

    backing = layout_backing(x, layout, fill=fill)
    buf = runtime.to_device(backing)
    view = layout_view(backing, layout, x.shape[3])
    return gpuarray.GPUArray(view.shape, buf.dtype, gpudata=buf.gpudata, strides=view.strides,
                             base=buf)  # fmt: skip


def _poisoned(shape: tuple[int, ...], dtype: str, layout: str) -> tuple[Any, Any]:
    """A NaN-filled device buffer holding a (B, H, T, d) array in `layout`: (buffer, view)."""
    from pycuda import gpuarray

    host = layout_backing(np.zeros(shape, np.dtype(DTYPES[dtype].numpy)), layout, fill=0.0)
    buf = runtime.empty(host.shape, dtype)
    runtime.poison(int(buf.gpudata), host.size, dtype)
    view = layout_view(host, layout, shape[3])
    return buf, gpuarray.GPUArray(view.shape, buf.dtype, gpudata=buf.gpudata,
                                  strides=view.strides, base=buf)  # fmt: skip


def _read(buf: Any, layout: str, d: int, pads: bool = False) -> np.ndarray:
    """The (B, H, T, d) array of a gradient buffer; with `pads`, first check that the kernels
    wrote nothing past d (the "pad" layout's columns keep _poisoned's NaN)."""
    host = runtime.to_host(buf)
    if pads and layout == "pad":
        assert np.isnan(host[..., d:].astype(np.float32)).all(), f"written past d={d}"
    return np.array(layout_view(host, layout, d))


Grads = tuple[np.ndarray, np.ndarray, np.ndarray]
Inputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _forward_of(spec: KernelSpec) -> KernelSpec:
    """The forward that writes O and LSE for backward `spec`: family mma at its default tile,
    compiled with the backward's run-time features (`deterministic` is the backward's own)."""
    feats = tuple(f for f in spec.features if f != bwd_shape.DETERMINISTIC)
    return KernelSpec(family="mma", d=spec.d, dtype=spec.dtype, causal=spec.causal, features=feats)


def _run_case(
    spec: KernelSpec,
    case: tuple[int, int, int, int, int, float | None, tuple[str, ...], tuple[str, ...]],
    runs: int = 1,
    *,
    window: tuple[int, int] | None = None,
    softcap: float | None = None,
    alibi_slopes: np.ndarray | None = None,
) -> tuple[Inputs, list[Grads]]:
    """The forward once, then `runs` backward launches of `spec` (each into fresh NaN-poisoned
    gradients): the host inputs (q, k, v, do) and each run's (dq, dk, dv). The features'
    values (window, softcap, host ALiBi slopes) go to both passes; the slopes as one device
    array, the forward's by pointer."""
    b, h, h_kv, tq, tk, logit_max, lay, glay = case
    fwd = _forward_of(spec)
    seed = (tq * 7919 + tk * 31 + h) % 2**31
    q, k, v = make_inputs(fwd, Case(b, h, tq, tk, logit_max=logit_max, seed=seed, h_kv=h_kv))
    scale = check_scale(None, spec.d)
    store = np.dtype(spec.dtype_info.numpy)
    do = np.random.default_rng(seed + 1).standard_normal((b, h, tq, spec.d)).astype(store)

    qd, kd, vd = (_device_view(x, la) for x, la in ((q, lay[0]), (k, lay[1]), (v, lay[2])))
    _, o = _poisoned((b, h, tq, spec.d), spec.dtype, lay[3])
    lse = runtime.empty((b, h, tq), np.float32)
    slopes = None if alibi_slopes is None else runtime.to_device(alibi_slopes.astype(np.float32))
    feats = FeatureArgs(
        window=window, softcap=softcap, alibi=None if slopes is None else int(slopes.gpudata)
    )
    runtime.launch(fwd, qd, kd, vd, o, lse, scale, features=feats)
    # the backward's feature keywords only where the call has features (plain calls unchanged)
    bwd_feats: dict[str, Any] = {}
    if feats.tokens:
        bwd_feats = {"window": window, "softcap": softcap, "alibi_slopes": slopes}

    # family wgmma: dO's pad columns NaN (its TMA maps end at d; nothing else reads dO's rows
    # past d), and the gradients' pads checked untouched
    wgmma = spec.family == "wgmma"
    dod = _device_view(do, glay[0], fill=np.nan if wgmma else 0.0)
    results = []
    for _ in range(runs):
        dq_buf, dq = _poisoned(q.shape, spec.dtype, glay[1])
        dk_buf, dk = _poisoned(k.shape, spec.dtype, glay[2])
        dv_buf, dv = _poisoned(v.shape, spec.dtype, glay[3])
        backward.launch_backward(spec, qd, kd, vd, o, lse, dod, dq, dk, dv, scale, **bwd_feats)
        results.append((
            _read(dq_buf, glay[1], spec.d, pads=wgmma),
            _read(dk_buf, glay[2], spec.d, pads=wgmma),
            _read(dv_buf, glay[3], spec.d, pads=wgmma),
        ))  # fmt: skip
    return (q, k, v, do), results


def _require_built(
    compiled: dict[KernelSpec, CompiledKernel | Exception], spec: KernelSpec
) -> None:
    built = compiled[spec]
    if isinstance(built, Exception):
        pytest.fail(f"{spec.name} did not compile: {built}", pytrace=False)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}H{c[1]}kv{c[2]}q{c[3]}k{c[4]}")
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_backward_matches_the_oracle(
    spec: KernelSpec,
    case: tuple[int, int, int, int, int, float | None, tuple[str, ...], tuple[str, ...]],
    compiled: dict[KernelSpec, CompiledKernel | Exception],
) -> None:
    _require_built(compiled, spec)
    b, h, h_kv, tq, tk = case[:5]
    (q, k, v, do), [got] = _run_case(spec, case)
    scale = check_scale(None, spec.d)
    outcomes = check_grads(got, q, k, v, do, dtype=spec.dtype, scale=scale, causal=spec.causal)
    bad = [
        f"{g.name}: err {g.err:.3g} > bound {g.bound:.3g} (ref err {g.ref_err:.3g}, eps "
        f"{g.eps:.3g}){' NaN' if g.has_nan else ''}"
        for g in outcomes
        if not g.passed
    ]
    assert not bad, f"{spec.name} B={b} H={h} H_kv={h_kv} Tq={tq} Tk={tk}: " + "; ".join(bad)
    if spec.causal and tq > tk:  # rows that see no key get exactly zero dQ
        assert not np.any(got[0][:, :, : tq - tk].astype(np.float32)), "no-key rows of dQ"


# Many key and query tiles (1000 = 15 full tiles of 64 and a ragged one), GQA, logits to +-30:
# every dQ element sums 16 key tiles, every dK/dV element 16 query tiles x 2 heads.
REPEAT_CASES = [
    (2, 4, 2, 1000, 1000, 30.0, PLAIN, PLAIN),
    (1, 4, 4, 1000, 777, None, STRIDED, STRIDED_GRADS),  # Tq > Tk: causal rows with no key
]


@pytest.mark.parametrize("case", REPEAT_CASES, ids=lambda c: "B{}H{}kv{}q{}k{}".format(*c[:5]))
@pytest.mark.parametrize("spec", DETERMINISTIC, ids=lambda s: s.name)
def test_the_deterministic_mode_gives_bit_identical_gradients_run_to_run(
    spec: KernelSpec,
    case: tuple[int, int, int, int, int, float | None, tuple[str, ...], tuple[str, ...]],
    compiled: dict[KernelSpec, CompiledKernel | Exception],
) -> None:
    _require_built(compiled, spec)
    (q, k, v, do), runs = _run_case(spec, case, runs=3)
    first = runs[0]
    for again in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), first, again, strict=True):
            # compare the bits (uint16 views): NaN == NaN would not hold as floats
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), f"{name} differs"
    scale = check_scale(None, spec.d)
    outcomes = check_grads(first, q, k, v, do, dtype=spec.dtype, scale=scale, causal=spec.causal)
    bad = [f"{g.name}: err {g.err:.3g} > bound {g.bound:.3g}" for g in outcomes if not g.passed]
    assert not bad, f"{spec.name} {case[:5]}: " + "; ".join(bad)


# ---- run-time features: window, softcap, ALiBi --------------------------------------------------


@dataclass(frozen=True)
class Unbuilt:
    """A feature probe that cannot run here: KernelSpec refused it (the backward does not take
    these features) or its family does not run on this GPU. Never compiled (not a KernelSpec)."""

    label: str
    reason: str
    refused: bool  # by KernelSpec (the test fails, naming why); else not for this GPU (skipped)


def _runs_here(spec: KernelSpec) -> str | None:
    """Why `spec`'s family cannot run on this GPU (wgmma: sm_90a only), or None. None without
    a usable GPU too: the tier's conftest skips every test then."""
    if runtime.gpu_status() is not None:
        return None
    try:
        runtime.kernel_arch(spec)
    except runtime.GpuUnavailable as exc:
        return str(exc)
    return None


def _bwd_spec(
    family: str, d: int, dtype: str, causal: bool, features: tuple[str, ...],
    **tile: int,
) -> KernelSpec | Unbuilt:  # fmt: skip
    label = f"{family}-d{d}-{dtype}-{'causal' if causal else 'noncausal'}-{'+'.join(features)}"
    label += "".join(f"-{k}{v}" for k, v in tile.items())
    try:
        spec = KernelSpec(
            family=family, d=d, dtype=dtype, causal=causal, direction="bwd", features=features,
            **tile,  # type: ignore[arg-type]
        )  # fmt: skip
    except SpecError as exc:  # reported by the test (a failure), not at collection
        return Unbuilt(label, f"KernelSpec refuses {label}: {exc}", refused=True)
    reason = _runs_here(spec)
    return spec if reason is None else Unbuilt(label, reason, refused=False)


def _side(n: int) -> str:
    return "inf" if n < 0 else str(n)


# (B, H, H_kv, Tq, Tk, logit_max, layouts of q/k/v/o, of do/dq/dk/dv), as in CASES
ProblemCase = tuple[int, int, int, int, int, float | None, tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True)
class FeatureProblem:
    """One problem for a feature variant: sizes, logit magnitude, layouts, feature values."""

    shape: tuple[int, int, int, int, int]  # (B, H, H_kv, Tq, Tk)
    logit_max: float | None = None
    window: tuple[int, int] | None = None  # (left, right), -1: unbounded side
    softcap: float | None = None
    alibi: float | None = None  # slopes alibi * 2^(-8 (i + 1) / H) for query head i
    strided: bool = False  # every tensor (inputs and gradients) in its own strided layout

    @property
    def case(self) -> ProblemCase:
        lay, glay = (STRIDED, STRIDED_GRADS) if self.strided else (PLAIN, PLAIN)
        return (*self.shape, self.logit_max, lay, glay)

    def slopes(self) -> np.ndarray | None:
        if self.alibi is None:
            return None
        h = self.shape[1]
        return (self.alibi * 2.0 ** (-8.0 * (np.arange(h) + 1) / h)).astype(np.float32)

    @property
    def label(self) -> str:
        b, h, h_kv, tq, tk = self.shape
        parts = [f"B{b}H{h}kv{h_kv}q{tq}k{tk}"]
        if self.logit_max is not None:
            parts.append(f"logits{self.logit_max:g}")
        if self.window is not None:
            parts.append(f"win{_side(self.window[0])},{_side(self.window[1])}")
        if self.softcap is not None:
            parts.append(f"cap{self.softcap:g}")
        if self.alibi is not None:
            parts.append(f"alibi{self.alibi:g}")
        if self.strided:
            parts.append("strided")
        return "-".join(parts)


FP = FeatureProblem
# windows: two-sided on ragged Tq < Tk; empty (0, 0) with Tq > Tk (rows and keys that see
# nothing; with causal the diagonal only); left only (GQA 4, strided); right only (MQA); wider
# than the sequence (a left side >= Tk, a right side >= Tq reaches every key: passed as
# unbounded, features.FeatureArgs.kernel_args); many tiles
# outside the window on both sides
W2 = FP((2, 2, 2, 97, 131), window=(16, 8))
W_EMPTY = FP((1, 2, 2, 200, 67), window=(0, 0))
W_LEFT = FP((1, 8, 2, 257, 129), 30.0, window=(40, -1), strided=True)
W_RIGHT = FP((2, 4, 1, 64, 193), 30.0, window=(-1, 24))
W_WIDE = FP((1, 4, 2, 130, 130), window=(150, 200))
W_TILES = FP((1, 2, 1, 600, 900), window=(100, 50))
WINDOW = [W2, W_EMPTY, W_LEFT, W_RIGHT, W_WIDE, W_TILES]
# softcaps from far below the logits (tanh saturated: dS nearly zero) to above them
S_SMALL = FP((2, 2, 2, 97, 131), 30.0, softcap=0.5)
S_MID = FP((1, 8, 2, 257, 129), 30.0, softcap=5.0, strided=True)
S_LARGE = FP((1, 2, 2, 200, 67), 30.0, softcap=50.0)
SOFTCAP = [S_SMALL, S_MID, S_LARGE]
# ALiBi: one slope per query head (GQA heads differ), and steep slopes (0.5 .. 0.03 at H = 2)
A_TALL = FP((1, 2, 2, 200, 67), alibi=1.0)
A_GQA = FP((1, 8, 2, 257, 129), 30.0, alibi=1.0, strided=True)
A_STEEP = FP((2, 4, 1, 64, 193), alibi=8.0)
ALIBI = [A_TALL, A_GQA, A_STEEP]
# window + softcap (Gemma 2's pair)
WS_GEMMA = FP((1, 8, 2, 257, 129), 30.0, window=(64, 0), softcap=50.0, strided=True)
WS_EMPTY = FP((2, 2, 2, 97, 131), 30.0, window=(0, 0), softcap=5.0)
WS_RIGHT = FP((1, 4, 2, 130, 130), 30.0, window=(-1, 16), softcap=0.5)
WINDOW_SOFTCAP = [WS_GEMMA, WS_EMPTY, WS_RIGHT]
ALL_THREE = [
    FP((1, 4, 2, 130, 130), 30.0, window=(32, 8), softcap=20.0, alibi=1.0),
    FP((1, 2, 2, 200, 67), window=(16, -1), softcap=30.0, alibi=1.0, strided=True),
]

FEATURE_SETS: list[tuple[tuple[str, ...], list[FeatureProblem]]] = [
    (("window",), WINDOW),
    (("softcap",), SOFTCAP),
    (("alibi",), ALIBI),
    (("window", "softcap"), WINDOW_SOFTCAP),
]
# family wgmma (d 64/128): each feature set at both head dims, dtype and causal varied, two
# problems each; all three features once (flashgen.torch sends such a call to wgmma on sm_90)
WGMMA_FEATURES: list[tuple[tuple[str, ...], int, str, bool, list[FeatureProblem]]] = [
    (("window",), 64, "bf16", True, [W_EMPTY, W_LEFT]),
    (("window",), 128, "fp16", False, [W_RIGHT, W_TILES]),
    (("softcap",), 64, "fp16", False, [S_SMALL, S_MID]),
    (("softcap",), 128, "bf16", True, [S_MID, S_LARGE]),
    (("alibi",), 64, "bf16", False, [A_TALL, A_GQA]),
    (("alibi",), 128, "fp16", True, [A_GQA, A_STEEP]),
    (("window", "softcap"), 64, "fp16", True, [WS_GEMMA, WS_EMPTY]),
    (("window", "softcap"), 128, "bf16", False, [WS_GEMMA, WS_RIGHT]),
    (("window", "softcap", "alibi"), 64, "bf16", True, ALL_THREE[:1]),  # flashgen.torch's pick
    (("window", "softcap"), 96, "bf16", True, [WS_GEMMA]),  # d_pad 128
    (("alibi",), 80, "fp16", False, [A_GQA]),
    # the deterministic mode (dQ's adds ordered by semaphores): also bit-identical twice
    (("window", "deterministic"), 128, "bf16", True, [W_LEFT, W_TILES]),
    (("softcap", "deterministic"), 64, "fp16", False, [S_MID]),
]


def _feature_params() -> list[Any]:
    rows: list[tuple[KernelSpec | Unbuilt, FeatureProblem]] = []
    # family mma: every feature set at d 64 and 128, causal and not; fp16 and bf16 alternate
    # so that each set meets both dtypes at both head dims
    for feats, problems in FEATURE_SETS:
        for d in (64, 128):
            for causal in (False, True):
                dtype = "fp16" if (d == 64) == causal else "bf16"
                spec = _bwd_spec("mma", d, dtype, causal, feats)
                rows += [(spec, p) for p in problems]
    rows += [(_bwd_spec("mma", 64, "bf16", True, ("window", "softcap", "alibi")), p)
             for p in ALL_THREE]  # fmt: skip
    # the deterministic mode (dQ without atomics) with a window: also bit-identical twice
    for d, dtype, causal in ((64, "bf16", True), (128, "fp16", False)):
        spec = _bwd_spec("mma", d, dtype, causal, ("window", "deterministic"))
        rows += [(spec, p) for p in (W_EMPTY, W_LEFT, W_TILES)]
    for feats, d, dtype, causal, problems in WGMMA_FEATURES:  # the 64-row tile by name
        spec = _bwd_spec("wgmma", d, dtype, causal, feats, br=64)
        rows += [(spec, p) for p in problems]
    # the 128-row query tile (d 64, bc 128) with the features its rules take: window, ALiBi
    for feats, dtype, causal, problems in ((("window",), "bf16", True, [W_LEFT, W_TILES]),
                                           (("alibi",), "fp16", False, [A_GQA])):  # fmt: skip
        spec = _bwd_spec("wgmma", 64, dtype, causal, feats, br=128, bc=128)
        rows += [(spec, p) for p in problems]
    params = []
    for spec, problem in rows:
        name = spec.label if isinstance(spec, Unbuilt) else spec.name
        marks = []
        if isinstance(spec, Unbuilt) and not spec.refused:
            marks.append(pytest.mark.skip(reason=spec.reason))  # the family is not for this GPU
        params.append(pytest.param(spec, problem, id=f"{name}-{problem.label}", marks=marks))
    return params


FEATURE_PARAMS = _feature_params()
FEATURE_FORWARDS = list(dict.fromkeys(
    _forward_of(p.values[0]) for p in FEATURE_PARAMS if isinstance(p.values[0], KernelSpec)
))  # fmt: skip


@pytest.fixture(scope="module")
def feature_forwards() -> dict[KernelSpec, CompiledKernel | Exception]:
    """The forward variants with features that the feature probes run, compiled in parallel
    (into the cubin cache, which `runtime.launch` then reads)."""
    return compile_all(FEATURE_FORWARDS)


def _failures(outcomes: list[GradOutcome]) -> list[str]:
    return [
        f"{g.name}: err {g.err:.3g} > bound {g.bound:.3g} (ref err {g.ref_err:.3g}, eps "
        f"{g.eps:.3g}){' NaN' if g.has_nan else ''}"
        for g in outcomes
        if not g.passed
    ]


@pytest.mark.parametrize(("spec", "problem"), FEATURE_PARAMS)
def test_backward_with_features_matches_the_oracle(
    spec: KernelSpec | Unbuilt,
    problem: FeatureProblem,
    compiled: dict[KernelSpec, CompiledKernel | Exception],
    feature_forwards: dict[KernelSpec, CompiledKernel | Exception],
) -> None:
    if isinstance(spec, Unbuilt):
        pytest.fail(spec.reason, pytrace=False)
    _require_built(compiled, spec)
    _require_built(feature_forwards, _forward_of(spec))
    b, h, h_kv, tq, tk = problem.shape
    slopes = problem.slopes()
    feats: dict[str, Any] = {
        "window": problem.window, "softcap": problem.softcap, "alibi_slopes": slopes,
    }  # fmt: skip
    runs = 2 if bwd_shape.is_deterministic(spec) else 1
    (q, k, v, do), results = _run_case(spec, problem.case, runs, **feats)
    got = results[0]
    scale = check_scale(None, spec.d)
    outcomes = check_grads(
        got, q, k, v, do, dtype=spec.dtype, scale=scale, causal=spec.causal, **feats
    )
    bad = _failures(outcomes)
    assert not bad, f"{spec.name} {problem.label}: " + "; ".join(bad)
    # rows that see no key get exactly zero dQ; keys no query sees exactly zero dK and dV
    seen = visible(tq, tk, causal=spec.causal, window=problem.window)
    for name, g, empty in (
        ("dq", got[0], ~seen.any(axis=1)), ("dk", got[1], ~seen.any(axis=0)),
        ("dv", got[2], ~seen.any(axis=0)),
    ):  # fmt: skip
        assert not np.any(g[:, :, empty].astype(np.float32)), f"{name}: rows that see nothing"
    for again in results[1:]:  # the deterministic mode: bit-identical on a second run
        for name, a, c in zip(("dq", "dk", "dv"), got, again, strict=True):
            assert np.array_equal(a.view(np.uint16), c.view(np.uint16)), f"{name} differs"
