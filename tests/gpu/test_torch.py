"""`flashgen.torch` on the GPU: correctness against the oracle, streams, CUDA graphs,
torch.compile, a second GPU, no synchronization. Skipped without torch built with CUDA."""

from __future__ import annotations

import threading
import time
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.verify.oracle import check_outputs

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
fgt = pytest.importorskip("flashgen.torch")

pytestmark = pytest.mark.gpu

TORCH_TYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
NP_TYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def to_np(t: Any, dtype: str) -> np.ndarray:
    """A (B, H, T, d) tensor as a contiguous NumPy array of the storage dtype (bit exact)."""
    return t.detach().float().cpu().contiguous().numpy().astype(NP_TYPES[dtype])


def model_layout(b: int, t: int, h: int, d: int, dtype: str, seed: int, device: str = "cuda"):
    """q, k, v as (B, H, T, d) views of one fused (B, T, 3, H, d) projection."""
    g = torch.Generator(device=device).manual_seed(seed)
    fused = torch.randn(b, t, 3, h, d, device=device, dtype=TORCH_TYPES[dtype], generator=g)
    return tuple(x.transpose(1, 2) for x in fused.unbind(2))


def assert_correct(o, lse, q, k, v, *, causal: bool, scale: float, dtype: str) -> None:
    out = check_outputs(
        to_np(o, dtype), lse.cpu().numpy(), to_np(q, dtype), to_np(k, dtype), to_np(v, dtype),
        causal=causal, scale=scale, dtype=dtype,
    )  # fmt: skip
    assert out.passed, out


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("causal", [False, True])
def test_model_layout_views_match_the_oracle_and_o_keeps_the_layout(dtype: str, causal: bool):
    q, k, v = model_layout(2, 77, 3, 64, dtype, seed=1)
    o, lse = fgt.attention(q, k, v, causal=causal, return_lse=True)
    assert o.device == q.device and o.dtype == q.dtype and o.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, 77)
    assert o.transpose(1, 2).is_contiguous()
    torch.cuda.synchronize()
    assert_correct(o, lse, q, k, v, causal=causal, scale=64**-0.5, dtype=dtype)


@pytest.mark.parametrize("tq,tk", [(1, 1), (1, 300), (130, 77), (300, 1000)])
def test_lengths_and_tq_ne_tk(tq: int, tk: int):
    g = torch.Generator(device="cuda").manual_seed(tq * 7 + tk)
    q = torch.randn(1, 8, tq, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, 8, tk, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))  # fmt: skip
    o, lse = fgt.attention(q, k, v, causal=True, scale=0.3, return_lse=True)
    torch.cuda.synchronize()
    assert_correct(o, lse, q, k, v, causal=True, scale=0.3, dtype="bf16")


def test_a_given_spec_runs_and_a_misaligned_pointer_is_refused_like_numpy():
    q, k, v = model_layout(1, 50, 2, 64, "fp16", seed=2)
    simt = KernelSpec(family="simt", d=64, br=32, bc=32, dtype="fp16", causal=True)
    o, lse = fgt.attention(q, k, v, causal=True, spec=simt, return_lse=True)
    torch.cuda.synchronize()
    assert_correct(o, lse, q, k, v, causal=True, scale=0.125, dtype="fp16")
    mma = next(s for s in shipped("mma") if s.d == 64 and s.dtype == "fp16" and s.causal)
    flat = torch.randn(1 * 2 * 50 * 64 + 1, device="cuda", dtype=torch.float16)
    odd = flat[1:].view(1, 2, 50, 64)  # 2-byte aligned
    with pytest.raises(ValueError, match=r"q pointer 0x[0-9a-f]+: family mma needs 16-byte"):
        fgt.attention(odd, odd, odd, causal=True, spec=mma)
    o = fgt.attention(odd, odd, odd, causal=True)  # spec=None selects a variant that fits
    torch.cuda.synchronize()
    assert torch.isfinite(o.float()).all()


