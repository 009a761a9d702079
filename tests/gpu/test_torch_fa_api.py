"""FlashAttention's dense calls in `flashgen.torch` on the GPU: `flash_attn_func` and the packed
variants give `attention`'s output and gradients bit for bit on the (B, T, H, d) layout."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
import flashgen.torch as fgt  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_func_is_attention_on_transposed_views(causal: bool) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    b, t, h, h_kv, d = 2, 300, 8, 2, 128
    q = torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, t, h_kv, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in "kv")  # fmt: skip
    out, lse, probs = fgt.flash_attn_func(q, k, v, causal=causal, window_size=(64, 64),
                                          return_attn_probs=True)  # fmt: skip
    want, want_lse = fgt.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                   causal=causal, window=(64, 64), return_lse=True)  # fmt: skip
    assert out.is_contiguous() and out.shape == (b, t, h, d) and probs is None
    assert torch.equal(out, want.transpose(1, 2)) and torch.equal(lse, want_lse)


def test_qkvpacked_gradients_equal_the_separate_calls() -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    b, t, h, d = 2, 257, 4, 64
    qkv = torch.randn(b, t, 3, h, d, device="cuda", dtype=torch.float16, generator=g)
    packed = qkv.clone().requires_grad_()
    # deterministic: dQ's float adds in a fixed order, so the two runs can agree bit for bit
    fgt.flash_attn_qkvpacked_func(packed, causal=True, deterministic=True).float().square(
    ).sum().backward()
    leaves = [x.clone().requires_grad_() for x in qkv.unbind(2)]
    fgt.flash_attn_func(*leaves, causal=True, deterministic=True).float().square().sum().backward()
    assert torch.equal(packed.grad, torch.stack([x.grad for x in leaves], dim=2))


def test_the_packed_varlen_calls_give_flash_attn_varlen_funcs_output() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the varlen kernels are family wgmma's (sm_90)")
    g = torch.Generator(device="cuda").manual_seed(2)
    lens = [300, 0, 77, 1000]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")  # fmt: skip
    qkv = torch.randn(sum(lens), 3, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    want = fgt.flash_attn_varlen_func(*qkv.unbind(1), cu, cu, 1000, 1000, causal=True)
    assert torch.equal(fgt.flash_attn_varlen_qkvpacked_func(qkv, cu, 1000, causal=True), want)
    q, kv = qkv[:, 0], qkv[:, 1:]
    assert torch.equal(fgt.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 1000, 1000, causal=True),
                       want)  # fmt: skip


def test_the_sdpa_call_is_attention_with_its_shapes_folded() -> None:
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(2, 3, 8, 129, 64, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(2, 3, 2, 129, 64, device="cuda", dtype=torch.float16, generator=g)
            for _ in "kv")  # fmt: skip
    out = fgt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = fgt.attention(q.reshape(6, 8, 129, 64), k.reshape(6, 2, 129, 64),
                         v.reshape(6, 2, 129, 64), causal=True)  # fmt: skip
    assert out.shape == q.shape and torch.equal(out, want.reshape(q.shape))


def test_the_sdpa_call_agrees_with_torchs_own_on_its_semantics() -> None:
    """GQA's head mapping (query head i reads K/V head i // group) and the causal mask at
    L == S, against torch's call computed in float32 (the math backend); the bound is the
    bf16 output's rounding (2^-8 relative) on outputs of magnitude ~1, with room."""
    import torch.nn.functional as F

    g = torch.Generator(device="cuda").manual_seed(4)
    q = torch.randn(2, 8, 200, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(2, 2, 200, 64, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in "kv")  # fmt: skip
    out = fgt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                              enable_gqa=True)  # fmt: skip
    assert (out.float() - want).abs().max().item() < 2e-2
