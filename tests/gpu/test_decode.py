"""`flashgen.torch.attention_with_kvcache` on the GPU: contiguous and paged caches against the
float64 oracle (per sequence), ragged and zero lengths, every page size class, GQA packing,
forced and chosen splits, features; NaN for out-of-range lengths and pages; CUDA-graph replay
with new lengths; no host synchronization; on sm_90 the split merge kernel against the
in-kernel merge (FLASHGEN_DECODE_COMBINE)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flashgen.verify.oracle import check_outputs

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
from flashgen.kvcache import attention_with_kvcache  # noqa: E402

from ._graphs import assert_no_sync, capture  # noqa: E402

pytestmark = pytest.mark.gpu

TORCH_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
NP_TYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def _np(t: Any, dtype: str) -> np.ndarray:
    return t.detach().float().cpu().contiguous().numpy().astype(NP_TYPES[dtype])


def make_cache(
    b: int, tq: int, h: int, h_kv: int, d: int, lens: list[int], dtype: str, seed: int,
    page: int = 0, dv: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """q (B, Tq, H, d); a cache holding max(lens) + slack keys per sequence, contiguous
    (page=0) or in shuffled pages of `page` keys; int32 lengths."""
    dv = dv or d
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = TORCH_TYPES[dtype]
    cap = max(max(lens), 1) + 5
    q = torch.randn(b, tq, h, d, device="cuda", dtype=t, generator=g)
    k = torch.randn(b, cap, h_kv, d, device="cuda", dtype=t, generator=g)
    v = torch.randn(b, cap, h_kv, dv, device="cuda", dtype=t, generator=g)
    out: dict[str, Any] = {"q": q, "k_dense": k, "v_dense": v, "lens": lens}
    out["seqlens"] = torch.tensor(lens, device="cuda", dtype=torch.int32)
    if page:
        per_seq = -(-cap // page)
        n_pages = b * per_seq + 3  # a few pages nobody uses
        perm = torch.randperm(n_pages, generator=torch.Generator().manual_seed(seed))[: b * per_seq]
        table = perm.view(b, per_seq).to(torch.int32).cuda()
        kp = torch.randn(n_pages, page, h_kv, d, device="cuda", dtype=t, generator=g)
        vp = torch.randn(n_pages, page, h_kv, dv, device="cuda", dtype=t, generator=g)
        for s in range(b):  # copy each sequence's keys into its pages
            for j in range(per_seq):
                lo, hi = j * page, min(cap, (j + 1) * page)
                if lo < hi:
                    kp[table[s, j], : hi - lo] = k[s, lo:hi]
                    vp[table[s, j], : hi - lo] = v[s, lo:hi]
        out.update(k=kp, v=vp, table=table)
    else:
        out.update(k=k, v=v, table=None)
    return out


def assert_matches_oracle(
    o: Any, lse: Any, c: dict[str, Any], causal: bool, dtype: str, **features: Any
) -> None:
    torch.cuda.synchronize()
    q, k, v = c["q"], c["k_dense"], c["v_dense"]
    d = q.shape[-1]
    feats = {
        key: (val.cpu().numpy() if hasattr(val, "cpu") else val) for key, val in features.items()
    }
    for s, n in enumerate(c["lens"]):
        if n == 0:  # no key: zeros and -inf (the oracle takes no empty key axis)
            assert (o[s] == 0).all() and (lse[s] == float("-inf")).all(), s
            continue
        qs = _np(q[s : s + 1].transpose(1, 2), dtype)
        ks = _np(k[s : s + 1, :n].transpose(1, 2), dtype)
        vs = _np(v[s : s + 1, :n].transpose(1, 2), dtype)
        os_ = _np(o[s : s + 1].transpose(1, 2), dtype)
        ls = lse[s : s + 1].cpu().numpy()
        res = check_outputs(os_, ls, qs, ks, vs, causal=causal, scale=d**-0.5, dtype=dtype, **feats)
        assert res.passed, (s, n, res)


CASES = [
    # (b, tq, h, h_kv, d, dtype, causal, page, lens)
    (4, 1, 32, 8, 128, "bf16", False, 0, [1, 77, 4096, 0]),
    (3, 4, 32, 8, 128, "bf16", True, 0, [5, 1000, 3000]),
    (2, 1, 8, 1, 128, "fp16", False, 16, [2049, 31]),
    (2, 4, 8, 1, 128, "bf16", True, 256, [4000, 600]),
    (3, 2, 16, 2, 64, "bf16", True, 1, [3, 40, 129]),
    (2, 3, 6, 3, 64, "fp16", False, 7, [100, 1]),
    (1, 1, 4, 4, 256, "bf16", False, 0, [1500]),
    (2, 16, 8, 2, 128, "bf16", True, 64, [16, 900]),
    (2, 1, 4, 1, 72, "fp16", True, 0, [333, 8]),
]


@pytest.mark.parametrize(
    "case",
    CASES,
    ids=lambda c: f"b{c[0]}q{c[1]}h{c[2]}/{c[3]}d{c[4]}{c[5]}{'c' if c[6] else ''}p{c[7]}",
)
def test_decode_matches_the_oracle(case: tuple[Any, ...]) -> None:
    b, tq, h, h_kv, d, dtype, causal, page, lens = case
    c = make_cache(b, tq, h, h_kv, d, lens, dtype, seed=sum(lens) + d, page=page)
    o, lse = attention_with_kvcache(
        c["q"], c["k"], c["v"], c["seqlens"], block_table=c["table"], causal=causal, return_lse=True
    )
    assert o.shape == (b, tq, h, d) and lse.shape == (b, h, tq)
    assert_matches_oracle(o, lse, c, causal, dtype)


@pytest.mark.parametrize("splits", [1, 2, 7, 16, 17, 64, 128, 256])  # 17+: two merge levels
def test_every_split_count_merges_to_the_same_answer(splits: int) -> None:
    c = make_cache(3, 2, 16, 4, 128, [5000, 17, 0], "bf16", seed=splits, page=32)
    o, lse = attention_with_kvcache(
        c["q"], c["k"], c["v"], c["seqlens"], block_table=c["table"], causal=True,
        num_splits=splits, return_lse=True,
    )  # fmt: skip
    assert_matches_oracle(o, lse, c, True, "bf16")


@pytest.mark.parametrize(
    "features",
    [
        {"window": (100, 0)},
        {"softcap": 20.0},
        {"alibi": True},
        {"window": (50, 3), "softcap": 10.0},
    ],
    ids=["window", "softcap", "alibi", "window+softcap"],
)
def test_features(features: dict[str, Any]) -> None:
    c = make_cache(2, 3, 8, 2, 128, [700, 90], "bf16", seed=3, page=16)
    if features.pop("alibi", False):
        features["alibi_slopes"] = torch.rand(8, device="cuda", dtype=torch.float32)
    causal = "window" not in features
    o, lse = attention_with_kvcache(
        c["q"], c["k"], c["v"], c["seqlens"], block_table=c["table"], causal=causal,
        return_lse=True, **features,
    )  # fmt: skip
    assert_matches_oracle(o, lse, c, causal, "bf16", **features)


def test_int_seqlen_and_whole_cache() -> None:
    c = make_cache(2, 1, 8, 2, 64, [300, 300], "fp16", seed=5)
    o, lse = attention_with_kvcache(c["q"], c["k"], c["v"], 300, return_lse=True)
    assert_matches_oracle(o, lse, c, False, "fp16")
    cap = c["k"].shape[1]
    c["lens"] = [cap, cap]
    o, lse = attention_with_kvcache(c["q"], c["k"], c["v"], return_lse=True)
    assert_matches_oracle(o, lse, c, False, "fp16")


def test_out_of_range_lengths_and_pages_give_nan_rows_not_wrong_ones() -> None:
    c = make_cache(3, 1, 8, 2, 128, [100, 200, 300], "bf16", seed=7, page=16)
    lens = c["seqlens"].clone()
    lens[0] = 10**6  # past the capacity
    table = c["table"].clone()
    table[2, 0] = 10**6  # not a page
    o, lse = attention_with_kvcache(
        c["q"], c["k"], c["v"], lens, block_table=table, return_lse=True
    )
    torch.cuda.synchronize()
    assert torch.isnan(o[0]).all() and torch.isnan(lse[0]).all()
    assert torch.isnan(o[2]).all() and torch.isnan(lse[2]).all()
    c2 = dict(c, q=c["q"][1:2], k_dense=c["k_dense"][1:2], v_dense=c["v_dense"][1:2], lens=[200])
    assert_matches_oracle(o[1:2], lse[1:2], c2, False, "bf16")


def test_cuda_graph_replays_with_new_lengths_and_never_synchronizes() -> None:
    c = make_cache(4, 1, 32, 8, 128, [4096, 4096, 4096, 4096], "bf16", seed=11, page=64)
    lens = c["seqlens"]
    args = (c["q"], c["k"], c["v"], lens)
    attention_with_kvcache(*args, block_table=c["table"])  # compiles and loads
    assert_no_sync(lambda: attention_with_kvcache(*args, block_table=c["table"]))
    graph, out = capture(
        lambda: attention_with_kvcache(*args, block_table=c["table"], return_lse=True)
    )
    for new in ([1, 4096, 17, 2000], [0, 5, 3000, 4096], [4096, 1, 1, 1]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches_oracle(out[0], out[1], dict(c, lens=new), False, "bf16")


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"q": "fp32"}, "float16 or torch.bfloat16"),
        ({"heads": 5}, "multiple of the K/V heads"),
        ({"seqlens": "int64"}, "torch.int32"),
        ({"seqlens_int": 10**9}, "capacity"),
        ({"splits": -1}, "num_splits"),
        ({"table_dtype": torch.int64}, "torch.int32"),
    ],
)
def test_bad_input_is_one_clear_error(bad: dict[str, Any], match: str) -> None:
    c = make_cache(2, 1, 8, 2, 64, [10, 20], "bf16", seed=1, page=8)
    q, k, v, lens, table = c["q"], c["k"], c["v"], c["seqlens"], c["table"]
    kw: dict[str, Any] = {"block_table": table}
    if "q" in bad:
        q = q.float()
    if "heads" in bad:
        q = q[:, :, :5]
    if "seqlens" in bad:
        lens = lens.long()
    if "seqlens_int" in bad:
        lens = bad["seqlens_int"]
    if "splits" in bad:
        kw["num_splits"] = bad["splits"]
    if "table_dtype" in bad:
        kw["block_table"] = table.to(bad["table_dtype"])
    with pytest.raises(ValueError, match=match):
        attention_with_kvcache(q, k, v, lens, **kw)


@pytest.mark.parametrize(
    "tq, h, h_kv, tk, causal, layout, features",
    [
        (1, 32, 8, 4096, False, "bhtd", {}),
        (4, 32, 8, 1000, True, "bthd", {}),
        (2, 8, 1, 700, True, "bhtd", {"window": (128, 0), "softcap": 20.0}),
        (16, 4, 4, 300, False, "bthd", {}),
    ],
)
def test_dense_attention_with_few_query_rows_runs_the_decode_kernel(
    tq: int, h: int, h_kv: int, tk: int, causal: bool, layout: str, features: dict[str, Any]
) -> None:
    import flashgen.torch as fgt
    from flashgen.kvcache import DenseDecode

    g = torch.Generator(device="cuda").manual_seed(tq * tk)
    b, d = 2, 128

    def make(t: int, heads: int) -> Any:
        shape = (b, t, heads, d) if layout == "bthd" else (b, heads, t, d)
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)
        return x.transpose(1, 2) if layout == "bthd" else x  # bthd: the model layout's view

    q, k, v = make(tq, h), make(tk, h_kv), make(tk, h_kv)
    q.requires_grad_(True)
    fgt.clear_cache()
    o, lse = fgt.attention(q, k, v, causal=causal, return_lse=True, **features)
    assert [type(e.bound) for e in fgt._entries.values()] == [DenseDecode]
    assert o.stride() == fgt.out_strides(tuple(o.shape), q.stride())  # q's layout, as documented
    c = {"lens": [tk] * b, "q": q.detach().transpose(1, 2)}
    c.update(k_dense=k.transpose(1, 2), v_dense=v.transpose(1, 2))
    assert_matches_oracle(o.detach().transpose(1, 2), lse.detach(), c, causal, "bf16", **features)
    # the backward kernels take the decode kernel's O and LSE
    do = torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=g)
    o.backward(do)
    if not causal and not features:  # against fp32 math
        qf = q.detach().float().requires_grad_(True)
        kf, vf = (x.float().repeat_interleave(h // h_kv, dim=1) for x in (k, v))
        torch.nn.functional.scaled_dot_product_attention(qf, kf, vf).backward(do.float())
        err = (q.grad.float() - qf.grad).norm() / qf.grad.norm()
        assert err < 2e-2, err
    assert q.grad is not None and torch.isfinite(q.grad).all()


def _both_merges(call: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """`call()` with the splits merged by the merge kernel (FLASHGEN_DECODE_COMBINE=1, sm_90's
    default), then inside the decode launch (=0): each on freshly prepared signatures."""
    from flashgen import kvcache

    out = []
    for flag in ("1", "0"):
        monkeypatch.setenv("FLASHGEN_DECODE_COMBINE", flag)
        kvcache.clear_cache()
        out.append(call())
    kvcache.clear_cache()
    return out[0], out[1]


def _assert_same_answer(a: tuple[Any, Any], b: tuple[Any, Any], dtype: str) -> None:
    """O and LSE of the two merges: NaN, -inf and zero rows in the same places, the rest equal
    up to the storage dtype's rounding (the merges add the splits in other orders)."""
    torch.cuda.synchronize()
    (o1, l1), (o0, l0) = a, b
    assert torch.equal(torch.isnan(o1), torch.isnan(o0)) and torch.equal(l1.isnan(), l0.isnan())
    assert torch.equal(l1 == float("-inf"), l0 == float("-inf"))
    rtol = 2**-7 if dtype == "bf16" else 2**-9
    torch.testing.assert_close(o1, o0, rtol=rtol, atol=1e-4, equal_nan=True)
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("splits", [2, 7, 16, 17, 64, 256])
@pytest.mark.parametrize("d, dtype, page", [(128, "bf16", 32), (64, "fp16", 0)])
def test_the_combine_kernel_gives_the_in_kernel_merges_answer(
    splits: int, d: int, dtype: str, page: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sm_90: the merge kernel against the in-kernel merge (before sm_90 both runs merge
    # in-kernel). Sequences: long; empty (O 0, LSE -inf); a length past the capacity (NaN);
    # a bad page at key 160 (NaN from one split only: the merge spreads it over the row) or,
    # contiguous, an ordinary one; one key with 3 causal rows (rows 0 and 1 see no key). 3 query
    # heads per K/V head x 3 tokens = 9 packed rows of a 16-row tile: 7 pad rows.
    c = make_cache(5, 3, 6, 2, d, [5000, 0, 3000, 700, 1], dtype, seed=splits + d, page=page)
    lens = c["seqlens"].clone()
    lens[2] = 10**6
    table = c["table"]
    if table is not None:
        table = table.clone()
        table[3, 5] = 10**6

    def call() -> Any:
        return attention_with_kvcache(
            c["q"], c["k"], c["v"], lens, block_table=table, causal=True, num_splits=splits,
            return_lse=True,
        )  # fmt: skip

    merged, in_kernel = _both_merges(call, monkeypatch)
    _assert_same_answer(merged, in_kernel, dtype)
    o, lse = merged
    assert torch.isnan(o[2]).all() and torch.isnan(lse[2]).all()
    if table is not None:
        assert torch.isnan(o[3]).all() and torch.isnan(lse[3]).all()
    assert (o[1] == 0).all() and (lse[1] == float("-inf")).all()
    assert (o[4, :2] == 0).all() and (lse[4, :, :2] == float("-inf")).all()
    assert torch.isfinite(o[4, 2]).all() and torch.isfinite(lse[4, :, 2]).all()
    for s in [0] if table is not None else [0, 3]:
        sub = {key: c[key][s : s + 1] for key in ("q", "k_dense", "v_dense")}
        assert_matches_oracle(o[s : s + 1], lse[s : s + 1], dict(sub, lens=[c["lens"][s]]),
                              True, dtype)  # fmt: skip


def test_the_combine_kernel_replays_in_a_cuda_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    # two captured launches (decode, then its merge kernel), replayed with new lengths: the
    # answers of eager calls that merge in-kernel
    c = make_cache(2, 1, 8, 1, 128, [4096, 4096], "bf16", seed=13)
    lens = c["seqlens"]
    args = (c["q"], c["k"], c["v"], lens)
    monkeypatch.setenv("FLASHGEN_DECODE_COMBINE", "1")
    from flashgen import kvcache

    kvcache.clear_cache()
    attention_with_kvcache(*args, num_splits=16)  # compiles and loads
    assert_no_sync(lambda: attention_with_kvcache(*args, num_splits=16))
    graph, out = capture(lambda: attention_with_kvcache(*args, num_splits=16, return_lse=True))
    monkeypatch.setenv("FLASHGEN_DECODE_COMBINE", "0")
    kvcache.clear_cache()
    for new in ([1, 4096], [0, 3000], [4096, 17]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        want = attention_with_kvcache(*args, num_splits=16, return_lse=True)
        _assert_same_answer(out, want, "bf16")
    kvcache.clear_cache()
