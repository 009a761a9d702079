"""`flashgen.torch.flash_attn_varlen_func` on the GPU (family wgmma, sm_90): packed ragged
batches against the float64 oracle per sequence (zero-length sequences, lengths that are not
multiples of the tiles, Tq != Tk per sequence, GQA, d 64/128, fp16/bf16, causal, window,
softcap, ALiBi), NaN rows for key ranges outside k, CUDA-graph replay with new lengths, no
host synchronization, torch.compile; and the gradients (the varlen backward) against the float64
oracle per sequence with the project's gradient rule (`oracle_bwd.check_grads`)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flashgen.verify.oracle import check_outputs
from flashgen.verify.oracle_bwd import check_grads

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the varlen kernels are family wgmma's (sm_90)", allow_module_level=True)
from flashgen.torch import flash_attn_varlen_func  # noqa: E402

pytestmark = pytest.mark.gpu

TORCH_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
NP_TYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def _np(t: Any, dtype: str) -> np.ndarray:
    return t.detach().float().cpu().contiguous().numpy().astype(NP_TYPES[dtype])


def _cu(lens: list[int]) -> Any:
    return torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32, device="cuda")


def make_batch(
    lens_q: list[int], lens_k: list[int], h: int, h_kv: int, d: int, dtype: str, seed: int,
    slack: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Packed q (total_q + slack, H, d), k and v (total_k + slack, H_kv, d); int32 prefix sums.
    `slack` rows past the last sequence belong to no sequence."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = TORCH_TYPES[dtype]
    tq, tk = sum(lens_q) + slack, sum(lens_k) + slack
    return {
        "q": torch.randn(tq, h, d, device="cuda", dtype=t, generator=g),
        "k": torch.randn(tk, h_kv, d, device="cuda", dtype=t, generator=g),
        "v": torch.randn(tk, h_kv, d, device="cuda", dtype=t, generator=g),
        "cu_q": _cu(lens_q),
        "cu_k": _cu(lens_k),
        "lens_q": lens_q,
        "lens_k": lens_k,
    }


def assert_matches_oracle(
    o: Any, lse: Any, c: dict[str, Any], causal: bool, dtype: str, scale: float | None = None,
    **features: Any,
) -> None:  # fmt: skip
    torch.cuda.synchronize()
    d = c["q"].shape[-1]
    feats = {
        key: (val.cpu().numpy() if hasattr(val, "cpu") else val) for key, val in features.items()
    }
    cq, ck = c["cu_q"].tolist(), c["cu_k"].tolist()
    for s, (nq, nk) in enumerate(zip(c["lens_q"], c["lens_k"], strict=True)):
        if nq == 0:
            continue
        rows = slice(cq[s], cq[s] + nq)
        if nk == 0:  # no key: zeros and -inf (the oracle takes no empty key axis)
            assert (o[rows] == 0).all() and (lse[:, rows] == float("-inf")).all(), s
            continue
        keys = slice(ck[s], ck[s] + nk)
        qs = _np(c["q"][rows].transpose(0, 1)[None], dtype)
        ks = _np(c["k"][keys].transpose(0, 1)[None], dtype)
        vs = _np(c["v"][keys].transpose(0, 1)[None], dtype)
        os_ = _np(o[rows].transpose(0, 1)[None], dtype)
        ls = lse[:, rows][None].cpu().numpy()
        res = check_outputs(
            os_, ls, qs, ks, vs, causal=causal, scale=scale or d**-0.5, dtype=dtype, **feats
        )
        assert res.passed, (s, nq, nk, res)


CASES = [
    # (lens_q, lens_k (None: = lens_q), h, h_kv, d, dtype, causal)
    ([300, 0, 1, 128, 1000, 77], None, 8, 8, 128, "bf16", True),
    ([300, 0, 1, 128, 1000, 77], None, 8, 2, 128, "fp16", False),
    ([64, 4096, 129, 2000], None, 4, 1, 64, "bf16", True),
    ([5, 700, 33], [900, 700, 2], 6, 3, 128, "bf16", True),  # more (and fewer) keys than rows
    ([256, 17], [0, 400], 4, 4, 64, "fp16", True),  # a sequence with no key
    ([1] * 40, None, 2, 1, 128, "bf16", False),
]


@pytest.mark.parametrize(
    "case",
    CASES,
    ids=lambda c: f"n{len(c[0])}h{c[2]}/{c[3]}d{c[4]}{c[5]}{'c' if c[6] else ''}",
)
def test_varlen_matches_the_oracle(case: tuple[Any, ...]) -> None:
    lens_q, lens_k, h, h_kv, d, dtype, causal = case
    lens_k = lens_k or lens_q
    c = make_batch(lens_q, lens_k, h, h_kv, d, dtype, seed=sum(lens_q) + d)
    o, lse = flash_attn_varlen_func(
        c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], max(lens_q), max(lens_k), causal=causal,
        return_lse=True,
    )  # fmt: skip
    assert o.shape == c["q"].shape and lse.shape == (h, c["q"].shape[0])
    assert_matches_oracle(o, lse, c, causal, dtype)


@pytest.mark.parametrize(
    "features",
    [
        {"window_size": (100, 0)},
        {"window_size": (64, 200)},
        {"softcap": 20.0},
        {"alibi": True},
        {"window_size": (50, 3), "softcap": 10.0},
    ],
    ids=["window-causal", "window", "softcap", "alibi", "window+softcap"],
)
def test_features(features: dict[str, Any]) -> None:
    lens = [700, 90, 0, 1300]
    c = make_batch(lens, lens, 8, 2, 128, "bf16", seed=3)
    if features.pop("alibi", False):
        features["alibi_slopes"] = torch.rand(8, device="cuda", dtype=torch.float32)
    causal = features.get("window_size", (0, 0))[1] == 0
    o, lse = flash_attn_varlen_func(
        c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], 1300, 1300, causal=causal,
        return_lse=True, **features,
    )  # fmt: skip
    oracle = {}
    if "window_size" in features:
        oracle["window"] = features["window_size"]
    if "softcap" in features:
        oracle["softcap"] = features["softcap"]
    if "alibi_slopes" in features:
        oracle["alibi_slopes"] = features["alibi_slopes"]
    assert_matches_oracle(o, lse, c, causal, "bf16", **oracle)


def test_scale_and_strided_views() -> None:
    # q, k, v as views of one packed (total, 3, H, d) projection: strided rows
    lens = [100, 513]
    qkv = torch.randn(sum(lens), 3, 4, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(1)
    c = {"q": q, "k": k, "v": v, "cu_q": _cu(lens), "cu_k": _cu(lens), "lens_q": lens,
         "lens_k": lens}  # fmt: skip
    o, lse = flash_attn_varlen_func(
        q, k, v, c["cu_q"], c["cu_k"], 513, 513, softmax_scale=0.3, causal=True, return_lse=True
    )
    assert_matches_oracle(o, lse, c, True, "bf16", scale=0.3)


def test_key_ranges_outside_k_give_nan_rows() -> None:
    lens = [200, 300]
    c = make_batch(lens, lens, 4, 4, 128, "bf16", seed=9)
    bad_k = torch.tensor([0, 200, 10_000], dtype=torch.int32, device="cuda")  # past k's end
    o, lse = flash_attn_varlen_func(
        c["q"], c["k"], c["v"], c["cu_q"], bad_k, 300, 300, causal=True, return_lse=True
    )
    torch.cuda.synchronize()
    assert torch.isnan(o[200:]).all() and torch.isnan(lse[:, 200:]).all()
    assert not torch.isnan(o[:200]).any()


def test_rows_after_the_last_sequence_get_zeros() -> None:
    lens = [200, 300]
    c = make_batch(lens, lens, 4, 2, 128, "bf16", seed=11, slack=77)  # 77 padding rows
    o, lse = flash_attn_varlen_func(
        c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], 300, 300, causal=True, return_lse=True
    )
    assert_matches_oracle(o, lse, c, True, "bf16")
    assert (o[500:] == 0).all() and (lse[:, 500:] == float("-inf")).all()


def test_more_sequences_than_the_sort_takes_are_walked_as_given() -> None:
    """Past VARLEN_SORT_MAX sequences the kernel walks them in the order given (no ranking):
    300 short ones, some empty, every one against the oracle."""
    from flashgen.generator.families.wgmma import VARLEN_SORT_MAX

    rng = np.random.default_rng(7)
    lens = [int(x) for x in rng.integers(0, 41, size=VARLEN_SORT_MAX + 44)]
    c = make_batch(lens, lens, 2, 1, 64, "bf16", seed=7, slack=9)
    o, lse = flash_attn_varlen_func(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], 40, 40,
                                    causal=True, return_lse=True)  # fmt: skip
    assert_matches_oracle(o, lse, c, True, "bf16")
    n = sum(lens)  # the slack rows after the last sequence: zeros, LSE -inf
    assert (o[n:] == 0).all() and (lse[:, n:] == float("-inf")).all()


def test_launches_on_two_streams_at_once_match_one_stream() -> None:
    """The dynamic tile scheduler counts in two words per stream (flashgen.varlen._work_counter):
    launches running at once on two streams (as 3 SMs, FLASHGEN_SM_LIMIT=3, their persistent
    blocks surely share the GPU) each do every item of their own batch -- bit for bit what one
    stream gives -- and every stream's words are back at zero afterwards."""
    from flashgen import varlen as fv

    a = make_batch([700, 1, 64, 300, 0, 129], [700, 1, 64, 300, 0, 129], 4, 2, 128, "bf16", 11)
    b = make_batch([2000, 5, 77], [1500, 5, 900], 4, 2, 128, "bf16", 12)

    def run(c: dict[str, Any]) -> Any:
        return flash_attn_varlen_func(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"],
                                      max(c["lens_q"]), max(c["lens_k"]), causal=True)  # fmt: skip

    want_a, want_b = run(a), run(b)
    torch.cuda.synchronize()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    got = []
    for _ in range(6):
        with torch.cuda.stream(s1):
            oa = run(a)
        with torch.cuda.stream(s2):
            ob = run(b)
        got.append((oa, ob))
    torch.cuda.synchronize()
    for oa, ob in got:
        assert torch.equal(oa, want_a) and torch.equal(ob, want_b)
    assert len(fv._counters) >= 3 and all(int(w.abs().sum()) == 0 for w in fv._counters.values())


