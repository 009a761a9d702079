"""`flashgen.torch.flash_attn_with_kvcache` on the GPU: appending the new tokens' K/V and
attending equals writing the rows by hand and calling attention_with_kvcache over the longer
lengths (bit for bit: the same kernel on the same data), contiguous and shuffled pages; a
sequence that overflows gets NaN rows and leaves its cache alone while the others are right;
a decode step with the append captured once in a CUDA graph replays with new lengths and never
synchronizes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
from flashgen.kvappend import flash_attn_with_kvcache  # noqa: E402
from flashgen.kvcache import attention_with_kvcache  # noqa: E402

from ._graphs import assert_no_sync, capture  # noqa: E402

pytestmark = pytest.mark.gpu
B, H, H_KV, D, CAP, T_NEW = 3, 8, 2, 128, 512, 2


def _setup(page: int, seed: int = 0):  # noqa: ANN202
    g = torch.Generator(device="cuda").manual_seed(seed)
    kw = {"device": "cuda", "dtype": torch.bfloat16, "generator": g}
    q = torch.randn(B, T_NEW, H, D, **kw)
    k, v = torch.randn(B, T_NEW, H_KV, D, **kw), torch.randn(B, T_NEW, H_KV, D, **kw)
    if page == 0:
        kc, vc = torch.randn(B, CAP, H_KV, D, **kw), torch.randn(B, CAP, H_KV, D, **kw)
        table = None
    else:
        n_pages = B * CAP // page
        kc = torch.randn(n_pages, page, H_KV, D, **kw)
        vc = torch.randn(n_pages, page, H_KV, D, **kw)
        perm = torch.randperm(n_pages, device="cuda", generator=g)
        table = perm.to(torch.int32).view(B, CAP // page)
    return q, k, v, kc, vc, table


def _by_hand(kc, vc, k, v, lens, table):  # noqa: ANN001, ANN202
    kc, vc = kc.clone(), vc.clone()
    for b, n in enumerate(lens):
        for t in range(k.shape[1]):
            p = n + t
            if table is None:
                kc[b, p], vc[b, p] = k[b, t], v[b, t]
            else:
                page = int(table[b, p // kc.shape[1]])
                kc[page, p % kc.shape[1]], vc[page, p % kc.shape[1]] = k[b, t], v[b, t]
    return kc, vc


@pytest.mark.parametrize("page", [0, 16, 7])
def test_append_then_attend_equals_writing_by_hand(page: int) -> None:
    q, k, v, kc, vc, table = _setup(page)
    lens = [0, 100, CAP - T_NEW]
    kh, vh = _by_hand(kc, vc, k, v, lens, table)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    o, lse = flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seq, block_table=table,
                                     causal=True, return_softmax_lse=True)  # fmt: skip
    o2, lse2 = attention_with_kvcache(q, kh, vh, seq + T_NEW, block_table=table, causal=True,
                                      return_lse=True)  # fmt: skip
    assert torch.equal(kc, kh) and torch.equal(vc, vh)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_an_overflowing_sequence_gets_nan_rows_and_an_untouched_cache() -> None:
    q, k, v, kc, vc, table = _setup(0, seed=1)
    before = kc[2].clone()
    seq = torch.tensor([5, 9, CAP - 1], dtype=torch.int32, device="cuda")
    o = flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seq)
    assert torch.isnan(o[2]).all() and not torch.isnan(o[:2]).any()
    assert torch.equal(kc[2], before)


def test_graph_captured_append_replays_with_new_lengths_without_sync() -> None:
    q, k, v, kc, vc, table = _setup(16, seed=2)
    seq = torch.tensor([3, 40, 200], dtype=torch.int32, device="cuda")
    call = lambda: flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seq,  # noqa: E731
                                           block_table=table, causal=True)  # fmt: skip
    call()  # compiles and loads
    assert_no_sync(call)
    graph, out = capture(call)
    for lens in ([0, 1, 2], [100, 7, CAP - T_NEW], [300, 300, 10]):
        seq.copy_(torch.tensor(lens, dtype=torch.int32))
        kh, vh = _by_hand(kc, vc, k, v, lens, table)
        graph.replay()
        torch.cuda.synchronize()
        want = attention_with_kvcache(q, kh, vh, seq + T_NEW, block_table=table, causal=True)
        assert torch.equal(out, want), lens
