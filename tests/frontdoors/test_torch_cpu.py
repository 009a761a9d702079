"""`flashgen.torch` without a GPU: registration, the fake implementation's shapes and layouts,
torch.compile tracing, and the errors (the same ValueErrors as the NumPy path).

Runs on the CPU build of torch (CI installs torch==2.13.0); skipped when torch is absent,
except the test that `import flashgen` needs no torch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import flashgen
from flashgen.generator.spec import KernelSpec


def test_flashgen_imports_without_torch_and_flashgen_torch_says_what_is_missing():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import flashgen
        try:
            import flashgen.torch
        except ImportError as exc:
            print(exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("flashgen.torch needs PyTorch, which cannot be imported")
    assert "install torch" in lines[0]


torch = pytest.importorskip("torch")
fgt = pytest.importorskip("flashgen.torch")
FakeTensorMode = pytest.importorskip("torch._subclasses.fake_tensor").FakeTensorMode

OP = torch.ops.flashgen.attention.default


def meta(*shape: int, dtype=None):
    return torch.empty(*shape, device="meta", dtype=dtype or torch.bfloat16)


def test_the_op_is_registered_with_its_schema_and_cuda_cpu_and_meta_kernels():
    assert str(OP._schema) == "flashgen::" + fgt.SCHEMA
    for key in ("CUDA", "CPU", "Meta"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key("flashgen::attention", key), key


def test_the_fake_gives_o_like_q_and_float32_lse():
    q, k = meta(2, 3, 70, 64), meta(2, 3, 45, 64)
    o, lse = OP(q, k, k, True, None, None)
    assert o.shape == q.shape and o.dtype == q.dtype and o.stride() == q.stride()
    assert lse.shape == (2, 3, 70) and lse.dtype == torch.float32 and lse.is_contiguous()


def test_a_model_layout_view_gives_an_output_in_model_layout():
    b, t, h, d = 2, 33, 4, 64
    x = meta(b, t, h, d)
    o = fgt.attention(x.transpose(1, 2), x.transpose(1, 2), x.transpose(1, 2))
    assert o.shape == (b, h, t, d)
    assert o.transpose(1, 2).is_contiguous()  # (B, T, H, d) memory again: reshape is free
    fused = meta(b, t, 3, h, d)  # a fused QKV projection: q, k, v are strided views
    q, k, v = (y.transpose(1, 2) for y in fused.unbind(2))
    o = fgt.attention(q, k, v, causal=True)
    assert o.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize(
    "shape,stride,want",
    [
        ((2, 3, 5, 8), (120, 40, 8, 1), (120, 40, 8, 1)),  # contiguous BHTD
        ((2, 3, 5, 8), (120, 8, 24, 1), (120, 8, 24, 1)),  # BTHD viewed as BHTD
        ((2, 3, 5, 8), (360, 8, 72, 1), (120, 8, 24, 1)),  # fused QKV: dense in the same order
        ((2, 3, 5, 8), (200, 60, 12, 1), (120, 40, 8, 1)),  # padded rows: dense BHTD
    ],
)
def test_output_strides_are_dense_in_qs_axis_order(shape, stride, want):
    assert fgt.out_strides(shape, stride) == want


def numpy_error(q_shape, k_shape, v_shape, dtype=np.float16, **kw):
    arrays = [np.zeros(s, dtype) for s in (q_shape, k_shape, v_shape)]
    with pytest.raises(ValueError) as info:
        flashgen.attention(*arrays, **kw)
    return str(info.value)


@pytest.mark.parametrize(
    "shapes,kw",
    [
        (((2, 3, 10, 64), (2, 3, 12, 64), (2, 3, 11, 64)), {}),  # v length != k length
        (((2, 3, 10, 64), (2, 4, 12, 64), (2, 4, 12, 64)), {}),  # heads differ
        (((3, 10, 64), (2, 3, 12, 64), (2, 3, 12, 64)), {}),  # 3-D q
        (((2, 3, 10, 64), (2, 3, 12, 32), (2, 3, 12, 32)), {}),  # head dims differ
        (((2, 3, 10, 64), (2, 3, 12, 64), (2, 3, 12, 64)), {"scale": -1.0}),
        (((2, 3, 10, 64), (2, 3, 12, 64), (2, 3, 12, 64)), {"causal": 1}),
    ],
)
def test_fake_cuda_tensors_raise_the_numpy_paths_errors(shapes, kw):
    want = numpy_error(*shapes, **kw)
    with FakeTensorMode():
        q, k, v = (torch.empty(s, device="cuda", dtype=torch.float16) for s in shapes)
        with pytest.raises(ValueError) as info:
            fgt.attention(q, k, v, **kw)
    assert str(info.value) == want


def test_unsupported_dtypes_and_mixed_dtypes_are_refused_by_name():
    with pytest.raises(ValueError, match=r"q.dtype=torch.float64: unsupported"):
        fgt.attention(*(meta(1, 2, 3, 64, dtype=torch.float64) for _ in range(3)))
    with pytest.raises(ValueError, match=r"q/k/v dtypes bfloat16/float16/bfloat16: must be equal"):
        fgt.attention(meta(1, 2, 3, 64), meta(1, 2, 3, 64, dtype=torch.float16), meta(1, 2, 3, 64))


def test_a_non_contiguous_head_dim_is_refused_as_in_the_numpy_path():
    x = meta(1, 2, 3, 128)[..., ::2]
    with pytest.raises(ValueError, match=r"q.strides\[3\]=4 bytes: the d axis must be contiguous"):
        fgt.attention(x, x, x)


def test_cpu_tensors_are_refused_with_the_fix():
    x = torch.zeros(1, 2, 3, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"q: a CPU tensor; move it to the GPU"):
        fgt.attention(x, x, x)
    with pytest.raises(ValueError, match=r"q: a CPU tensor; move it to the GPU"):
        OP(x, x, x, False, None, None)  # the dispatcher's CPU kernel says the same


def test_flashgen_attention_passes_torch_tensors_to_flashgen_torch():
    x = torch.zeros(1, 2, 3, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"q: a CPU tensor; move it to the GPU"):
        flashgen.attention(x, x, x)
    with pytest.raises(ValueError, match=r"q=Tensor, k=ndarray, v=Tensor: mixed torch tensors"):
        flashgen.attention(x, np.zeros((1, 2, 3, 64), np.float16), x)


def test_a_spec_is_passed_by_name_and_must_fit_the_call():
    spec = KernelSpec(family="simt", d=64, dtype="bf16", causal=True)
    q = meta(1, 2, 3, 64)
    o = fgt.attention(q, q, q, causal=True, spec=spec)
    assert o.shape == q.shape
    with pytest.raises(ValueError, match=r"spec='simt': must be a KernelSpec"):
        fgt.attention(q, q, q, spec="simt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"not a flashgen kernel name"):
        OP(q, q, q, True, None, "flash_nonsense")


def test_backward_through_the_op_traces_to_grads_of_the_inputs_shapes():
    q = meta(2, 8, 3, 64).requires_grad_()
    k = meta(2, 2, 5, 64).requires_grad_()  # grouped-query: dK, dV have K/V's heads
    v = meta(2, 2, 5, 64).requires_grad_()
    o = fgt.attention(q, k, v, causal=True)
    assert o.requires_grad
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    o2, lse = fgt.attention(q, k, v, return_lse=True)
    assert not lse.requires_grad  # gradients flow through O only


def test_the_deterministic_backward_traces_and_carries_its_flag_to_the_backward_op():
    q = meta(2, 8, 3, 64).requires_grad_()
    k = meta(2, 2, 5, 64).requires_grad_()
    v = meta(2, 2, 5, 64).requires_grad_()
    seen = []
    bwd = torch.ops.flashgen.attention_backward.default

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is bwd:
                # a default-valued trailing argument is dropped from args: False
                seen.append(
                    args[8] if len(args) > 8 else (kwargs or {}).get("deterministic", False)
                )
            return func(*args, **(kwargs or {}))

    for det in (True, False):
        with Spy():
            fgt.attention(q, k, v, causal=True, deterministic=det).sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
        q.grad = k.grad = v.grad = None
    assert seen == [True, False]
    with pytest.raises(ValueError, match=r"deterministic='yes': must be True or False"):
        fgt.attention(q, k, v, deterministic="yes")


def test_the_backward_op_schema_takes_deterministic_and_the_features_with_defaults():
    schema = str(torch.ops.flashgen.attention_backward.default._schema)
    assert schema == "flashgen::" + fgt.BWD_SCHEMA
    assert schema == (
        "flashgen::attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, "
        "Tensor do, bool causal, float? scale, bool deterministic=False, int window_left=-1, "
        "int window_right=-1, float softcap=0., Tensor? alibi_slopes=None) "
        "-> (Tensor, Tensor, Tensor)"
    )
    assert str(OP._schema) == (
        "flashgen::attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? "
        "scale=None, str? variant=None, int window_left=-1, int window_right=-1, "
        "float softcap=0., Tensor? alibi_slopes=None, bool deterministic=False) "
        "-> (Tensor, Tensor)"
    )
    for key in ("CUDA", "Meta"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(
            "flashgen::attention_backward", key
        ), key


def _spy_backward(fn):
    """Run fn under a dispatch mode; the arguments each backward op call got, by name."""
    bwd = torch.ops.flashgen.attention_backward.default
    names = [a.name for a in bwd._schema.arguments]
    defaults = {a.name: a.default_value for a in bwd._schema.arguments if a.has_default_value()}
    seen = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is bwd:
                seen.append({**defaults, **dict(zip(names, args, strict=False)), **(kwargs or {})})
            return func(*args, **(kwargs or {}))

    with Spy():
        fn()
    return seen


def test_the_backward_gets_the_forwards_feature_values():
    q = meta(2, 4, 3, 64).requires_grad_()
    k = meta(2, 2, 5, 64).requires_grad_()
    v = meta(2, 2, 5, 64).requires_grad_()
    slopes = torch.empty(4, device="meta", dtype=torch.float32)

    def step(**kw):
        fgt.attention(q, k, v, causal=True, **kw).sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
        q.grad = k.grad = v.grad = None

    (got,) = _spy_backward(
        lambda: step(window=(16, 0), softcap=50.0, alibi_slopes=slopes, deterministic=True)
    )
    assert (got["window_left"], got["window_right"], got["softcap"]) == (16, 0, 50.0)
    assert got["alibi_slopes"] is slopes and got["deterministic"] is True
    (plain,) = _spy_backward(step)
    assert (plain["window_left"], plain["window_right"], plain["softcap"]) == (-1, -1, 0.0)
    assert plain["alibi_slopes"] is None
    (win,) = _spy_backward(lambda: step(window=(-1, 3)))
    assert (win["window_left"], win["window_right"], win["softcap"]) == (-1, 3, 0.0)


def test_the_fake_backward_checks_the_feature_values():
    bwd = torch.ops.flashgen.attention_backward.default
    q, lse = meta(1, 2, 3, 64), meta(1, 2, 3, dtype=torch.float32)
    dq, dk, dv = bwd(q, q, q, q, lse, q, True, None, False, 4, 0, 2.0, None)
    assert dq.shape == dk.shape == dv.shape == q.shape
    with pytest.raises(ValueError, match=r"each side must be >= 0 keys, or -1 for unbounded"):
        bwd(q, q, q, q, lse, q, True, None, False, -3, 0)
    with pytest.raises(ValueError, match=r"softcap=-1.0: must be in \["):
        bwd(q, q, q, q, lse, q, True, None, False, -1, -1, -1.0)


def test_a_backward_it_cannot_serve_says_so():
    """window, softcap and ALiBi have a backward now; fp32, d > 128 and dv != d do not."""
    q = meta(1, 2, 3, 64).requires_grad_()
    slopes = torch.empty(2, device="meta", dtype=torch.float32)
    fgt.attention(q, q, q, causal=True, window=(4, 0), softcap=5.0, alibi_slopes=slopes).sum(
    ).backward()  # fmt: skip
    assert q.grad.shape == q.shape
    f = meta(1, 2, 3, 64).float().requires_grad_()
    with pytest.raises(NotImplementedError, match=r"fp16/bf16"):
        fgt.attention(f, f, f).sum().backward()
    wide = meta(1, 2, 3, 256).requires_grad_()
    rule = r"head dim 256 \(the backward kernels take d <= 128\)"
    with pytest.raises(NotImplementedError, match=rule):
        fgt.attention(wide, wide, wide).sum().backward()
    v128 = meta(1, 2, 3, 128).requires_grad_()
    with pytest.raises(NotImplementedError, match=r"no backward pass yet with dv != d; call it"):
        fgt.attention(q, q, v128, window=(4, 0)).sum().backward()


def test_the_backward_features_are_validated_as_the_forwards():
    from flashgen.runtime.validate import Problem

    q = torch.zeros(1, 4, 3, 64, dtype=torch.bfloat16)
    st = (4 * 3 * 64, 3 * 64, 64)
    problem = Problem(1, 4, 3, 3, 64, "bf16", st, st, st, st)
    got = fgt._feature_args(problem, (8, 0, 30.0, torch.ones(4)), q)
    assert (got.window, got.softcap) == ((8, 0), 30.0) and got.alibi
    assert got.tokens == ("window", "softcap", "alibi")
    off = fgt._feature_args(problem, (-1, -1, 0.0, None), q)
    assert off.tokens == () and off.kernel_args(3, 3) == (-1, -1, 0.0, 0)
    with pytest.raises(ValueError, match=r"alibi_slopes.shape=\(2,\): must be \(4,\)"):
        fgt._feature_args(problem, (-1, -1, 0.0, torch.ones(2)), q)
    with pytest.raises(ValueError, match=r"alibi_slopes.dtype=torch.float16: must be float32"):
        fgt._feature_args(problem, (-1, -1, 0.0, torch.ones(4, dtype=torch.float16)), q)
    with pytest.raises(ValueError, match=r"must be contiguous"):
        fgt._feature_args(problem, (-1, -1, 0.0, torch.ones(8)[::2]), q)
    with pytest.raises(ValueError, match=r"alibi_slopes on meta, q on cpu: must be on one"):
        fgt._feature_args(problem, (-1, -1, 0.0, torch.ones(4, device="meta")), q)
    with pytest.raises(ValueError, match=r"window=\(5, -7\): each side must be >= 0"):
        fgt._feature_args(problem, (5, -7, 0.0, None), q)


def test_torch_compile_traces_the_backward_op_with_the_feature_values():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    torch._dynamo.reset()
    graphs = {}

    def backend(gm, example_inputs):
        def keep(kind):
            def compiler(g, inputs):
                graphs[kind] = g
                return make_boxed_func(g.forward)

            return compiler

        return aot_module_simplified(gm, example_inputs, fw_compiler=keep("fw"),
                                     bw_compiler=keep("bw"))  # fmt: skip

    def f(q, k, v, slopes):
        return fgt.attention(q, k, v, causal=True, window=(8, 0), softcap=30.0, alibi_slopes=slopes)

    q = meta(1, 2, 16, 64).requires_grad_()
    slopes = torch.empty(2, device="meta", dtype=torch.float32)
    torch.compile(f, fullgraph=True, backend=backend)(q, q, q, slopes).sum().backward()
    bwd = torch.ops.flashgen.attention_backward.default
    (node,) = [n for n in graphs["bw"].graph.nodes if n.target is bwd]
    assert node.args[6:12] == (True, None, False, 8, 0, 30.0)
    assert node.args[12].op == "placeholder"  # the slopes, saved by the forward
    assert q.grad.shape == q.shape


def test_the_eager_shortcut_is_never_taken_off_cuda_or_with_autograd_or_fake_tensors():
    x = torch.zeros(1, 2, 3, 64)
    assert not fgt._direct(x, x, x)  # CPU: the dispatcher's CPU kernel answers
    assert not fgt._direct(meta(1, 2, 3, 64), meta(1, 2, 3, 64), meta(1, 2, 3, 64))
    with FakeTensorMode():
        f = torch.empty(1, 2, 3, 64, device="cuda")
        assert not fgt._direct(f, f, f)

    # nor the autograd shortcut: it needs plain CUDA tensors too
    assert not fgt.eager_autograd(x, x, x)
    assert not fgt.eager_autograd(meta(1, 2, 3, 64), meta(1, 2, 3, 64), meta(1, 2, 3, 64))
    with FakeTensorMode():
        f = torch.empty(1, 2, 3, 64, device="cuda")
        assert not fgt.eager_autograd(f, f, f)
    # nor inside a torch.func transform (a plain autograd.Function is refused there)
    from flashgen import torch_support

    levels: list[object] = []

    def probe(x):  # type: ignore[no-untyped-def]
        levels.append(torch_support._functorch_level())
        return x.sum()

    torch.func.grad(probe)(torch.ones(3))
    assert levels[0] is not None and torch_support._functorch_level() is None


def test_an_eager_training_call_runs_the_ops_autograd_formula(monkeypatch):
    """With gradients asked on plain CUDA tensors, the front door runs `_EagerAttention`
    (the op's own setup_context and backward as an autograd.Function): stand-in kernels here
    (CPU tensors, the shortcut forced) show what reaches them and what comes back."""
    seen: dict[str, tuple[object, ...]] = {}

    def run(q, k, v, causal, scale, variant, *feature_args):  # type: ignore[no-untyped-def]
        seen["fwd"] = (causal, scale, variant, *feature_args)
        return q * 2.0, torch.zeros(q.shape[:-1], dtype=torch.float32)

    def run_backward(q, k, v, o, lse, do, causal, scale, deterministic, *feature_args):  # type: ignore[no-untyped-def]
        seen["bwd"] = (causal, scale, deterministic, *feature_args)
        return do * 2.0, do * 3.0, do * 4.0

    monkeypatch.setattr(fgt, "eager_autograd", lambda *a: True)
    monkeypatch.setattr(fgt, "_run", run)
    monkeypatch.setattr(fgt, "_BWD_OP", run_backward)
    q, k, v = (torch.randn(1, 2, 16, 64, dtype=torch.bfloat16).requires_grad_() for _ in "qkv")
    slopes = torch.ones(2)
    o, lse = fgt.attention(q, k, v, causal=True, scale=0.5, deterministic=True, window=(8, 0),
                           alibi_slopes=slopes, return_lse=True)  # fmt: skip
    assert o.requires_grad and not lse.requires_grad  # LSE is not differentiable
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    assert torch.equal(dq, torch.full_like(q, 2.0)) and torch.equal(dv, torch.full_like(v, 4.0))
    assert seen["fwd"][:3] == (True, 0.5, None) and seen["bwd"][:3] == (True, 0.5, True)
    assert seen["fwd"][3:] == seen["bwd"][3:] and seen["bwd"][3:5] == (8, 0)
    assert any(a is slopes for a in seen["bwd"])  # the slopes saved and passed back
    # what the backward kernels cannot serve is refused when gradients are asked, as before
    v_wide = torch.randn(1, 2, 16, 32, dtype=torch.bfloat16).requires_grad_()
    o = fgt.attention(q, k, v_wide)
    with pytest.raises(NotImplementedError, match="no backward pass yet with dv != d"):
        o.sum().backward()


class Attention(torch.nn.Module):
    """A model-layout attention block: fused QKV projection, flashgen, output projection."""

    def __init__(self, dim: int, heads: int, spec: KernelSpec | None = None) -> None:
        super().__init__()
        self.heads, self.spec = heads, spec
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = (y.transpose(1, 2) for y in qkv.unbind(2))
        o = fgt.attention(q, k, v, causal=True, spec=self.spec)
        return self.out(o.transpose(1, 2).reshape(b, t, c))


@pytest.mark.parametrize("with_spec", [False, True])
def test_torch_compile_fullgraph_traces_the_op_as_one_node(with_spec):
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    spec = KernelSpec(family="simt", d=64, dtype="fp32", causal=True) if with_spec else None
    model = Attention(256, 4, spec)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    with torch.no_grad(), pytest.raises(ValueError, match=r"a CPU tensor; move it to the GPU"):
        compiled(torch.zeros(2, 10, 256))  # traced, then the real (CPU) kernel refuses
    [gm] = graphs
    nodes = [n for n in gm.graph.nodes if n.target is OP]
    assert len(nodes) == 1
    node = nodes[0]
    assert node.args[3] is True and node.args[4] is None
    assert node.args[5] == (spec.name if spec else None)
    o_meta = node.meta["example_value"][0]
    assert tuple(o_meta.shape) == (2, 4, 10, 64)
    assert o_meta.transpose(1, 2).is_contiguous()


# ---- the host-overhead benchmark's bookkeeping (the timing itself needs a GPU) -----------------
def test_per_call_timing_synchronizes_every_batch_and_times_each_call():
    from flashgen.perf.bench import _per_call_us

    events: list[str] = []
    samples = _per_call_us(lambda: events.append("call"), 7, 3, lambda: events.append("sync"))
    assert len(samples) == 7 and all(s >= 0 for s in samples)
    assert events == ["call"] * 3 + ["sync"] + ["call"] * 3 + ["sync"] + ["call", "sync"]


def test_the_overhead_table_has_one_line_per_problem_and_flashgens_ratio_to_sdpa():
    from flashgen.perf.bench import OverheadRow, overhead_table

    rows = [
        OverheadRow("flashgen.torch", "bf16", 1, 8, 1, 128, False, 18.0, 20.0, 100, 0.9),
        OverheadRow("sdpa", "bf16", 1, 8, 1, 128, False, 20.0, 21.0, 100, 1.0),
        OverheadRow("numpy", "bf16", 1, 8, 1, 128, False, None, None, 0, None, "boom"),
        OverheadRow("sdpa", "bf16", 1, 8, 128, 64, True, 25.0, 26.0, 100, 1.0),
    ]
    headers, lines = overhead_table(rows)
    assert headers == ["problem", "causal", "flashgen.torch us", "sdpa us", "numpy us", "x SDPA"]
    assert lines == [
        ["B1 H8 T1 d128", "no", "18.0", "20.0", "-", "0.90"],
        ["B1 H8 T128 d64", "yes", "-", "25.0", "-", "-"],
    ]


# ---- the ALiBi slopes in a remembered signature: pointer, shape, strides, dtype, device -------
@pytest.fixture
def keyed(monkeypatch):
    """flashgen.torch's forward and backward host paths on CPU tensors, with the first call of
    a signature replaced by the slopes' real checks (what a CUDA tensor's first call runs
    before compiling) and a launch that does nothing: what stays is the signature cache."""
    from flashgen.generator.spec import KernelSpec as Spec
    from flashgen.runtime.validate import Problem

    st = (4 * 3 * 64, 3 * 64, 64)
    problem = Problem(1, 4, 3, 3, 64, "bf16", st, st, st, st)
    validated: list[str] = []

    def prepare(key, q, k, v, causal, scale, variant, feats):
        fgt._feature_args(problem, feats, q)  # raises as a CUDA call's first call would
        validated.append("fwd")
        entry = fgt._Entry(lambda *a: None, q.device, q.dtype, tuple(q.shape), q.stride(),
                           tuple(q.shape[:3]))  # fmt: skip
        fgt._entries[key] = entry
        return entry

    class Prepared:
        spec = Spec(family="mma", d=64, dtype="bf16", direction="bwd")

        def __call__(self, pointers, stream, hook_ptrs=None):
            pass

    def bwd_prepare(key, tensors, causal, scale, det, feats):
        fgt._feature_args(problem, feats, tensors[0])
        validated.append("bwd")
        fgt._bwd_entries[key] = hit = (Prepared(), -1)
        return hit

    monkeypatch.setattr(fgt, "_prepare", prepare)
    monkeypatch.setattr(fgt, "_bwd_prepare", bwd_prepare)
    monkeypatch.setattr(fgt, "_entries", {})
    monkeypatch.setattr(fgt, "_bwd_entries", {})
    monkeypatch.setattr(fgt, "_raw_stream", lambda dev: 0)
    q = torch.zeros(1, 4, 3, 64, dtype=torch.bfloat16)
    return q, validated


def _views_at_one_pointer():
    """Slopes views that all start where `good` does: s[::2], s[:1], and float64 memory."""
    wide = torch.ones(8, dtype=torch.float64)  # 64 bytes
    good = wide.view(torch.float32)[:4]  # (4,) float32 at wide's address
    return good, {
        "strided": (wide.view(torch.float32)[::2][:4], r"must be contiguous"),
        "short": (good[:1], r"alibi_slopes.shape=\(1,\): must be \(4,\)"),
        "float64": (wide[:4], r"alibi_slopes.dtype=torch.float64: must be float32"),
    }


def test_a_slopes_view_at_a_remembered_pointer_is_validated_again(keyed):
    q, validated = keyed
    good, bad = _views_at_one_pointer()
    fgt._run(q, q, q, False, None, None, -1, -1, 0.0, good)
    fgt._run(q, q, q, False, None, None, -1, -1, 0.0, good)
    assert validated == ["fwd"]  # the second call skipped validation: same signature
    for name, (view, message) in bad.items():
        assert view.data_ptr() == good.data_ptr(), name
        with pytest.raises(ValueError, match=message):
            fgt._run(q, q, q, False, None, None, -1, -1, 0.0, view)


def test_a_backward_slopes_view_at_a_remembered_pointer_is_validated_again(keyed):
    q, validated = keyed
    good, bad = _views_at_one_pointer()
    o, lse = torch.zeros_like(q), torch.zeros(1, 4, 3)
    for _ in range(2):
        fgt._run_backward(q, q, q, o, lse, o, False, None, False, -1, -1, 0.0, good)
    assert validated == ["bwd"]
    for view, message in bad.values():
        with pytest.raises(ValueError, match=message):
            fgt._run_backward(q, q, q, o, lse, o, False, None, False, -1, -1, 0.0, view)


def test_slopes_must_be_4_byte_aligned():
    from flashgen.runtime.validate import Problem

    st = (4 * 3 * 64, 3 * 64, 64)
    problem = Problem(1, 4, 3, 3, 64, "bf16", st, st, st, st)

    q = torch.zeros(1, 4, 3, 64, dtype=torch.bfloat16)

    class Misaligned:  # a float32 (4,) tensor 2 bytes into its allocation (torch makes none)
        shape, dtype, device = (4,), torch.float32, q.device

        def is_contiguous(self):
            return True

        def data_ptr(self):
            return 0x10002

    with pytest.raises(ValueError, match=r"alibi_slopes pointer 0x10002: must be 4-byte aligned"):
        fgt._feature_args(problem, (-1, -1, 0.0, Misaligned()), q)


def test_fake_tensors_with_a_head_dim_no_family_takes_raise_the_numpy_paths_error():
    with pytest.raises(ValueError, match=r"d=65: must be a multiple of 8 in \[8, 256\]"):
        fgt.attention(meta(1, 2, 8, 65), meta(1, 2, 8, 65), meta(1, 2, 8, 65))


# ---- FlashAttention's dense calls (B, T, H, d) ------------------------------------------------
def test_flash_attn_func_takes_model_layout_and_returns_it_dense():
    b, t, h, h_kv, d = 2, 33, 8, 2, 64
    q, k, v = meta(b, t, h, d), meta(b, 40, h_kv, d), meta(b, 40, h_kv, 32)
    out = fgt.flash_attn_func(q, k, v, causal=True, window_size=(16, 0), softcap=30.0)
    assert out.shape == (b, t, h, 32) and out.is_contiguous() and out.dtype == q.dtype
    out, lse, probs = fgt.flash_attn_func(q, k, v, return_attn_probs=True)
    assert lse.shape == (b, h, t) and lse.dtype == torch.float32 and probs is None


def test_the_packed_calls_unbind_a_fused_projection_and_grads_flow_into_it():
    b, t, h, d = 2, 17, 4, 64
    qkv = meta(b, t, 3, h, d).requires_grad_()
    out = fgt.flash_attn_qkvpacked_func(qkv, causal=True)
    assert out.shape == (b, t, h, d) and out.is_contiguous()
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape
    kv = meta(b, 40, 2, 2, d)
    assert fgt.flash_attn_kvpacked_func(meta(b, t, h, d), kv).shape == (b, t, h, d)


def test_flash_attn_func_passes_its_arguments_on_as_attention_takes_them(monkeypatch):
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(kw, shapes=(q.shape, k.shape, v.shape))
        return meta(*q.shape), meta(*q.shape[:3], dtype=torch.float32)

    monkeypatch.setattr(fgt, "attention", spy)
    slopes = torch.empty(8, device="meta", dtype=torch.float32)
    fgt.flash_attn_func(meta(1, 5, 8, 64), meta(1, 9, 2, 64), meta(1, 9, 2, 64),
                        softmax_scale=0.1, causal=True, window_size=(4, 0), softcap=5,
                        alibi_slopes=slopes, deterministic=True)  # fmt: skip
    assert seen["shapes"] == ((1, 8, 5, 64), (1, 2, 9, 64), (1, 2, 9, 64))
    assert (seen["scale"], seen["causal"], seen["deterministic"]) == (0.1, True, True)
    assert (seen["window"], seen["softcap"], seen["alibi_slopes"]) == ((4, 0), 5.0, slopes)
    seen.clear()
    fgt.flash_attn_func(meta(1, 5, 8, 64), meta(1, 9, 2, 64), meta(1, 9, 2, 64))
    assert not {"window", "softcap", "alibi_slopes"} & set(seen)  # defaults add no feature
    assert (seen["scale"], seen["causal"], seen["deterministic"]) == (None, False, False)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: fgt.flash_attn_func(meta(1, 5, 8, 64), meta(1, 9, 8, 64), meta(1, 9, 8, 64),
                                     dropout_p=0.1),
         r"dropout_p=0.1: flashgen has no attention dropout; pass 0.0"),
        (lambda: fgt.flash_attn_func(meta(5, 8, 64), meta(9, 8, 64), meta(9, 8, 64)),
         r"q.shape=\(5, 8, 64\): must be \(B, T, H, d\)"),
        (lambda: fgt.flash_attn_func(np.zeros((1, 5, 8, 64)), meta(1, 9, 8, 64),
                                     meta(1, 9, 8, 64)),
         r"q: a ndarray; pass a \(B, T, H, d\) torch tensor"),
        (lambda: fgt.flash_attn_qkvpacked_func(meta(1, 5, 2, 8, 64)),
         r"qkv.shape=\(1, 5, 2, 8, 64\): must be \(B, T, 3, H, d\)"),
        (lambda: fgt.flash_attn_kvpacked_func(meta(1, 5, 8, 64), meta(1, 9, 8, 64)),
         r"kv.shape=\(1, 9, 8, 64\): must be \(B, T, 2, H, d\)"),
        (lambda: fgt.flash_attn_func(meta(1, 5, 8, 64), meta(1, 9, 8, 64), meta(1, 9, 8, 64),
                                     window_size=4),
         r"window_size=4: must be \(left, right\)"),
        (lambda: fgt.flash_attn_func(torch.zeros(1, 5, 8, 64), torch.zeros(1, 9, 8, 64),
                                     torch.zeros(1, 9, 8, 64)),
         r"q: a CPU tensor; move it to the GPU"),
    ],
)  # fmt: skip
def test_flash_attn_func_refuses_bad_calls_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---- torch's scaled_dot_product_attention call ----------------------------------------------
@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
def test_sdpa_call_folds_leading_dims_and_returns_querys_shape(lead):
    q, k, v = meta(*lead, 8, 33, 64), meta(*lead, 2, 40, 64), meta(*lead, 2, 40, 32)
    out = fgt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert out.shape == (*lead, 8, 33, 32) and out.dtype == q.dtype
    q = meta(*lead, 8, 40, 64)
    assert fgt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).shape == (
        *lead, 8, 40, 32)  # fmt: skip


def test_sdpa_call_passes_scale_and_the_mask_on(monkeypatch):
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(kw, shape=tuple(q.shape))
        return meta(*q.shape)

    monkeypatch.setattr(fgt, "attention", spy)
    fgt.scaled_dot_product_attention(meta(8, 5, 64), meta(8, 5, 64), meta(8, 5, 64),
                                     is_causal=True, scale=0.2)  # fmt: skip
    assert seen == {"causal": True, "scale": 0.2, "shape": (1, 8, 5, 64)}


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"attn_mask": "mask"}, r"attn_mask: a dense mask tensor is not taken"),
        ({"dropout_p": 0.1}, r"dropout_p=0.1: flashgen has no attention dropout"),
        ({"is_causal": True, "q_len": 7}, r"is_causal with L=7 queries and S=9 keys: torch aligns"),
        ({"k_heads": 2}, r"query heads 8, key heads 2: must be equal, or pass enable_gqa=True"),
        ({"q_dims": 2}, r"query: \(9, 64\); must be a \(N, \.\.\., H, L, E\) torch tensor"),
    ],
)  # fmt: skip
def test_sdpa_call_refuses_what_it_cannot_do_by_name(kw, match):
    q_len, heads = kw.pop("q_len", 9), kw.pop("k_heads", 8)
    q = meta(9, 64) if kw.pop("q_dims", 4) == 2 else meta(1, 8, q_len, 64)
    k = meta(1, heads, 9, 64)
    with pytest.raises(ValueError, match=match):
        fgt.scaled_dot_product_attention(q, k, k, **kw)


def test_sdpa_call_refuses_leading_dims_that_differ():
    q, k = meta(2, 3, 8, 5, 64), meta(3, 2, 8, 9, 64)
    with pytest.raises(ValueError, match=r"the leading \(batch\) dimensions must be equal"):
        fgt.scaled_dot_product_attention(q, k, k)


def test_fa_calls_read_negative_window_sides_and_softcap_as_flashattention_does(monkeypatch):
    seen = {}
    monkeypatch.setattr(fgt, "attention", lambda q, k, v, **kw: seen.update(kw) or (
        meta(*q.shape), meta(*q.shape[:3], dtype=torch.float32)))  # fmt: skip
    x = meta(1, 5, 8, 64)
    fgt.flash_attn_func(x, x, x, window_size=(-7, 3), softcap=-1.0)
    assert seen["window"] == (-1, 3) and "softcap" not in seen
