"""`flashgen.torch.attention` is differentiable: dQ, dK, dV from the backward kernels (family
wgmma's on sm_90, mma's elsewhere or with FLASHGEN_WGMMA_BWD=0), judged by FlashAttention's
gradient rule (`oracle_bwd.check_grads`) against float64, with and without the run-time
features (window, softcap, ALiBi; each through both backward families on sm_90). Skipped
without torch built with CUDA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flashgen.verify.oracle import visible
from flashgen.verify.oracle_bwd import check_grads

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
@pytest.mark.parametrize("d", [64, 96, 128, 72])  # 96, 72: wgmma at d_pad 128 on sm_90
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


# One process's deterministic gradients: their sha256, and the backward family that ran them.
_ONE_PROCESS = """
import hashlib, sys
import torch
import flashgen.torch as fgt

d, causal = int(sys.argv[1]), sys.argv[2] == "1"
g = torch.Generator(device="cuda").manual_seed(4321 + d)
b, h, h_kv, t = 2, 8, 2, 1000
q, k, v = (torch.randn(b, n, t, d, device="cuda", dtype=torch.bfloat16, generator=g)
           for n in (h, h_kv, h_kv))
do = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=g)
x = [y.requires_grad_() for y in (q, k, v)]
grads = torch.autograd.grad(fgt.attention(*x, causal=causal, deterministic=True), x, do)
digest = hashlib.sha256()
for gr in grads:
    digest.update(gr.view(torch.int16).cpu().numpy().tobytes())
# the family of the deterministic backward plan this call compiled and ran
[family] = {key[5] for key in fgt._bwd_plans if key[4]}
print(family, digest.hexdigest())
"""


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_deterministic_gradients_are_bit_identical_across_processes(d: int, causal: bool) -> None:
    """Two processes, the same inputs: the same bits (and on sm_90, from family wgmma)."""
    import subprocess
    import sys

    def one() -> list[str]:
        run = subprocess.run(
            [sys.executable, "-c", _ONE_PROCESS, str(d), str(int(causal))],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout.split()[-2:]

    first, second = one(), one()
    assert first == second
    if torch.cuda.get_device_capability()[0] == 9:
        assert first[0] == "wgmma"


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


# ---- run-time features: window, softcap, ALiBi --------------------------------------------------


@pytest.fixture(params=["wgmma", "mma"])
def bwd_family(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The backward family a test runs: wgmma (sm_90's default; skipped on other GPUs) or mma
    (FLASHGEN_WGMMA_BWD=0). The caches are cleared on both sides so the choice is made anew."""
    family = request.param
    if family == "wgmma":
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("family wgmma's backward runs on sm_90 GPUs only")
        monkeypatch.delenv(fgt.WGMMA_BWD_ENV, raising=False)
    else:
        monkeypatch.setenv(fgt.WGMMA_BWD_ENV, "0")
    fgt.clear_cache()
    yield family
    fgt.clear_cache()  # later tests choose again, without this test's environment


def _backward_specs() -> list[Any]:
    """The backward variants flashgen.torch has bound since the last clear_cache() (its
    private cache of (Prepared, device) entries), to see which family and features ran."""
    return [entry[0].spec for entry in fgt._bwd_entries.values()]


@dataclass(frozen=True)
class FeatureCase:
    shape: tuple[int, int, int, int, int]  # (B, H, H_kv, Tq, Tk)
    d: int
    dtype: str
    causal: bool
    window: tuple[int, int] | None = None
    softcap: float | None = None
    alibi: float | None = None  # slopes alibi * 2^(-8 (i + 1) / H) for query head i
    logit_max: float | None = None  # Q and K scaled so that max |scale q.k| is this

    @property
    def tokens(self) -> tuple[str, ...]:
        on = (self.window is not None, self.softcap is not None, self.alibi is not None)
        return tuple(t for t, o in zip(("window", "softcap", "alibi"), on, strict=True) if o)

    @property
    def label(self) -> str:
        parts = ["B{}H{}kv{}q{}k{}".format(*self.shape), f"d{self.d}", self.dtype]
        parts.append("causal" if self.causal else "noncausal")
        if self.window is not None:
            parts.append("win{},{}".format(*("inf" if n < 0 else n for n in self.window)))
        if self.softcap is not None:
            parts.append(f"cap{self.softcap:g}")
        if self.alibi is not None:
            parts.append(f"alibi{self.alibi:g}")
        if self.logit_max is not None:
            parts.append(f"logits{self.logit_max:g}")
        return "-".join(parts)