def test_a_batch_with_no_item_ends_and_leaves_the_counter_zero() -> None:
    """Every sequence's query rows out of range (cu_seqlens_q past q, the rows after them
    too): no block gets an item, each ends at once, and the last puts the counter back."""
    from flashgen import varlen as fv

    q = torch.randn(300, 2, 64, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 301, 302], dtype=torch.int32, device="cuda")
    flash_attn_varlen_func(q, q, q, cu, cu, 300, 300, causal=True)
    torch.cuda.synchronize()
    assert all(int(w.abs().sum()) == 0 for w in fv._counters.values())


def test_graph_replay_with_new_lengths() -> None:
    total = 3000
    h, d = 8, 128
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = torch.randn_like(q), torch.randn_like(q)
    cu = torch.zeros(5, dtype=torch.int32, device="cuda")
    sets = [[1000, 1000, 500, 500], [1, 2999, 0, 0], [750, 750, 750, 750]]
    cu.copy_(_cu(sets[0]))
    flash_attn_varlen_func(q, k, v, cu, cu, 3000, 3000, causal=True)  # compile and load
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = flash_attn_varlen_func(q, k, v, cu, cu, 3000, 3000, causal=True, return_lse=True)
    for lens in sets:
        cu.copy_(_cu(lens))
        graph.replay()
        c = {"q": q, "k": k, "v": v, "cu_q": cu, "cu_k": cu, "lens_q": lens, "lens_k": lens}
        assert_matches_oracle(o, lse, c, True, "bf16")


