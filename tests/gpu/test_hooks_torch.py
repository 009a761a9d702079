"""`flashgen.torch.attention(..., score_mod=, mask_mod=, aux=)` on the GPU: forward (O, LSE) and
gradients against the float64 oracle evaluating the same hooks, aux tensors and scalars,
(B, T, H, d) views, features beside hooks, torch.compile and CUDA-graph replay."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flashgen.generator import hooks as hk
from flashgen.generator.features.hook import HookCall
from flashgen.generator.hooks import library
from flashgen.verify import oracle
from flashgen.verify.oracle_bwd import check_grads

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
import flashgen.torch as fgt  # noqa: E402

pytestmark = pytest.mark.gpu
NP = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16}


def _np(t: Any) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(NP[t.dtype])


def _f64(*ts: Any) -> list[np.ndarray]:
    return [_np(t) for t in ts]


def _rel_bias(score, b, h, q_idx, kv_idx, bias, gain):
    rel = hk.minimum(hk.maximum(kv_idx - q_idx + 31, 0), 63)
    return gain * score + bias[h, rel]


REL_BIAS = hk.trace_score_mod(
    _rel_bias, hk.Aux("bias", "float32", 2), hk.Aux("gain", "float32", 0)
)


def _case(name: str, h: int, t: int) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """(score_mod, mask_mod, torch aux, oracle aux) of a named case."""
    g = torch.Generator().manual_seed(len(name))
    if name == "softcap":
        return library.softcap_hook(), None, {"softcap": 20.0}, {"softcap": 20.0}
    if name == "document":
        ids = torch.sort(torch.randint(0, 5, (t,), generator=g)).values.to(torch.int32)
        return None, library.document_hook(), {"doc_ids": ids.cuda()}, {"doc_ids": ids.numpy()}
    if name == "prefix":
        return None, library.prefix_lm_hook(), {"prefix": t // 3}, {"prefix": t // 3}
    if name == "relbias+document":
        bias = torch.randn(h, 64, generator=g, dtype=torch.float32)
        ids = torch.sort(torch.randint(0, 3, (t,), generator=g)).values.to(torch.int32)
        return (
            REL_BIAS, library.document_hook(),
            {"bias": bias.cuda(), "gain": 0.7, "doc_ids": ids.cuda()},
            {"bias": bias.numpy(), "gain": 0.7, "doc_ids": ids.numpy()},
        )  # fmt: skip
    raise KeyError(name)


def _oracle_kw(score_mod: Any, mask_mod: Any, aux: dict[str, Any]) -> dict[str, Any]:
    kw = {}
    for hook in (score_mod, mask_mod):
        if hook is not None:
            kw[hook.kind] = HookCall(hook, {a.name: aux[a.name] for a in hook.aux})
    return kw


CASES = [
    ("softcap", 64, torch.bfloat16, True),
    ("document", 128, torch.bfloat16, False),
    ("prefix", 64, torch.float16, False),
    ("relbias+document", 128, torch.float16, True),
    ("softcap", 72, torch.bfloat16, False),  # Hopper: a wgmma tile generated on demand
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-d{c[1]}-{'c' if c[3] else 'n'}")
def test_hooked_attention_forward_and_gradients_match_the_oracle(case: tuple[Any, ...]) -> None:
    name, d, dtype, causal = case
    b, t, h = 2, 300, 4
    score_mod, mask_mod, aux, host_aux = _case(name, h, t)
    g = torch.Generator(device="cuda").manual_seed(d + t)
    x = torch.randn(b, t, 3, h, d, device="cuda", dtype=dtype, generator=g)
    q, k, v = (y.transpose(1, 2).requires_grad_() for y in x.unbind(2))  # (B, H, T, d) views
    o, lse = fgt.attention(q, k, v, causal=causal, score_mod=score_mod, mask_mod=mask_mod,
                           aux=aux, return_lse=True)  # fmt: skip
    do = torch.randn_like(o)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    torch.cuda.synchronize()
    kw = _oracle_kw(score_mod, mask_mod, host_aux)
    qs, ks, vs = _f64(q, k, v)
    name_of = "bf16" if dtype == torch.bfloat16 else "fp16"
    res = oracle.check_outputs(_np(o), lse.cpu().numpy(), qs, ks, vs, causal=causal,
                               scale=d**-0.5, dtype=name_of, **kw)  # fmt: skip
    assert res.passed, res
    outcomes = check_grads(
        (_np(dq), _np(dk), _np(dv)), qs, ks, vs, _np(do), dtype=name_of, scale=d**-0.5,
        causal=causal, **kw,
    )  # fmt: skip
    bad = [f"{g.name}: err {g.err:.3g} > bound {g.bound:.3g}" for g in outcomes if not g.passed]
    assert not bad, "; ".join(bad)


def test_features_beside_a_mask_hook_and_compile_and_graphs() -> None:
    t, h, d = 256, 4, 64
    _, mask_mod, aux, host_aux = _case("document", h, t)
    q = torch.randn(1, h, t, d, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)

    def f(q: Any, k: Any, v: Any, ids: Any) -> Any:
        return fgt.attention(q, k, v, causal=True, mask_mod=mask_mod, aux={"doc_ids": ids},
                             window=(64, 0), return_lse=True)  # fmt: skip

    o, lse = torch.compile(f, fullgraph=True)(q, k, v, aux["doc_ids"])
    torch.cuda.synchronize()
    kw = _oracle_kw(None, mask_mod, host_aux)
    res = oracle.check_outputs(_np(o), lse.cpu().numpy(), *_f64(q, k, v), causal=True,
                               scale=d**-0.5, dtype="bf16", window=(64, 0), **kw)  # fmt: skip
    assert res.passed, res
    f(q, k, v, aux["doc_ids"])  # eager: compile and load
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        og, _ = f(q, k, v, aux["doc_ids"])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(og, o)


def _assert_mask_matches_oracle(o: Any, lse: Any, grads: tuple[Any, ...],
                                qkv64: list[np.ndarray], do: Any, mask_mod: Any,
                                aux: dict[str, Any]) -> None:  # fmt: skip
    """O, LSE and dQ, dK, dV of a non-causal bf16 call with `mask_mod` (its aux as NumPy
    values) against the oracle, at the default scale."""
    qs, ks, vs = qkv64
    scale = qs.shape[-1] ** -0.5
    kw = _oracle_kw(None, mask_mod, aux)
    res = oracle.check_outputs(_np(o), lse.cpu().numpy(), qs, ks, vs, causal=False,
                               scale=scale, dtype="bf16", **kw)  # fmt: skip
    assert res.passed, res
    outcomes = check_grads(tuple(_np(g) for g in grads), qs, ks, vs, _np(do), dtype="bf16",
                           scale=scale, causal=False, **kw)  # fmt: skip
    assert all(g.passed for g in outcomes), [g for g in outcomes if not g.passed]


def test_each_call_reads_its_own_aux_tables_under_one_signature() -> None:
    # Calls of one signature share a prepared launch whose aux pointers are the call's own
    # (hook_ptrs): tables of the same shape at other addresses, with other contents (and so
    # other range summaries), each give their own answer, forward and backward, in any order.
    b, t, h, d = 1, 384, 2, 64
    g = torch.Generator().manual_seed(7)
    tables = [
        torch.sort(torch.randint(0, n, (t,), generator=g)).values.to(torch.int32)
        for n in (2, 6, 1)
    ]
    mask_mod = library.document_hook()
    x = torch.randn(b, t, 3, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = (y.transpose(1, 2).requires_grad_() for y in x.unbind(2))
    do = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)
    qs, ks, vs = _f64(q, k, v)
    for ids in (*tables, tables[0], tables[2], tables[1]):
        aux = {"doc_ids": ids.cuda()}  # a fresh device copy: a new address every call
        o, lse = fgt.attention(q, k, v, mask_mod=mask_mod, aux=aux, return_lse=True)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        torch.cuda.synchronize()
        _assert_mask_matches_oracle(o, lse, (dq, dk, dv), (qs, ks, vs), do, mask_mod,
                                    {"doc_ids": ids.numpy()})  # fmt: skip


@pytest.mark.parametrize("n", [1, 63, 64, 65, 4096, 16384 + 7, 200_003, 262_144])
def test_the_summary_kernel_builds_the_host_summary(n: int) -> None:
    # the op's one-launch range summary (runtime/summary_kernel.py) against summarize's, on
    # sorted document ids and on int32's ends (min and max kept apart), at chunk edges and at
    # the kernel's largest table
    from flashgen.generator.hooks.summary import chunks, levels, summarize
    from flashgen.runtime import summary_kernel

    rng = np.random.default_rng(n)
    for t in (
        np.sort(rng.integers(0, 40, n)).astype(np.int32),
        rng.choice(np.asarray([-(2**31), 2**31 - 1, 5], np.int32), n),
    ):
        dev = torch.from_numpy(t).cuda()
        out = torch.full((levels(n), 2, chunks(n)), 7, dtype=torch.int32, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        summary_kernel.launch(dev.data_ptr(), n, out.data_ptr(), stream, 0,
                              "sm_{}{}".format(*torch.cuda.get_device_capability(0)))  # fmt: skip
        torch.cuda.synchronize()
        assert np.array_equal(out.cpu().numpy(), summarize(t).table)


def _head_window(b, h, q_idx, kv_idx):  # a mask that reads h: its map has a part per head
    return kv_idx <= q_idx + 100 * h


def _parted_documents(b, h, q_idx, kv_idx, ids):  # reads a table at ranges, b and h
    return (ids[q_idx] == ids[kv_idx]) & (kv_idx <= q_idx + 96 * h + 160 * b)


PARTED = hk.trace_mask_mod(_parted_documents, hk.Aux("ids", "int32", 1))


@pytest.mark.parametrize("d", [64, 128])
def test_block_maps_with_a_part_per_batch_and_head_match_the_oracle(d: int) -> None:
    # the op builds forward and backward block maps for a table-reading mask; this one reads
    # b and h too, so each map has a part per (batch, head): outputs and gradients against
    # the oracle, tq != tk (bottom-right keys past the queries)
    b, h, tq, tk = 2, 3, 320, 450
    g = torch.Generator().manual_seed(d)
    ids = torch.sort(torch.randint(0, 4, (tk,), generator=g)).values.to(torch.int32)
    q = torch.randn(b, tq, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(b, tk, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            for _ in range(2))  # fmt: skip
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    do = torch.randn(b, h, tq, d, device="cuda", dtype=torch.bfloat16)
    o, lse = fgt.attention(q, k, v, mask_mod=PARTED, aux={"ids": ids.cuda()}, return_lse=True)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    torch.cuda.synchronize()
    _assert_mask_matches_oracle(o, lse, (dq, dk, dv), _f64(q, k, v), do, PARTED,
                                {"ids": ids.numpy()})  # fmt: skip


@pytest.mark.parametrize(("tq", "tk", "br", "bc"), [(1000, 1500, 128, 128), (4096, 4096, 192, 128),
                                                    (300, 9000, 128, 176), (64, 64, 128, 64)])
def test_the_block_map_holds_the_tile_verdicts(tq: int, tk: int, br: int, bc: int) -> None:
    # runtime/block_map.py's kernel against hooks/tiles.py's verdicts (the rules the kernels'
    # `_tile` functions implement) on every (query tile, key tile): the document mask with its
    # range summary, and a table-free mask that reads h (a map part per head)
    from flashgen.generator.features.hook import HookArgs, token_of
    from flashgen.generator.hooks.summary import summarize
    from flashgen.generator.hooks.tiles import Box, TileClass, classify
    from flashgen.hooked import range_summary
    from flashgen.runtime import block_map

    arch = "sm_{}{}".format(*torch.cuda.get_device_capability(0))
    if arch not in ("sm_90",):
        pytest.skip(f"{arch}: block maps are read by family wgmma (sm_90)")
    rng = np.random.default_rng(tq + tk)
    ids = np.sort(rng.integers(0, 7, max(tq, tk))).astype(np.int32)
    doc = library.document_hook()
    head = hk.trace_mask_mod(_head_window)
    stream = torch.cuda.current_stream().cuda_stream
    for hook, heads in ((doc, 3), (head, 3)):
        tokens = (token_of(hook),)
        lay = block_map.layout(tokens, 2, heads, tq, tk, br, bc)
        assert lay.head_part == (heads if hook is head else 1) and lay.batch_part == 1
        if hook is doc:
            table = torch.from_numpy(ids).cuda()
            summary = range_summary(table)
            args = HookArgs([hook], {"doc_ids": table.data_ptr()},
                            {"doc_ids": (summary.data_ptr(), len(ids))})  # fmt: skip
            aux, summaries = {"doc_ids": ids}, {"doc_ids": summarize(ids)}
        else:
            args, aux, summaries = HookArgs([hook]), {}, {}
        out = torch.full((lay.size,), -1, dtype=torch.int32, device="cuda")
        block_map.launch(tokens, lay, tq, tk, args.kernel_args(), out.data_ptr(), stream, 0, arch)
        torch.cuda.synchronize()
        words = out.cpu().numpy().view(np.uint32).reshape(lay.head_part, lay.rows, lay.words, 2)
        key_tiles = -(-tk // bc)
        for h in range(lay.head_part):
            for qt in range(lay.rows):
                for t in range(lay.words * 32):
                    kept = (words[h, qt, t // 32, 0] >> (t % 32)) & 1
                    whole = (words[h, qt, t // 32, 1] >> (t % 32)) & 1
                    if t >= key_tiles:
                        assert (kept, whole) == (0, 0)
                        continue
                    box = Box(qt * br, min(qt * br + br, tq) - 1, t * bc, min(t * bc + bc, tk) - 1,
                              0, h, tq, tk)  # fmt: skip
                    want = classify(hook, box, aux, summaries)
                    assert (kept, whole) == (want != TileClass.NONE, want == TileClass.ALL), (
                        hook.name, h, qt, t, want)
        # the backward's layout: rows of key blocks (bc a multiple of 64), words over query
        # tiles of 64 rows, kept over the block's keys then whole per 64 keys where kept
        bbc = 128 if bc % 64 else bc
        back = block_map.layout(tokens, 2, heads, tq, tk, 64, bbc, backward=True)
        out = torch.full((back.size,), -1, dtype=torch.int32, device="cuda")
        block_map.launch(tokens, back, tq, tk, args.kernel_args(), out.data_ptr(), stream, 0,
                         arch)  # fmt: skip
        torch.cuda.synchronize()
        words = out.cpu().numpy().view(np.uint32).reshape(
            back.head_part, back.rows, back.words, back.planes
        )
        q_tiles = -(-tq // 64)
        for h in range(back.head_part):
            for kb in range(back.rows):
                kv0, kv_hi = kb * bbc, min(kb * bbc + bbc, tk) - 1
                for j in range(back.words * 32):
                    bits = [(words[h, kb, j // 32, p] >> (j % 32)) & 1 for p in range(back.planes)]
                    if j >= q_tiles:
                        assert not any(bits)
                        continue
                    rows = (j * 64, min(j * 64 + 64, tq) - 1)
                    want = classify(hook, Box(*rows, kv0, kv_hi, 0, h, tq, tk), aux, summaries)
                    assert bits[0] == (want != TileClass.NONE), (hook.name, h, kb, j, want)
                    for grp in range(bbc // 64):
                        kc0 = kv0 + 64 * grp
                        sub = Box(*rows, min(kc0, tk - 1), min(kc0 + 63, tk - 1), 0, h, tq, tk)
                        full = bits[0] and classify(hook, sub, aux, summaries) == TileClass.ALL
                        assert bits[1 + grp] == full, (hook.name, h, kb, j, grp)


@pytest.mark.parametrize("mask", ["document", "causal"])
def test_a_block_map_built_once_serves_every_call_alike(mask: str) -> None:
    # flashgen.torch.block_map built once, passed to calls of other q, k, v values (layers):
    # the same outputs and gradients, bit for bit, as the calls that build their own maps (a
    # table-free mask builds none per call: the given map must agree with the in-kernel
    # verdicts), and the oracle's; a CUDA graph replays with it; a changed table is refused
    b, t, h, d = 2, 640, 2, 64
    ids = (torch.arange(t, dtype=torch.int32) // 150).cuda()
    hook = library.document_hook() if mask == "document" else library.causal_hook()
    aux = {"doc_ids": ids} if mask == "document" else {}
    make = lambda: torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # noqa: E731
    q0, k0, v0 = make(), make(), make()
    bm = fgt.block_map(q0, k0, v0, mask_mod=hook, aux=aux)
    for _ in range(2):
        q, k, v = (make().requires_grad_() for _ in range(3))
        do = make()
        o, lse = fgt.attention(q, k, v, mask_mod=hook, aux=aux, block_map=bm, return_lse=True)
        grads = torch.autograd.grad(o, (q, k, v), do)
        o_self = fgt.attention(q, k, v, mask_mod=hook, aux=aux)
        grads_self = torch.autograd.grad(o_self, (q, k, v), do)
        assert torch.equal(o, o_self)
        assert all(torch.equal(x, y) for x, y in zip(grads, grads_self, strict=True))
    qs, ks, vs = _f64(q, k, v)
    kw = _oracle_kw(None, hook, {"doc_ids": ids.cpu().numpy()} if aux else {})
    res = oracle.check_outputs(_np(o), lse.cpu().numpy(), qs, ks, vs, causal=False, scale=d**-0.5,
                               dtype="bf16", **kw)  # fmt: skip
    assert res.passed, res
    with torch.no_grad():
        q, k, v = make(), make(), make()
        want = fgt.attention(q, k, v, mask_mod=hook, aux=aux, block_map=bm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = fgt.attention(q, k, v, mask_mod=hook, aux=aux, block_map=bm)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want)
    if mask == "document":
        ids.add_(1)  # the map's verdicts are for the table as it was
        with pytest.raises(ValueError, match="built from other aux tensors, or they were"):
            fgt.attention(q, k, v, mask_mod=hook, aux=aux, block_map=bm)