FC = FeatureCase
FEATURE_CASES = [
    # windows: causal sliding, two-sided with GQA 4, empty (0, 0) with Tq > Tk (rows that see
    # no key), right only, wider than both sequences (the kernels get it as unbounded)
    FC((2, 4, 4, 77, 77), 64, "bf16", True, window=(16, 0)),
    FC((1, 8, 2, 130, 257), 128, "fp16", False, window=(40, 24)),
    FC((2, 4, 1, 200, 64), 64, "fp16", True, window=(0, 0)),
    FC((1, 4, 2, 97, 131), 128, "bf16", False, window=(-1, 8)),
    FC((1, 2, 2, 150, 190), 64, "bf16", True, window=(1000, 1000)),
    # softcaps from far below the logits (+-30) to above them
    FC((2, 4, 1, 200, 64), 64, "fp16", False, softcap=0.5, logit_max=30.0),
    FC((2, 4, 4, 77, 77), 128, "fp16", True, softcap=5.0, logit_max=30.0),
    FC((1, 4, 2, 150, 190), 64, "bf16", False, softcap=50.0, logit_max=30.0),
    # ALiBi: a slope per query head (GQA), and steep slopes
    FC((1, 8, 2, 130, 257), 64, "bf16", True, alibi=1.0),
    FC((2, 4, 1, 200, 64), 128, "bf16", False, alibi=8.0, logit_max=30.0),
    # Gemma 2's window + softcap, and all three together
    FC((1, 8, 2, 257, 129), 64, "fp16", True, window=(64, 0), softcap=30.0, logit_max=30.0),
    FC((1, 4, 2, 130, 130), 128, "bf16", True, window=(32, 0), softcap=20.0, alibi=1.0),
]


def _slopes(alibi: float | None, h: int) -> Any:
    if alibi is None:
        return None
    heads = torch.arange(1, h + 1, device="cuda", dtype=torch.float64)
    return (alibi * 2.0 ** (-8.0 * heads / h)).float()