def test_no_host_synchronization() -> None:
    lens = [500, 12, 900]
    c = make_batch(lens, lens, 4, 2, 128, "fp16", seed=1)
    args = (c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], 900, 900)
    flash_attn_varlen_func(*args, causal=True)  # first call: compile, load, bind
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o = flash_attn_varlen_func(*args, causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_matches_oracle(o, flash_attn_varlen_func(*args, causal=True, return_lse=True)[1], c,
                          True, "fp16")  # fmt: skip


def test_torch_compile_fullgraph() -> None:
    lens = [64, 1000, 3]
    c = make_batch(lens, lens, 4, 4, 64, "bf16", seed=2)

    def f(q: Any, k: Any, v: Any, cu: Any) -> Any:
        return flash_attn_varlen_func(q * 1.0, k, v, cu, cu, 1000, 1000, causal=True,
                                      return_lse=True)  # fmt: skip

    o, lse = torch.compile(f, fullgraph=True)(c["q"], c["k"], c["v"], c["cu_q"])
    assert_matches_oracle(o, lse, c, True, "bf16")


# ---- gradients: the varlen backward ----------------------------------------------------------


def _grads(
    c: dict[str, Any], causal: bool, seed: int, **features: Any
) -> tuple[Any, Any, Any, Any, Any]:  # fmt: skip
    """(dq, dk, dv, o, do) of one varlen forward on c's packed tensors, through autograd."""
    q, k, v = (c[n].detach().clone().requires_grad_() for n in ("q", "k", "v"))
    o = flash_attn_varlen_func(
        q, k, v, c["cu_q"], c["cu_k"], max(c["lens_q"]), max(c["lens_k"]), causal=causal,
        **features,
    )  # fmt: skip
    g = torch.Generator(device="cuda").manual_seed(seed)
    do = torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=g)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    return dq, dk, dv, o, do


