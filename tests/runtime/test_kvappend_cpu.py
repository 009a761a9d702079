"""flashgen.kvappend on CPU tensors (the append is device-agnostic torch indexing): new rows land
where a per-row Python reference puts them, in contiguous and paged (shuffled, odd page size)
caches; a sequence that does not fit is not written at all and gets length -1; refused rows
clobber nothing, not even a valid sequence's new rows in the same page; the FlashAttention-
shaped front door refuses what it does not support, naming it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from flashgen.kvappend import append_kv, flash_attn_with_kvcache  # noqa: E402


def _reference(k_cache, v_cache, k, v, lens, table):  # noqa: ANN001, ANN202
    """Row by row: each sequence that fits (every target page in range) writes its rows."""
    kc, vc = k_cache.clone(), v_cache.clone()
    out = []
    b, t_new = k.shape[:2]
    for s in range(b):
        n = int(lens[s])
        if table is None:
            cap = kc.shape[1]
            fits = n >= 0 and n + t_new <= cap
            targets = [(s, n + t) for t in range(t_new)] if fits else []
        else:
            ps, n_pages = kc.shape[1], kc.shape[0]
            cap = table.shape[1] * ps
            fits = n >= 0 and n + t_new <= cap
            targets = []
            if fits:
                for t in range(t_new):
                    page = int(table[s, (n + t) // ps])
                    if not 0 <= page < n_pages:
                        fits = False
                        break
                    targets.append((page, (n + t) % ps))
            targets = targets if fits else []
        for t, (i0, i1) in enumerate(targets):
            kc[i0, i1] = k[s, t]
            vc[i0, i1] = v[s, t]
        out.append(n + t_new if fits else -1)
    return kc, vc, torch.tensor(out, dtype=torch.int32)


def _check(k_cache, v_cache, k, v, lens, table=None) -> torch.Tensor:  # noqa: ANN001
    kc, vc, want = _reference(k_cache, v_cache, k, v, lens, table)
    got = append_kv(k_cache, v_cache, k, v, lens, table)
    assert torch.equal(got, want)
    assert torch.equal(k_cache, kc)
    assert torch.equal(v_cache, vc)
    return got


def test_contiguous_append_and_overflow() -> None:
    g = torch.Generator().manual_seed(0)
    kc = torch.randn(3, 8, 2, 16, generator=g)
    vc = torch.randn(3, 8, 2, 16, generator=g)
    k, v = torch.randn(3, 2, 2, 16, generator=g), torch.randn(3, 2, 2, 16, generator=g)
    before = kc.clone()
    got = _check(kc, vc, k, v, torch.tensor([2, 6, 7], dtype=torch.int32))
    assert got.tolist() == [4, 8, -1]
    assert torch.equal(kc[2], before[2])  # the sequence that overflows: untouched


def test_nothing_fits_changes_nothing() -> None:
    kc, vc = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8)
    k, v = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8)
    kb, vb = kc.clone(), vc.clone()
    got = append_kv(kc, vc, k, v, torch.tensor([2, -1], dtype=torch.int32))
    assert got.tolist() == [-1, -1]
    assert torch.equal(kc, kb) and torch.equal(vc, vb)


def test_refused_rows_do_not_clobber_a_valid_sequence() -> None:
    """Sequence 1's table names page 99 (out of range): its rows must not land on the page
    sequence 0 is writing (page 0 after a clamp would be the naive outcome)."""
    kc, vc = torch.zeros(4, 2, 1, 8), torch.zeros(4, 2, 1, 8)
    table = torch.tensor([[0, 1], [99, 2]], dtype=torch.int32)
    k = torch.stack([torch.full((1, 1, 8), 1.0), torch.full((1, 1, 8), 2.0)])
    got = _check(kc, vc, k, k.clone(), torch.tensor([0, 0], dtype=torch.int32), table)
    assert got.tolist() == [1, -1]
    assert float(kc[0, 0, 0, 0]) == 1.0 and float(kc.abs().sum()) == 8.0


@pytest.mark.parametrize("seed", range(12))
def test_random_paged_and_contiguous_appends_match_the_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    b = int(torch.randint(1, 5, (1,), generator=g))
    t_new = int(torch.randint(1, 5, (1,), generator=g))
    ps = [1, 3, 4, 7][seed % 4]
    per_seq = int(torch.randint(1, 4, (1,), generator=g))
    cap = per_seq * ps
    lens = torch.randint(-1, cap + 2, (b,), generator=g, dtype=torch.int32)
    k, v = torch.randn(b, t_new, 2, 8, generator=g), torch.randn(b, t_new, 2, 8, generator=g)
    if seed % 2:  # contiguous
        _check(torch.randn(b, cap, 2, 8, generator=g), torch.randn(b, cap, 2, 8, generator=g),
               k, v, lens)  # fmt: skip
        return
    n_pages = b * per_seq
    table = torch.randperm(n_pages, generator=g).to(torch.int32).view(b, per_seq)
    if seed % 3 == 0:  # a bad page index somewhere
        table[int(torch.randint(0, b, (1,), generator=g)), -1] = n_pages + 5
    _check(torch.randn(n_pages, ps, 2, 8, generator=g), torch.randn(n_pages, ps, 2, 8, generator=g),
           k, v, lens, table)  # fmt: skip


def test_append_refuses_bad_arguments() -> None:
    kc = torch.zeros(2, 8, 1, 16)
    k = torch.zeros(2, 1, 1, 16)
    lens = torch.zeros(2, dtype=torch.int32)
    want = r"k.shape=\(2, 1, 1, 8\): must be \(B=2, T_new >= 1, 1, 16\)"
    with pytest.raises(ValueError, match=want):
        append_kv(kc, kc, torch.zeros(2, 1, 1, 8), k, lens)
    with pytest.raises(ValueError, match="appending needs an int32 \\(2,\\) tensor"):
        append_kv(kc, kc, k, k, lens.long())
    with pytest.raises(ValueError, match="pass v.to\\(cache\\)"):
        append_kv(kc, kc, k, k.double(), lens)
    with pytest.raises(ValueError, match="block_table: must be an int32"):
        append_kv(kc, kc, k, k, lens, torch.zeros(2, 1))
    with pytest.raises(ValueError, match="k_cache: list of shape None: must be a 4-D"):
        append_kv([], kc, k, k, lens)
    with pytest.raises(ValueError, match="the two caches must hold the same rows"):
        append_kv(kc, kc[:, :4], k, k, lens)


def test_front_door_refuses_what_it_does_not_support() -> None:
    q = torch.zeros(1, 1, 2, 16)
    kc = torch.zeros(1, 8, 1, 16)
    with pytest.raises(ValueError, match="rotary_cos: rotary embeddings are not applied"):
        flash_attn_with_kvcache(q, kc, kc, rotary_cos=torch.zeros(8, 8))
    with pytest.raises(ValueError, match="cache_batch_idx: not supported"):
        flash_attn_with_kvcache(q, kc, kc, cache_batch_idx=torch.zeros(1))
    with pytest.raises(ValueError, match="k and v: pass both"):
        flash_attn_with_kvcache(q, kc, kc, k=torch.zeros(1, 1, 1, 16))
    k1 = torch.zeros(1, 1, 1, 16)
    with pytest.raises(ValueError, match="q.dtype=torch.float32: must be torch.float16"):
        flash_attn_with_kvcache(q, kc, kc, k=k1, v=k1, cache_seqlens=0)
    with pytest.raises(ValueError, match="share one dtype and device"):
        flash_attn_with_kvcache(q.half(), kc, kc, k=k1, v=k1, cache_seqlens=0)
    assert not kc.any()  # refused before anything was written
    with pytest.raises(ValueError, match="cache_seqlens=None with k, v"):
        flash_attn_with_kvcache(q.half(), kc.half(), kc.half(), k=k1.half(), v=k1.half())


def _paged_case(seed: int = 0):  # noqa: ANN202
    g = torch.Generator().manual_seed(seed)
    kc, vc = torch.randn(6, 3, 2, 8, generator=g), torch.randn(6, 3, 2, 8, generator=g)
    k, v = torch.randn(2, 2, 2, 8, generator=g), torch.randn(2, 2, 2, 8, generator=g)
    table = torch.tensor([[5, 0, 3], [1, 4, 2]], dtype=torch.int32)
    lens = torch.tensor([2, 8], dtype=torch.int32)  # the second one overflows
    return kc, vc, k, v, lens, table


def test_the_registered_op_passes_torch_opcheck() -> None:
    """flashgen::append_kv's schema (the caches declared written), fake implementation and
    functionalization agree with what the op does."""
    kc, vc, k, v, lens, table = _paged_case()
    torch.library.opcheck(torch.ops.flashgen.append_kv.default, (kc, vc, k, v, lens, table))


def test_append_under_torch_compile_fullgraph_writes_the_caches() -> None:
    kc, vc, k, v, lens, table = _paged_case(1)
    kc2, vc2 = kc.clone(), vc.clone()
    want = append_kv(kc, vc, k, v, lens, table)
    compiled = torch.compile(append_kv, fullgraph=True, backend="aot_eager")
    got = compiled(kc2, vc2, k, v, lens, table)
    assert torch.equal(got, want) and got.tolist() == [4, -1]
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
