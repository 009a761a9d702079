"""Real CUDA-array-interface arrays (CuPy) through the launcher: pointer, strides, results.

CuPy arrays expose shape, strides and dtype as attributes and their pointer only through
`__cuda_array_interface__` (issue 9: validation once read the attributes and lost the
pointer). CuPy shares the device's primary context with flashgen's runtime. Skipped cleanly
when CuPy is not installed (cupy-cuda13x on the GPU host).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flashgen.generator.compile import CompiledKernel
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.runtime.validate import describe
from flashgen.verify.oracle import check_outputs

pytestmark = pytest.mark.gpu

# CuPy has no bfloat16: one fp16 (else fp32) variant per family, causal and not
CUPY_DTYPES = ("fp16", "fp32")


def _one_per_family() -> list[KernelSpec]:
    out: list[KernelSpec] = []
    for family in sorted({s.family for s in shipped()}):
        for causal in (False, True):
            fits = [s for s in shipped(family) if s.dtype in CUPY_DTYPES and s.causal == causal]
            if fits:
                out.append(min(fits, key=lambda s: (CUPY_DTYPES.index(s.dtype), s.d != 64)))
    return out


SPECS = _one_per_family()


def _cupy() -> Any:
    return pytest.importorskip("cupy", reason="CuPy is not installed (pip install cupy-cuda13x)")


def _load(spec: KernelSpec, compiled: dict[KernelSpec, CompiledKernel | Exception]) -> None:
    built = compiled[spec]
    if isinstance(built, Exception):
        pytest.fail(f"{spec.name} did not compile: {built}", pytrace=False)
    runtime.get_function(spec, built)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_cupy_arrays_strided_views_included_give_the_oracles_answer(
    spec: KernelSpec, compiled: dict[KernelSpec, CompiledKernel | Exception]
) -> None:
    cp = _cupy()
    _load(spec, compiled)
    b, h, tq, tk, d = 2, 3, 77, 130, spec.d
    store = np.dtype(spec.dtype_info.numpy)
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((b, h, t, d)).astype(store) for t in (tq, tk, tk))
    # q contiguous; k in BTHD order viewed as BHTD; v with padded rows; o strided too
    cq = cp.asarray(q)
    ck = cp.asarray(np.ascontiguousarray(k.transpose(0, 2, 1, 3))).transpose(0, 2, 1, 3)
    pad = cp.zeros((b, h, tk, d + 8), dtype=store)
    pad[..., :d] = cp.asarray(v)
    cv = pad[..., :d]
    o_pad = cp.full((b, h, tq, d + 16), cp.nan, dtype=store)
    co = o_pad[..., 8 : 8 + d]  # 8 elements in: 16 bytes or more, as every family needs
    lse = cp.full((b, h, tq), cp.nan, dtype=cp.float32)
    info = describe("k", ck)
    assert info.ptr == ck.data.ptr and info.strides == tuple(ck.strides)  # the bug
    scale = d**-0.5
    problem = runtime.launch(spec, cq, ck, cv, co, lse, scale)
    assert problem.v_strides[2] == d + 8 and problem.k_strides[2] == h * d
    out = check_outputs(
        cp.asnumpy(co), cp.asnumpy(lse), q, k, v, causal=spec.causal, scale=scale,
        dtype=spec.dtype,
    )  # fmt: skip
    assert out.passed, out
    # the padding around the strided o is untouched
    rest = cp.asnumpy(o_pad).astype(np.float64)
    mask = np.ones(rest.shape, bool)
    mask[..., 8 : 8 + d] = False
    assert np.isnan(rest[mask]).all(), "the kernel wrote outside o's view"


SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
"""


def test_inputs_written_on_a_non_blocking_stream_are_waited_for() -> None:
    """CUDA array interface v3: a consumer must wait for the `stream` the producer names.
    q, k, v are written on a non-blocking CuPy stream behind a ~1 s spin; flashgen.attention
    launches on the legacy default stream, which does not wait for a non-blocking one: it read
    the zeros the arrays held before (a race). Now it waits on an event recorded there."""
    cp = _cupy()
    import flashgen

    rng = np.random.default_rng(5)
    host = [rng.standard_normal((1, 2, t, 64)).astype(np.float16) for t in (77, 130, 130)]
    q, k, v = (cp.zeros(x.shape, np.float16) for x in host)
    flashgen.attention(q, k, v)  # compile and load first: the spin must outlast the host side
    cp.cuda.Device().synchronize()
    spin = cp.RawKernel(SPIN, "spin")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:  # CuPy's interface names the current stream
        spin((1,), (1,), (np.int64(2_000_000_000),))  # about 1 s on an H200
        for dst, src in zip((q, k, v), host, strict=True):
            dst.set(src, stream=stream)
        o, lse = flashgen.attention(q, k, v, return_lse=True)
    out = check_outputs(
        runtime.to_host(o), runtime.to_host(lse), *host, causal=False, scale=64**-0.5,
        dtype="fp16",
    )  # fmt: skip
    assert out.passed, out
