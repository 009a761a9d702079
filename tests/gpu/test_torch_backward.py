"""`flashgen.torch.attention` is differentiable: dQ, dK, dV from the backward kernels (family
wgmma's on sm_90, mma's elsewhere or with FLASHGEN_WGMMA_BWD=0), judged by FlashAttention's
gradient rule (`oracle_bwd.check_grads`) against float64. Skipped without torch built with
CUDA."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flashgen.generator.oracle_bwd import check_grads

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
fgt = pytest.importorskip("flashgen.torch")

pytestmark = pytest.mark.gpu

TORCH_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
NP_TYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}

# (B, H, H_kv, Tq, Tk): ragged lengths, Tq != Tk both ways, grouped-query heads
SHAPES = [(2, 4, 4, 77, 77), (1, 8, 2, 130, 257), (2, 4, 1, 200, 64), (1, 2, 2, 1, 1)]


def f64(t: Any) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}kv{}q{}k{}".format(*s))
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
def test_gradients_match_the_oracle(
    shape: Any, d: int, causal: bool, dtype: str, deterministic: bool
) -> None:
    b, h, h_kv, tq, tk = shape
    g = torch.Generator(device="cuda").manual_seed(hash((shape, d, causal, dtype)) % 2**31)
    t = TORCH_TYPES[dtype]
    # q as a (B, T, H, d) model layout seen through a transposed view; k, v dense
    q = torch.randn(b, tq, h, d, device="cuda", dtype=t, generator=g).transpose(1, 2)
    k = torch.randn(b, h_kv, tk, d, device="cuda", dtype=t, generator=g)
    v = torch.randn(b, h_kv, tk, d, device="cuda", dtype=t, generator=g)
    do = torch.randn(b, h, tq, d, device="cuda", dtype=t, generator=g)
    for x in (q, k, v):
        x.requires_grad_()
    o = fgt.attention(q, k, v, causal=causal, deterministic=deterministic)
    o.backward(do)
    torch.cuda.synchronize()
    got = (f64(q.grad), f64(k.grad), f64(v.grad))
    outs = check_grads(got, f64(q), f64(k), f64(v), f64(do), dtype=dtype, causal=causal)
    bad = [f"{x.name}: err {x.err:.3g} > bound {x.bound:.3g}" for x in outs if not x.passed]
    assert not bad, f"{shape} d={d} causal={causal} {dtype} det={deterministic}: " + "; ".join(bad)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_deterministic_gradients_are_bit_identical_run_to_run(d: int, causal: bool) -> None:
    g = torch.Generator(device="cuda").manual_seed(1234 + d + causal)
    b, h, h_kv, t = 2, 8, 2, 1000  # 16 key tiles a dQ row sums, 16 query tiles x 4 heads a dK row
    q, k, v = (torch.randn(b, n, t, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for n in (h, h_kv, h_kv))  # fmt: skip
    do = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=g)

    def grads() -> tuple[Any, ...]:
        x = [y.detach().clone().requires_grad_() for y in (q, k, v)]
        o = fgt.attention(*x, causal=causal, deterministic=True)
        return torch.autograd.grad(o, x, do)

    first = grads()
    for _ in range(3):
        for name, a, c in zip(("dq", "dk", "dv"), first, grads(), strict=True):
            assert torch.equal(a, c), f"{name} differs between runs"


def test_gradients_under_torch_compile_equal_eager_ones() -> None:
    q, k, v = (torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))  # fmt: skip

    def step(q: Any, k: Any, v: Any) -> Any:
        return fgt.attention(q, k, v, causal=True).float().square().mean()

    eager = torch.autograd.grad(step(q, k, v), (q, k, v))
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(q, k, v), (q, k, v))
    # the same kernels; dQ is summed with fp32 atomics across key blocks and inductor may
    # round the loss's gradient differently, so close, not bit-identical
    for a, c in zip(eager, compiled, strict=True):
        torch.testing.assert_close(a, c)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
@pytest.mark.parametrize("d", [64, 128])
def test_forward_and_backward_replay_in_a_cuda_graph(d: int, deterministic: bool) -> None:
    """Captured once, replayed on new values: the replay's gradients pass the oracle's rule
    (and in deterministic mode equal an eager run's bit for bit)."""
    g = torch.Generator(device="cuda").manual_seed(77 + d)
    shape = (2, 4, 200, d)

    def fresh() -> tuple[Any, ...]:
        return tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
                     for _ in range(4))  # fmt: skip

    q, k, v, do = (x.requires_grad_(i < 3) for i, x in enumerate(fresh()))

    def step() -> tuple[Any, ...]:
        o = fgt.attention(q, k, v, causal=True, deterministic=deterministic)
        return torch.autograd.grad(o, (q, k, v), do)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles and loads the kernels outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()
    with torch.no_grad():
        for x, y in zip((q, k, v, do), fresh(), strict=True):
            x.copy_(y)
    graph.replay()
    torch.cuda.synchronize()
    got = tuple(f64(x) for x in grads)
    outs = check_grads(got, f64(q), f64(k), f64(v), f64(do), dtype="bf16", causal=True)
    bad = [f"{x.name}: err {x.err:.3g} > bound {x.bound:.3g}" for x in outs if not x.passed]
    assert not bad, "; ".join(bad)
    if deterministic:
        for name, a, c in zip(("dq", "dk", "dv"), grads, step(), strict=True):
            assert torch.equal(a, c), f"{name}: replay differs from an eager run"
