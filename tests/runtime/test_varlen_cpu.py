"""Packed variable-length batches without a GPU: the `varlen` token, its ABI block, the grid,
what refuses it, the torch front door's checks and its registered op."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from flashgen.generator import abi
from flashgen.generator.compile import compile_kernel
from flashgen.generator.render import render
from flashgen.generator.schedulers import VARLEN_PERSISTENT
from flashgen.generator.spec import KernelSpec, SpecError

NAME = "flash_fwd_wgmma_d128_br128_bc128_bf16_causal_varlen_s2"


def test_a_varlen_spec_has_a_name_that_reads_back():
    s = KernelSpec.from_name(NAME)
    assert "varlen" in s.features and s.name == NAME
    w = KernelSpec.from_name(NAME.replace("causal", "causal_window_softcap"))
    assert w.features == ("window", "softcap", "varlen")


@pytest.mark.parametrize(
    "name, rule",
    [
        ("flash_fwd_mma_d128_br64_bc64_bf16_causal_varlen_w4", "not supported by family mma"),
        ("flash_bwd_mma_d128_br64_bc64_bf16_causal_varlen_w4_s1", "drop varlen for direction"),
    ],
)
def test_families_and_directions_without_varlen_refuse_it(name: str, rule: str):
    with pytest.raises(SpecError, match=rule):
        KernelSpec.from_name(name)


def test_only_varlen_variants_take_the_sequences_block():
    assert abi.forward(("window",)) == abi.FWD
    assert abi.forward(("varlen",)) == (*abi.FWD, *abi.VARLEN_FWD)
    names = [p.name for p in abi.VARLEN]
    assert names == ["cu_seqlens_q", "cu_seqlens_k", "n_seqs"]
    # the forward's block adds the dynamic scheduler's counter; the backward takes VARLEN only
    assert [p.name for p in abi.VARLEN_FWD] == [*names, "work_counter"]
    assert abi.backward(("varlen",)) == (*abi.BWD, *abi.VARLEN)
    src = render(KernelSpec.from_name(NAME)).source
    assert "const int* __restrict__ cu_seqlens_q" in src or "const int* cu_seqlens_q" in src
    assert "int* __restrict__ work_counter" in src
    made = "WorkList work(cu_seqlens_q, cu_seqlens_k, work_counter, n_seqs, n_heads, tq, tk);"
    assert made in src
    plain = render(KernelSpec.from_name(NAME.replace("_varlen", ""))).source
    assert "cu_seqlens" not in plain and "varlen_persistent" not in plain


def test_the_work_ring_sits_between_the_barriers_and_the_order_in_shared_memory():
    """The varlen forward's shared memory: the dense layout, then the work ring (a full and an
    empty mbarrier and WORK_INTS words per slot), then the sequences' order; the template's
    static_assert checks the same sum, so a drift fails its compile too."""
    from flashgen.generator.families import wgmma

    slots, ints = wgmma.VARLEN_WORK_SLOTS, wgmma.VARLEN_WORK_INTS

    s = KernelSpec.from_name(NAME)
    dense = KernelSpec.from_name(NAME.replace("_varlen", ""))
    work = wgmma.VARLEN_WORK_BYTES
    assert work == slots * (16 + 4 * ints)
    assert work % 16 == 0 and ints >= 7  # a Work's 7 ints, 8-B barriers
    order = 4 * wgmma.VARLEN_SORT_MAX
    assert s.smem_bytes == dense.smem_bytes + work + order
    src = render(s).source
    assert f"constexpr int WORK_SLOTS = {slots};" in src
    assert f"constexpr int WORK_INTS = {ints};" in src
    assert "WORK_BYTES + 4 * VARLEN_SORT_MAX" in src
    # only the scheduler thread draws (WorkList: the draw and finish's count); the load issuer
    # and the consumers take their items from the ring through objects shadowing the WorkList
    assert src.count("atomicAdd(counter") == 2 and src.count("work.finish();") == 1
    assert "const IssuerWork work{issuer};" in src and "const ConsumerWork work;" in src


def test_the_torch_counter_is_one_pair_per_stream_and_fresh_words_under_capture(
    monkeypatch: pytest.MonkeyPatch,
):
    """flashgen.varlen's scheduler words: eager calls on one (device, stream) share a pair (the
    kernel leaves it zero; zeroed once, when made), other streams get their own, and a call
    under CUDA-graph capture gets fresh zeroed words (a replay shares them with nothing)."""
    torch = pytest.importorskip("torch")
    from flashgen import varlen

    made: list[tuple[object, ...]] = []

    def zeros(*shape: int, dtype: object, device: str) -> object:
        made.append((shape, dtype, device))
        return types.SimpleNamespace(numel=lambda: shape[0])

    capturing = [False]
    monkeypatch.setattr(varlen, "_counters", {})
    monkeypatch.setattr(varlen.torch, "zeros", zeros)
    monkeypatch.setattr(varlen.torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    a = varlen._work_counter(0, 0x10)
    assert varlen._work_counter(0, 0x10) is a and len(made) == 1
    assert made[0] == ((2,), torch.int32, "cuda:0")
    b = varlen._work_counter(0, 0x20)
    c = varlen._work_counter(1, 0x10)
    assert len({id(a), id(b), id(c)}) == 3 and len(made) == 3
    capturing[0] = True
    g1, g2 = varlen._work_counter(0, 0x10), varlen._work_counter(0, 0x10)
    assert g1 is not g2 and a not in (g1, g2) and len(made) == 5
    capturing[0] = False
    assert varlen._work_counter(0, 0x10) is a and len(made) == 5


def test_the_grid_bounds_the_items_by_the_totals():
    s = KernelSpec.from_name(NAME)
    # 16 sequences, 16k tokens, 16 heads: at most (128 + 16 + 1 padding) tiles per head;
    # persistent on 132 SMs when the longest sequences see few key tiles
    assert VARLEN_PERSISTENT.varlen_grid(s, 16, 16, 16384, 4096, 4096, 132) == (132, 1, 1)
    assert VARLEN_PERSISTENT.varlen_grid(s, 16, 16, 16384, 4096, 4096, 0) == (145 * 16, 1, 1)
    # one long non-causal sequence: a block per item
    n = KernelSpec.from_name(NAME.replace("causal", "noncausal"))
    assert VARLEN_PERSISTENT.varlen_grid(n, 1, 8, 32768, 32768, 32768, 132) == (258 * 8, 1, 1)
    assert VARLEN_PERSISTENT.varlen_grid(s, 3, 2, 0, 0, 0, 132) == (8, 1, 1)  # all empty
    with pytest.raises(TypeError, match="varlen_grid"):
        VARLEN_PERSISTENT.grid(s, 1, 1, 1, 1, 132)


def test_check_refuses_a_varlen_spec_and_bundles_take_it():
    from flashgen.bundle.emit import bundle_context
    from flashgen.verify.checks import check_problem

    s = KernelSpec.from_name(NAME)
    with pytest.raises(ValueError, match="a varlen variant; `check` runs dense batches"):
        check_problem(s, b=1, h=1, tq=1, tk=1, seed=0, scale=None)
    assert bundle_context([s])["varlen_variants"][0]["kernel"] == s.name  # its own launcher


def test_the_torch_front_door_refuses_bad_calls_with_one_clear_error():
    torch = pytest.importorskip("torch")
    from flashgen.torch import flash_attn_varlen_func

    q = torch.zeros(10, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"q on cpu: must be on a CUDA device"):
        flash_attn_varlen_func(q, q, q, cu, cu, 6, 6)
    with pytest.raises(ValueError, match=r"causal='yes': must be True or False"):
        flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, causal="yes")
    with pytest.raises(ValueError, match=r"window_size=5: must be \(left, right\)"):
        flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, window_size=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"softcap='x': must be a float"):
        flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, softcap="x")  # type: ignore[arg-type]
    # FlashAttention's argument order and names: dropout_p comes eighth
    with pytest.raises(ValueError, match=r"dropout_p=0.125: flashgen has no attention dropout"):
        flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, 0.125)
    with pytest.raises(ValueError, match=r"deterministic=True: the varlen backward has no"):
        flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, dropout_p=0.0, deterministic=True)
    with pytest.raises(ValueError, match=r"block_table: paged K/V is not supported"):
        flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, block_table=cu)


def test_the_varlen_op_is_registered_and_traces_with_fake_tensors():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import flashgen.torch  # noqa: F401  (registers the ops)

    with FakeTensorMode():
        q = torch.empty(100, 4, 64, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(90, 2, 32, dtype=torch.bfloat16, device="cuda")
        cu = torch.empty(3, dtype=torch.int32, device="cuda")
        o, lse = torch.ops.flashgen.varlen_attention(q, v, v, cu, cu, 60, 60, True)
        out, lse2, probs = flashgen.torch.flash_attn_varlen_func(
            q, v, v, cu, cu, 60, 60, causal=True, return_attn_probs=True
        )
    assert tuple(o.shape) == (100, 4, 32) and tuple(lse.shape) == (4, 100)
    assert tuple(out.shape) == (100, 4, 32) and tuple(lse2.shape) == (4, 100) and probs is None


def test_the_packed_varlen_calls_unbind_their_projection_and_grads_flow_back():
    torch = pytest.importorskip("torch")
    import flashgen.torch as fgt

    qkv = torch.empty(100, 3, 4, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    o = fgt.flash_attn_varlen_qkvpacked_func(qkv, cu, 60, causal=True)
    assert tuple(o.shape) == (100, 4, 64)
    o.sum().backward()
    assert qkv.grad is not None and qkv.grad.shape == qkv.shape
    q = torch.empty(100, 4, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(80, 2, 2, 32, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match=r"kv: \(80, 2, 32\); must be a \(total, 2, H, d\)"):
        fgt.flash_attn_varlen_kvpacked_func(q, kv[:, :1].squeeze(1), cu, cu, 60, 60)
    assert fgt.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 60, 60).shape == (100, 4, 32)


@pytest.mark.compile_all  # nvcc runs: the compile-everything check's, not the default's
@pytest.mark.parametrize(
    "name",
    [
        NAME,
        "flash_fwd_wgmma_d64_br128_bc128_fp16_noncausal_varlen_s2",
        "flash_fwd_wgmma_d128_br128_bc128_bf16_causal_window_softcap_varlen_s2",
        "flash_fwd_wgmma_d128_br128_bc128_bf16_noncausal_alibi_varlen_s2",
    ],
)
def test_varlen_variants_compile_without_spills(nvcc_required: Path, name: str):
    k = compile_kernel(KernelSpec.from_name(name), "sm_90a")
    assert k.report.spill_bytes == 0, (name, k.report)
