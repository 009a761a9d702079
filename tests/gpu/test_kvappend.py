"""`flashgen.torch.flash_attn_with_kvcache` on the GPU: appending the new tokens' K/V and
attending equals writing the rows by hand and calling attention_with_kvcache over the longer
lengths (bit for bit: the same kernel on the same data), contiguous and shuffled pages; a
sequence that overflows gets NaN rows and leaves its cache alone while the others are right;
a decode step with the append captured once in a CUDA graph replays with new lengths and never
synchronizes. The append kernel (runtime/append_kernel.py) writes exactly what the torch ops of
`_append_rows` write, on random contiguous and shuffled paged caches of every page size, with
strided views and refused sequences of each kind, in one launch (one node of a CUDA graph),
eager and compiled."""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
from flashgen import kvappend  # noqa: E402
from flashgen.kvappend import append_kv, flash_attn_with_kvcache  # noqa: E402
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
    cap = CAP if page == 0 else (CAP // page) * page  # page 7: 73 whole pages, 511 rows
    lens = [0, 100, cap - T_NEW]  # the last sequence fills its cache to the last row
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


# ---- the append kernel against the torch ops ------------------------------------------------
MARGIN = 40  # rows of room past the new ones in every sequence's capacity


def _random_append(  # noqa: ANN202
    page: int, t_new: int, dtype: torch.dtype, seed: int, dv: int, strided: bool
):
    """Five sequences: 0 valid mid-cache, 1 a negative length, 2 one row past the capacity,
    3 (paged) a bad page index where its rows go (contiguous: valid), 4 valid up to the last
    row. Paged: shuffled pages, spare ones, and junk in table entries no new row touches.
    `strided`: k a head slice of a wider projection, v one element into wider rows (2-byte
    copies in 16-bit dtypes), the caches views with gaps, block table and lengths at stride 2."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, h, d = 5, 3, 64

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    if strided:
        k, v = rnd(b, t_new, h + 2, d)[:, :, 1 : h + 1], rnd(b, t_new, h, dv + 1)[..., 1:]
    else:
        k, v = rnd(b, t_new, h, d), rnd(b, t_new, h, dv)
    per_seq = 0 if page == 0 else -(-(t_new + MARGIN) // page)
    cap = t_new + MARGIN if page == 0 else per_seq * page
    rows = (b, cap) if page == 0 else (b * per_seq + 3, page)
    kc = rnd(*rows, h, d + 16)[..., :d] if strided else rnd(*rows, h, d)
    vc = rnd(*rows, 2 * h, dv)[:, :, ::2] if strided else rnd(*rows, h, dv)
    lens = [MARGIN // 2, -3, cap - t_new + 1, 0, cap - t_new]
    table = None
    if page:
        n_pages = rows[0]
        table = torch.randperm(n_pages, device="cuda", generator=g)[: b * per_seq]
        table = table.to(torch.int32).view(b, per_seq)
        table[3, (t_new - 1) // page] = n_pages if seed % 2 else -1  # touched by sequence 3
        if (MARGIN // 2 + t_new - 1) // page < per_seq - 1:
            table[0, -1] = -7  # not touched by sequence 0's new rows: no refusal
        if strided:
            wide = torch.full((b, 2 * per_seq), 99, dtype=torch.int32, device="cuda")
            wide[:, ::2] = table
            table = wide[:, ::2]
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    if strided:
        seq = torch.stack([seq, seq], 1)[:, 0]
    want_lens = [MARGIN // 2 + t_new, -1, -1, -1 if page else t_new, cap]
    return kc, vc, k, v, seq, table, want_lens


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the append kernel's launches (the real one runs; each signature's `Bound`)."""
    count: list[int] = []
    real = kvappend.append_kernel.Bound.launch

    def launch(self: object, *args: object) -> None:
        count.append(1)
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(kvappend.append_kernel.Bound, "launch", launch)
    return count


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("t_new", [1, 5, 300])
@pytest.mark.parametrize("page", [0, 1, 3, 16, 256])
def test_the_append_kernel_writes_what_the_torch_ops_write(launches, page, t_new, dtype) -> None:  # noqa: ANN001
    for seed, (dv, strided) in enumerate([(64, False), (32, True)]):
        kc, vc, k, v, seq, table, want_lens = _random_append(page, t_new, dtype, seed, dv, strided)
        kr, vr = kc.clone(), vc.clone()
        want = kvappend._append_rows(kr, vr, k, v, seq, table)
        before = len(launches)
        got = append_kv(kc, vc, k, v, seq, table)
        assert len(launches) == before + 1, "the kernel did not run"
        assert got.dtype == torch.int32 and got.tolist() == want.tolist() == want_lens
        assert torch.equal(kc, kr) and torch.equal(vc, vr), (seed, dv, strided)


def _graph_node_types(call) -> list[int]:  # noqa: ANN001
    """The CUDA graph node types (CUgraphNodeType; 0 a kernel) of `call` captured once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        pytest.skip("this torch cannot keep a captured graph to read its nodes")
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        call()
    lib = ctypes.CDLL("libcuda.so.1")
    handle = ctypes.c_void_p(int(graph.raw_cuda_graph()))
    n = ctypes.c_size_t(0)
    assert lib.cuGraphGetNodes(handle, None, ctypes.byref(n)) == 0
    nodes = (ctypes.c_void_p * n.value)()
    assert lib.cuGraphGetNodes(handle, nodes, ctypes.byref(n)) == 0
    types = []
    for node in nodes:
        t = ctypes.c_int(-1)
        assert lib.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t)) == 0
        types.append(t.value)
    return types


@pytest.mark.parametrize("page", [0, 16])
def test_an_append_is_one_kernel_launch_and_never_synchronizes(launches, page) -> None:  # noqa: ANN001
    kc, vc, k, v, seq, table, _ = _random_append(page, 1, torch.bfloat16, 0, 64, False)
    call = lambda: append_kv(kc, vc, k, v, seq, table)  # noqa: E731
    call()  # compiles and loads
    assert_no_sync(call)
    assert _graph_node_types(call) == [0]  # one kernel node, nothing else
    op = lambda: torch.ops.flashgen.append_kv.default(kc, vc, k, v, seq, table)  # noqa: E731
    assert _graph_node_types(op) == [0]  # the registered op's implementation: the same launch


def test_a_compiled_step_appends_with_the_kernel(launches) -> None:  # noqa: ANN001
    kc, vc, k, v, seq, table, want_lens = _random_append(16, 5, torch.float16, 1, 32, True)
    kr, vr = kc.clone(), vc.clone()
    want = kvappend._append_rows(kr, vr, k, v, seq, table)
    compiled = torch.compile(append_kv, fullgraph=True, backend="aot_eager")
    got = compiled(kc, vc, k, v, seq, table)
    assert launches and got.tolist() == want.tolist() == want_lens
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
