"""The backward variants on the GPU: dQ, dK, dV of every shipped one against the float64 oracle.

Every shipped variant runs in both modes: the fast one (dQ by fp32 atomics) and the
deterministic one (feature `deterministic`: dQ by its own kernel per query tile), and the
deterministic one must also give bit-identical gradients on two runs of a problem with many key
and query tiles.

For each variant and each pinned problem: the forward (the runtime's mma path, at the family's
default tile) writes O and LSE, the backward computes the gradients into NaN-poisoned arrays,
and `oracle_bwd.check_grads` applies FlashAttention's gradient rule (error <= 2x a same-
precision reference's error against float64, plus one storage ulp at max|g64|). The problems
cover one token, ragged Tq and Tk (not multiples of the tiles, primes), Tq != Tk both ways,
causal with Tq > Tk (rows that see no key: their dQ must be exactly zero), grouped-query heads
(groups of 2 and 4), every tensor in its own strided layout, and logits scaled up to +-30.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flashgen.generator import backward, runtime
from flashgen.generator.checks import Case, layout_backing, layout_view, make_inputs
from flashgen.generator.compile import CompiledKernel
from flashgen.generator.dtypes import DTYPES
from flashgen.generator.oracle_bwd import check_grads
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.generator.validate import check_scale

pytestmark = pytest.mark.gpu

# Shipped variants (both modes), plus probes at a head dim that is padded in-kernel (40 -> 48).
PROBE = KernelSpec(family="mma", d=40, dtype="fp16", causal=True, direction="bwd")
# Unshipped wgmma backward tiles (sm_90a): one and two consumers, d 64/128, both dtypes.
WGMMA_PROBES = [
    KernelSpec(family="wgmma", direction="bwd", d=d, bc=bc, dtype=dt, causal=c)
    for d, bc, dt, c in ((64, 128, "bf16", True), (128, 128, "bf16", False),
                         (128, 64, "fp16", True), (64, 64, "fp16", False))
]  # fmt: skip
SPECS = shipped(direction="bwd") + [PROBE, PROBE.replace(features=("deterministic",))]
SPECS += WGMMA_PROBES
DETERMINISTIC = [s for s in SPECS if backward.is_deterministic(s)]

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


def _device_view(x: np.ndarray, layout: str) -> Any:
    from pycuda import gpuarray

    backing = layout_backing(x, layout, fill=0.0)
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


def _read(buf: Any, layout: str, d: int) -> np.ndarray:
    return np.array(layout_view(runtime.to_host(buf), layout, d))


Grads = tuple[np.ndarray, np.ndarray, np.ndarray]
Inputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _run_case(
    spec: KernelSpec,
    case: tuple[int, int, int, int, int, float | None, tuple[str, ...], tuple[str, ...]],
    runs: int = 1,
) -> tuple[Inputs, list[Grads]]:
    """The forward once, then `runs` backward launches of `spec` (each into fresh NaN-poisoned
    gradients): the host inputs (q, k, v, do) and each run's (dq, dk, dv)."""
    b, h, h_kv, tq, tk, logit_max, lay, glay = case
    fwd = KernelSpec(family="mma", d=spec.d, dtype=spec.dtype, causal=spec.causal)
    seed = (tq * 7919 + tk * 31 + h) % 2**31
    q, k, v = make_inputs(fwd, Case(b, h, tq, tk, logit_max=logit_max, seed=seed, h_kv=h_kv))
    scale = check_scale(None, spec.d)
    store = np.dtype(spec.dtype_info.numpy)
    do = np.random.default_rng(seed + 1).standard_normal((b, h, tq, spec.d)).astype(store)

    qd, kd, vd = (_device_view(x, la) for x, la in ((q, lay[0]), (k, lay[1]), (v, lay[2])))
    _, o = _poisoned((b, h, tq, spec.d), spec.dtype, lay[3])
    lse = runtime.empty((b, h, tq), np.float32)
    runtime.launch(fwd, qd, kd, vd, o, lse, scale)

    dod = _device_view(do, glay[0])
    results = []
    for _ in range(runs):
        dq_buf, dq = _poisoned(q.shape, spec.dtype, glay[1])
        dk_buf, dk = _poisoned(k.shape, spec.dtype, glay[2])
        dv_buf, dv = _poisoned(v.shape, spec.dtype, glay[3])
        backward.launch_backward(spec, qd, kd, vd, o, lse, dod, dq, dk, dv, scale)
        results.append((
            _read(dq_buf, glay[1], spec.d),
            _read(dk_buf, glay[2], spec.d),
            _read(dv_buf, glay[3], spec.d),
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