def slow_producer(stream: Any, target: Any, value: Any) -> None:
    """On `stream`: spin ~50 ms, then write `value` into `target` (a late producer)."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)
        target.copy_(value)


def test_a_side_stream_producer_then_flashgen_on_that_stream_is_ordered():
    q0, k, v = model_layout(1, 256, 8, 64, "bf16", seed=3)
    real_q = torch.randn_like(q0)
    want = fgt.attention(real_q, k, v)
    side = torch.cuda.Stream()
    q = torch.zeros_like(q0)
    torch.cuda.synchronize()
    slow_producer(side, q, real_q)
    with torch.cuda.stream(side):
        got = fgt.attention(q, k, v)
    side.synchronize()
    assert torch.equal(got, want)


def test_the_old_default_stream_launch_would_race_with_that_producer():
    # what flashgen.attention did before flashgen.torch: launch on the legacy default stream,
    # which does not wait for torch's (non-blocking) side streams
    q0, k, v = model_layout(1, 256, 8, 64, "bf16", seed=3)
    real_q = torch.randn_like(q0)
    want = fgt.attention(real_q, k, v)
    spec = KernelSpec(family="simt", d=64, dtype="bf16")
    o = torch.empty_like(real_q)
    lse = torch.empty(real_q.shape[:3], device="cuda", dtype=torch.float32)
    q = torch.zeros_like(q0)
    runtime.launch(spec, q, k, v, o, lse)  # compile and load outside the race
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    slow_producer(side, q, real_q)
    runtime.launch(spec, q, k, v, o, lse, None, sync=False)  # reads q before it is written
    torch.cuda.synchronize()
    assert not torch.allclose(o.float(), want.float(), atol=1e-2)


def test_the_call_does_not_synchronize():
    q, k, v = model_layout(1, 128, 8, 64, "bf16", seed=4)
    fgt.attention(q, k, v)  # warm: validated, compiled, loaded
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU work queued ahead
    t0 = time.perf_counter()
    for _ in range(10):
        fgt.attention(q, k, v)
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    assert host < 0.1, f"10 calls took {host:.3f} s of host time behind a 0.5 s kernel"


def test_cuda_graph_capture_and_100_replays_are_bit_identical():
    q, k, v = model_layout(2, 300, 4, 128, "bf16", seed=5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch's docs ask
        for _ in range(3):
            fgt.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = fgt.attention(q, k, v, causal=True, return_lse=True)
    want, want_lse = fgt.attention(q, k, v, causal=True, return_lse=True)
    for _ in range(100):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(o, want) and torch.equal(lse, want_lse)
    q.copy_(torch.randn_like(q))  # replays read the captured (static) inputs
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, fgt.attention(q, k, v, causal=True))


class Block(torch.nn.Module):
    """Model-layout attention: fused QKV projection, flashgen, output projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x: Any) -> Any:
        b, t, c = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = (y.transpose(1, 2) for y in qkv.unbind(2))
        o = fgt.attention(q, k, v, causal=True)
        return self.out(o.transpose(1, 2).reshape(b, t, c))


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_torch_compile_fullgraph_matches_eager(backend: str):
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block(512, 4).cuda().to(torch.bfloat16)
    x = torch.randn(2, 200, 512, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    with torch.no_grad():
        want = block(x)
        got = compiled(x)
        got2 = compiled(x)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert torch.equal(got, got2)


def test_a_fresh_thread_with_no_current_context_launches():
    q, k, v = model_layout(1, 64, 2, 64, "fp16", seed=6)
    want = fgt.attention(q, k, v)
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(fgt.attention(q, k, v)))
    worker.start()
    worker.join()
    torch.cuda.synchronize()
    assert torch.equal(out[0], want)


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


@two_gpus
def test_tensors_on_cuda1_run_there_with_cuda0_current():
    torch.cuda.set_device(0)
    q, k, v = model_layout(2, 90, 4, 64, "bf16", seed=7, device="cuda:1")
    torch.cuda.synchronize(1)
    o, lse = fgt.attention(q, k, v, causal=True, return_lse=True)  # on cuda:1's current stream
    assert o.device == torch.device("cuda:1") and lse.device == torch.device("cuda:1")
    assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert_correct(o, lse, q, k, v, causal=True, scale=0.125, dtype="bf16")
    with torch.cuda.device(1):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            again = fgt.attention(q, k, v, causal=True)
        side.synchronize()
    assert torch.equal(again, o)