def assert_grads_match_oracle(
    grads: tuple[Any, ...], c: dict[str, Any], causal: bool, dtype: str,
    scale: float | None = None, **features: Any,
) -> None:  # fmt: skip
    """Each sequence's dq, dk, dv against the float64 gradients of its own attention."""
    torch.cuda.synchronize()
    dq, dk, dv, _o, do = grads
    d = c["q"].shape[-1]
    feats = {
        key: (val.cpu().numpy() if hasattr(val, "cpu") else val) for key, val in features.items()
    }
    cq, ck = c["cu_q"].tolist(), c["cu_k"].tolist()
    for s, (nq, nk) in enumerate(zip(c["lens_q"], c["lens_k"], strict=True)):
        rows, keys = slice(cq[s], cq[s] + nq), slice(ck[s], ck[s] + nk)
        if nq == 0 or nk == 0:  # no query: dK = dV = 0; no key: dQ = 0 (P = 0 everywhere)
            assert not dk[keys].any() and not dv[keys].any(), s
            assert not dq[rows].any(), s
            continue

        def seq(t: Any, sl: slice) -> np.ndarray:
            return _np(t[sl].transpose(0, 1)[None], dtype)

        got = (seq(dq, rows), seq(dk, keys), seq(dv, keys))
        outcomes = check_grads(
            got, seq(c["q"], rows), seq(c["k"], keys), seq(c["v"], keys), seq(do, rows),
            dtype=dtype, scale=scale or d**-0.5, causal=causal, **feats,
        )  # fmt: skip
        bad = [
            f"{g.name}: err {g.err:.3g} > bound {g.bound:.3g} (ref err {g.ref_err:.3g})"
            f"{' NaN' if g.has_nan else ''}"
            for g in outcomes
            if not g.passed
        ]
        assert not bad, f"sequence {s} (Tq={nq}, Tk={nk}): " + "; ".join(bad)