def _feature_inputs(case: FeatureCase, seed: int) -> tuple[Any, ...]:
    """q (a (B, T, H, d) model layout seen through a transposed view), k, v, dO; q and k scaled
    to `logit_max` when it is set, then rounded to the dtype."""
    b, h, h_kv, tq, tk = case.shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, tq, h, case.d, device="cuda", generator=g).transpose(1, 2)
    k, v = (torch.randn(b, h_kv, tk, case.d, device="cuda", generator=g) for _ in "kv")
    do = torch.randn(b, h, tq, case.d, device="cuda", generator=g)
    if case.logit_max is not None:
        ke = k.repeat_interleave(h // h_kv, dim=1)
        peak = float((q @ ke.transpose(-1, -2)).abs().max()) * case.d**-0.5
        gain = (case.logit_max / peak) ** 0.5
        q, k = q * gain, k * gain
    t = TORCH_TYPES[case.dtype]
    return tuple(x.to(t) for x in (q, k, v, do))


@pytest.mark.parametrize("case", FEATURE_CASES, ids=lambda c: c.label)
def test_feature_gradients_match_the_oracle(case: FeatureCase, bwd_family: str) -> None:
    """Gradients with a window, softcap and ALiBi (no NotImplementedError any more) pass the
    oracle's rule, through the family the parametrization chose, compiled with the features."""
    b, h, h_kv, tq, tk = case.shape
    q, k, v, do = _feature_inputs(case, seed=sum(case.shape) * 131 + case.d)
    slopes = _slopes(case.alibi, h)
    kw = {"window": case.window, "softcap": case.softcap, "alibi_slopes": slopes}
    for x in (q, k, v):
        x.requires_grad_()
    o = fgt.attention(q, k, v, causal=case.causal, **kw)
    o.backward(do)
    torch.cuda.synchronize()
    ran = _backward_specs()
    assert [(s.family, tuple(s.features)) for s in ran] == [(bwd_family, case.tokens)], (
        f"expected one {bwd_family} backward with {case.tokens}: {[s.name for s in ran]}"
    )
    got = (f64(q.grad), f64(k.grad), f64(v.grad))
    host_slopes = None if slopes is None else slopes.cpu().numpy()
    outs = check_grads(
        got, f64(q), f64(k), f64(v), f64(do), dtype=case.dtype, causal=case.causal,
        window=case.window, softcap=case.softcap, alibi_slopes=host_slopes,
    )  # fmt: skip
    bad = [f"{x.name}: err {x.err:.3g} > bound {x.bound:.3g}" for x in outs if not x.passed]
    assert not bad, f"{case.label} ({bwd_family}): " + "; ".join(bad)
    empty = ~visible(tq, tk, causal=case.causal, window=case.window).any(axis=1)
    assert not np.any(got[0][:, :, empty]), "dQ of rows that see no key must be zero"


@pytest.mark.parametrize("d", [64, 128])
def test_deterministic_feature_gradients_are_bit_identical_and_right(d: int) -> None:
    """deterministic=True (family mma without atomics) with a window and ALiBi: many key and
    query tiles, the same bits on every run, and the oracle's rule."""
    case = FC((2, 4, 2, 500, 700), d, "bf16", True, window=(100, 20), alibi=1.0)
    q, k, v, do = _feature_inputs(case, seed=4242 + d)
    slopes = _slopes(case.alibi, case.shape[1])
    kw = {"window": case.window, "alibi_slopes": slopes, "deterministic": True}

    def grads() -> tuple[Any, ...]:
        x = [y.detach().clone().requires_grad_() for y in (q, k, v)]
        return torch.autograd.grad(fgt.attention(*x, causal=True, **kw), x, do)

    first = grads()
    for _ in range(2):
        for name, a, c in zip(("dq", "dk", "dv"), first, grads(), strict=True):
            assert torch.equal(a, c), f"{name} differs between runs"
    outs = check_grads(
        tuple(f64(x) for x in first), f64(q), f64(k), f64(v), f64(do), dtype="bf16", causal=True,
        window=case.window, alibi_slopes=slopes.cpu().numpy(),
    )  # fmt: skip
    bad = [f"{x.name}: err {x.err:.3g} > bound {x.bound:.3g}" for x in outs if not x.passed]
    assert not bad, "; ".join(bad)


def test_feature_gradients_under_torch_compile_equal_eager_ones() -> None:
    """A sliding window with softcap through torch.compile(fullgraph=True), forward and
    backward: the feature values reach the backward op from the traced graph."""
    g = torch.Generator(device="cuda").manual_seed(99)
    q, k, v = (torch.randn(2, 4, 200, 64, device="cuda", dtype=torch.bfloat16, generator=g)
               .requires_grad_() for _ in range(3))  # fmt: skip

    def step(q: Any, k: Any, v: Any) -> Any:
        o = fgt.attention(q, k, v, causal=True, window=(48, 0), softcap=20.0)
        return o.float().square().mean()

    eager = torch.autograd.grad(step(q, k, v), (q, k, v))
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(q, k, v), (q, k, v))
    for a, c in zip(eager, compiled, strict=True):
        assert torch.isfinite(c).all()
        torch.testing.assert_close(a, c)


def test_the_backward_checks_alibi_slope_views_at_one_pointer_on_every_call() -> None:
    """The backward's signature cache keyed the slopes by pointer alone, like the forward's:
    after one valid backward, a float64 or 1-element view at that pointer ran unchecked."""
    g = torch.Generator(device="cuda").manual_seed(12)
    q, k, v, do = (torch.randn(1, 4, 97, 64, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4))  # fmt: skip
    wide = torch.tensor([0.5, 0.25, 0.125, 0.0625, 1, 1, 1, 1], device="cuda")
    slopes = wide[:4]
    o, lse = torch.ops.flashgen.attention(q, k, v, True, None, None, -1, -1, 0.0, slopes)

    def backward(s: Any) -> Any:
        return torch.ops.flashgen.attention_backward(
            q, k, v, o, lse, do, True, None, False, -1, -1, 0.0, s
        )

    first = backward(slopes)
    again = backward(slopes)
    torch.cuda.synchronize()
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    outs = check_grads(
        tuple(f64(x) for x in first), f64(q), f64(k), f64(v), f64(do), dtype="bf16",
        causal=True, alibi_slopes=slopes.cpu().numpy(),
    )  # fmt: skip
    assert all(x.passed for x in outs), outs
    with pytest.raises(ValueError, match=r"alibi_slopes.dtype=torch.float64: must be float32"):
        backward(wide.view(torch.float64)[:4])
    with pytest.raises(ValueError, match=r"alibi_slopes.shape=\(1,\): must be \(4,\)"):
        backward(slopes[:1])