@two_gpus
def test_inputs_on_two_devices_are_refused():
    q, _, _ = model_layout(1, 10, 2, 64, "bf16", seed=8, device="cuda:0")
    _, k, v = model_layout(1, 10, 2, 64, "bf16", seed=8, device="cuda:1")
    with pytest.raises(ValueError, match=r"q, k, v on cuda:0, cuda:1, cuda:1: must be on one"):
        fgt.attention(q, k, v)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("d", [64, 80])
def test_features_through_the_op_match_the_oracle(dtype: str, d: int):
    """GQA (8 query heads on 2), a causal window, softcap and ALiBi slopes as a CUDA tensor,
    eagerly and through the dispatcher (torch.ops), at a shipped and an on-demand head dim."""
    g = torch.Generator(device="cuda").manual_seed(5)
    dt = TORCH_TYPES[dtype]
    q = torch.randn(2, 8, 150, d, device="cuda", dtype=dt, generator=g)
    k, v = (torch.randn(2, 2, 190, d, device="cuda", dtype=dt, generator=g) for _ in "kv")
    slopes = 2.0 ** (-torch.arange(1, 9, device="cuda", dtype=torch.float32))
    kw = {"causal": True, "window": (33, 0), "softcap": 20.0, "alibi_slopes": slopes}
    o, lse = fgt.attention(q, k, v, return_lse=True, **kw)
    o2, lse2 = torch.ops.flashgen.attention(q, k, v, True, None, None, 33, 0, 20.0, slopes)
    torch.cuda.synchronize()
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    out = check_outputs(
        to_np(o, dtype), lse.cpu().numpy(), to_np(q, dtype), to_np(k, dtype), to_np(v, dtype),
        causal=True, scale=d**-0.5, dtype=dtype, window=(33, 0), softcap=20.0,
        alibi_slopes=slopes.cpu().numpy(),
    )  # fmt: skip
    assert out.passed, out
    with pytest.raises(ValueError, match=r"alibi_slopes.shape=\(2,\): must be \(8,\)"):
        fgt.attention(q, k, v, alibi_slopes=slopes[:2])


def test_alibi_slope_views_at_one_pointer_are_checked_on_every_call():
    """The signature cache keyed the slopes by pointer alone: after one valid call, s[::2] at
    that pointer ran with s[0:H]'s values, s[:1] made the kernel read H floats from a
    1-element tensor and float64 memory was read as float32, all silently. Now a view at the
    same pointer with the right layout gives the right answer and any other a clear error."""
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(1, 4, 97, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, 4, 131, 64, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in "kv")  # fmt: skip
    wide = torch.tensor([0.5, 0.0, 0.25, 0.0, 0.125, 0.0, 0.0625, 0.0, 1, 1, 1, 1, 1, 1, 1, 1],
                        device="cuda", dtype=torch.float32)  # fmt: skip
    first, every_other = wide[:4], wide[:8][::2]  # one pointer, two layouts

    def check(o, lse, slopes):
        torch.cuda.synchronize()
        out = check_outputs(
            to_np(o, "bf16"), lse.cpu().numpy(), to_np(q, "bf16"), to_np(k, "bf16"),
            to_np(v, "bf16"), causal=False, scale=64**-0.5, dtype="bf16",
            alibi_slopes=slopes.cpu().numpy(),
        )  # fmt: skip
        assert out.passed, out

    o, lse = fgt.attention(q, k, v, alibi_slopes=first, return_lse=True)
    check(o, lse, first)
    with pytest.raises(ValueError, match="must be contiguous"):
        fgt.attention(q, k, v, alibi_slopes=every_other)
    o, lse = fgt.attention(q, k, v, alibi_slopes=every_other.contiguous(), return_lse=True)
    check(o, lse, every_other)  # the fix the error names gives the strided view's values
    with pytest.raises(ValueError, match=r"alibi_slopes.shape=\(1,\): must be \(4,\)"):
        fgt.attention(q, k, v, alibi_slopes=first[:1])
    as_f64 = wide.view(torch.float64)[:4]  # float64 (4,) at the same pointer
    assert as_f64.data_ptr() == first.data_ptr()
    with pytest.raises(ValueError, match=r"alibi_slopes.dtype=torch.float64: must be float32"):
        fgt.attention(q, k, v, alibi_slopes=as_f64)
    o, lse = fgt.attention(q, k, v, alibi_slopes=first, return_lse=True)  # still right after
    check(o, lse, first)