GRAD_CASES = [
    # (lens_q, lens_k (None: = lens_q), h, h_kv, d, dtype, causal)
    ([300, 0, 1, 128, 1000, 77], None, 4, 4, 128, "bf16", True),  # ragged, empty, one row
    ([300, 0, 1, 128, 1000, 77], None, 4, 2, 64, "fp16", False),  # GQA
    ([5, 700, 33], [900, 700, 2], 6, 3, 128, "bf16", True),  # Tq != Tk both ways
    ([5, 700, 33], [900, 700, 2], 6, 3, 64, "fp16", False),
    ([256, 17, 0], [0, 400, 70], 4, 4, 64, "bf16", True),  # no key; keys without a query
    ([64, 129, 2000], None, 4, 1, 128, "fp16", True),  # MQA, many key tiles
    ([1] * 40, None, 2, 1, 128, "bf16", False),  # many tiny sequences
    ([300, 0, 129, 1000], [500, 3, 129, 900], 4, 2, 96, "bf16", True),  # d 96 (run at 128)
    ([77, 640], None, 4, 4, 72, "fp16", False),  # d 72
]


@pytest.mark.parametrize(
    "case",
    GRAD_CASES,
    ids=lambda c: f"n{len(c[0])}h{c[2]}/{c[3]}d{c[4]}{c[5]}{'c' if c[6] else ''}",
)
def test_varlen_gradients_match_the_oracle(case: tuple[Any, ...]) -> None:
    lens_q, lens_k, h, h_kv, d, dtype, causal = case
    lens_k = lens_k or lens_q
    c = make_batch(lens_q, lens_k, h, h_kv, d, dtype, seed=sum(lens_q) + d + 1)
    assert_grads_match_oracle(_grads(c, causal, seed=7), c, causal, dtype)


@pytest.mark.parametrize(
    "features",
    [
        {"window_size": (100, 0)},
        {"window_size": (64, 200)},
        {"softcap": 20.0},
        {"alibi": True},
        {"window_size": (50, 3), "softcap": 10.0},
    ],
    ids=["window-causal", "window", "softcap", "alibi", "window+softcap"],
)
@pytest.mark.parametrize("d, dtype", [(128, "bf16"), (64, "fp16")])
def test_gradients_with_features(features: dict[str, Any], d: int, dtype: str) -> None:
    features = dict(features)
    lens = [700, 90, 0, 1300]
    c = make_batch(lens, lens, 8, 2, d, dtype, seed=13)
    if features.pop("alibi", False):
        features["alibi_slopes"] = torch.rand(8, device="cuda", dtype=torch.float32)
    causal = features.get("window_size", (0, 0))[1] == 0
    grads = _grads(c, causal, seed=3, **features)
    oracle = {}
    if "window_size" in features:
        oracle["window"] = features["window_size"]
    if "softcap" in features:
        oracle["softcap"] = features["softcap"]
    if "alibi_slopes" in features:
        oracle["alibi_slopes"] = features["alibi_slopes"]
    assert_grads_match_oracle(grads, c, causal, dtype, **oracle)


def test_gradients_of_strided_views_with_a_scale() -> None:
    # q, k, v as views of one packed (total, 3, H, d) projection: the backward reads strided rows
    lens = [100, 513]
    qkv = torch.randn(sum(lens), 3, 4, 64, device="cuda", dtype=torch.bfloat16)
    qkv.requires_grad_()
    q, k, v = qkv.unbind(1)
    cu = _cu(lens)
    o = flash_attn_varlen_func(q, k, v, cu, cu, 513, 513, softmax_scale=0.3, causal=True)
    do = torch.randn_like(o)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    c = {"q": q.detach(), "k": k.detach(), "v": v.detach(), "cu_q": cu, "cu_k": cu,
         "lens_q": lens, "lens_k": lens}  # fmt: skip
    assert_grads_match_oracle((dq, dk, dv, o, do), c, True, "bf16", scale=0.3)


def test_rows_no_sequence_covers_get_zero_gradients() -> None:
    lens = [200, 333]
    c = make_batch(lens, lens, 4, 2, 128, "bf16", seed=8, slack=70)  # 70 rows past the last
    grads = _grads(c, True, seed=2)
    torch.cuda.synchronize()
    dq, dk, dv = grads[:3]
    assert not dq[533:].any() and not dk[533:].any() and not dv[533:].any()
    assert_grads_match_oracle(grads, c, True, "bf16")


def test_key_ranges_outside_k_give_nan_dq_rows() -> None:
    lens = [200, 300]
    c = make_batch(lens, lens, 4, 4, 128, "bf16", seed=9)
    bad_k = torch.tensor([0, 200, 10_000], dtype=torch.int32, device="cuda")  # past k's end
    q, k, v = (c[n].clone().requires_grad_() for n in ("q", "k", "v"))
    o = flash_attn_varlen_func(q, k, v, c["cu_q"], bad_k, 300, 300, causal=True)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    torch.cuda.synchronize()
    assert torch.isnan(dq[200:]).all() and not torch.isnan(dq[:200]).any()
    assert not torch.isnan(dk[:200]).any() and not torch.isnan(dv[:200]).any()


def test_the_backward_never_synchronizes() -> None:
    lens = [500, 12, 900]
    c = make_batch(lens, lens, 4, 2, 128, "fp16", seed=1)
    q, k, v = (c[n].clone().requires_grad_() for n in ("q", "k", "v"))
    o = flash_attn_varlen_func(q, k, v, c["cu_q"], c["cu_k"], 900, 900, causal=True)
    do = torch.randn_like(o)
    torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # first call: compile, load
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        grads = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_grads_match_oracle((*grads, o, do), c, True, "fp16")


def test_the_backward_replays_in_a_graph_with_new_lengths() -> None:
    # forward and backward captured once, replayed after the prefix sums change in place: the
    # kernels read every length on the device, so each replay is right for its batch
    total, h, d = 2000, 4, 128
    g = torch.Generator(device="cuda").manual_seed(21)
    q, k, v = (
        torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
        .requires_grad_() for _ in range(3)
    )  # fmt: skip
    do = torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.zeros(5, dtype=torch.int32, device="cuda")
    sets = [[500, 500, 500, 500], [1, 1999, 0, 0], [1200, 3, 97, 700]]
    cu.copy_(_cu(sets[0]))

    def step() -> tuple[Any, ...]:
        o = flash_attn_varlen_func(q, k, v, cu, cu, 2000, 2000, causal=True)
        return (*torch.autograd.grad(o, (q, k, v), do), o)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: compile, load, bind
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dq, dk, dv, o = step()
    for lens in sets:
        cu.copy_(_cu(lens))
        graph.replay()
        c = {"q": q.detach(), "k": k.detach(), "v": v.detach(), "cu_q": cu, "cu_k": cu,
             "lens_q": lens, "lens_k": lens}  # fmt: skip
        assert_grads_match_oracle((dq, dk, dv, o, do), c, True, "bf16")


def test_the_backward_op_directly() -> None:
    lens = [130, 7, 64]
    c = make_batch(lens, lens, 4, 4, 64, "bf16", seed=11)
    o, lse = flash_attn_varlen_func(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], 130, 130,
                                    causal=False, return_lse=True)  # fmt: skip
    do = torch.randn_like(o)
    dq, dk, dv = torch.ops.flashgen.varlen_attention_backward(
        c["q"], c["k"], c["v"], o, lse, do, c["cu_q"], c["cu_k"], False
    )
    assert_grads_match_oracle((dq, dk, dv, o, do), c, False, "bf16")


def test_bad_inputs_name_the_value() -> None:
    c = make_batch([10, 20], [10, 20], 2, 2, 64, "bf16", seed=6)
    with pytest.raises(ValueError, match="cu_seqlens_k.dtype"):
        flash_attn_varlen_func(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"].long(), 20, 20)
    with pytest.raises(ValueError, match="max_seqlen_q=99"):
        flash_attn_varlen_func(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], 99, 20)
    with pytest.raises(ValueError, match="cu_seqlens_k.shape"):
        flash_attn_varlen_func(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"][:2], 20, 20)
