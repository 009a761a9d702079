"""`flashgen.torch.attention(..., sinks=s)` on the GPU: O, LSE and the gradients of q, k, v and
the sinks against the float64 oracle.

The oracle has no sinks, but a sink is a key whose score is s[h] for every row and whose value
is zero: the problem with one key prepended (zero K and V) and a score_mod that gives key 0
the score s[h] is the sink attention (the real keys shift by one place, which keeps their
bottom-right causal visibility). O and LSE are judged by the oracle's rule on that problem;
dQ, dK[1:], dV[1:] by the gradient rule on the same slices; the sinks' gradient against its
float64 value by the same rule, its yardstick the gradient computed from the O rule's
same-precision reference O.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flashgen.generator import hooks as hk
from flashgen.generator.features.hook import HookCall
from flashgen.verify import oracle, oracle_bwd

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
import flashgen.torch as fgt  # noqa: E402

pytestmark = pytest.mark.gpu
NP = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16}
NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def _sink_score(score, b, h, q_idx, kv_idx, sinks):
    return hk.where(kv_idx == 0, sinks[h], score)


SINK = hk.trace_score_mod(_sink_score, hk.Aux("sinks", "float32", 1))


def _np(t: Any) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(NP[t.dtype])


def _prepend_zero_key(x: np.ndarray) -> np.ndarray:
    pad = np.zeros((*x.shape[:2], 1, x.shape[3]), dtype=x.dtype)
    return np.concatenate([pad, x], axis=2)


CASES = [  # (B, H, H_kv, Tq, Tk, d, dtype, causal)
    (2, 4, 4, 256, 256, 64, torch.bfloat16, True),
    (1, 8, 2, 200, 333, 128, torch.bfloat16, False),  # GQA, Tq != Tk, ragged tiles
    (2, 4, 1, 130, 130, 128, torch.float16, True),  # MQA
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"h{c[1]}/{c[2]}t{c[3]}x{c[4]}d{c[5]}"
                         f"{NAMES[c[6]]}{'c' if c[7] else ''}")  # fmt: skip
def test_sinks_forward_and_gradients_match_the_oracle(case: tuple[Any, ...]) -> None:
    b, h, h_kv, tq, tk, d, dtype, causal = case
    g = torch.Generator(device="cuda").manual_seed(tq + d)
    q = torch.randn(b, h, tq, d, device="cuda", dtype=dtype, generator=g).requires_grad_()
    k = torch.randn(b, h_kv, tk, d, device="cuda", dtype=dtype, generator=g).requires_grad_()
    v = torch.randn(b, h_kv, tk, d, device="cuda", dtype=dtype, generator=g).requires_grad_()
    # sinks around the rows' LSE (~log Tk): each takes a real share of the softmax
    sinks = (torch.randn(h, device="cuda", generator=g) + float(np.log(tk))).requires_grad_()
    o, lse = fgt.attention(q, k, v, causal=causal, sinks=sinks, return_lse=True)
    do = torch.randn(o.shape, device="cuda", dtype=dtype, generator=g)
    dq, dk, dv, ds = torch.autograd.grad(o, (q, k, v, sinks), do)
    torch.cuda.synchronize()

    name = NAMES[dtype]
    scale = d**-0.5
    qs, ks, vs, dos = _np(q), _prepend_zero_key(_np(k)), _prepend_zero_key(_np(v)), _np(do)
    hooks = {"score_mod": HookCall(SINK, {"sinks": sinks.detach().cpu().numpy()})}
    res = oracle.check_outputs(_np(o), lse.detach().cpu().numpy(), qs, ks, vs, causal=causal,
                               scale=scale, dtype=name, **hooks)  # fmt: skip
    assert res.passed, res

    # gradients: the rule of oracle_bwd.check_grads on the real keys' slices
    kw = {"scale": scale, "causal": causal, **hooks}
    g64 = oracle_bwd.reference_grads(qs, ks, vs, dos, **kw)
    gref = oracle_bwd.rounded_reference_grads(qs, ks, vs, dos, dtype=name, **kw)
    floor = oracle_bwd.cancel_floor(qs, ks, vs, dos, scale)
    real = (slice(None), slice(None, None), slice(1, None))
    got = {"dq": (dq, np.s_[:]), "dk": (dk, real), "dv": (dv, real)}
    for i, (gname, (mine, sl)) in enumerate(got.items()):
        want, ref = g64[i][sl], gref[i][sl]
        err = float(np.abs(mine.float().cpu().numpy().astype(np.float64) - want).max())
        bound = (oracle_bwd.GRAD_FACTOR * float(np.abs(ref - want).max())
                 + oracle_bwd.grad_eps(want, name) + floor)  # fmt: skip
        assert err <= bound, f"{gname}: err {err:.3g} > bound {bound:.3g}"

    # the sinks' gradient: -sum exp(s_h - LSE) (dO . O), float64 vs the rounded-O reference
    o64, lse64 = oracle.reference(qs, ks, vs, causal=causal, scale=scale, **hooks)
    s64 = sinks.detach().double().cpu().numpy().reshape(1, -1, 1)
    do64 = dos.astype(np.float64)

    def ds_of(o_: np.ndarray) -> np.ndarray:
        return -(np.exp(s64 - lse64) * (do64 * o_).sum(-1)).sum((0, 2))

    want = ds_of(o64)
    # the yardstick of the O rule: FlashAttention's reference in the storage dtype (P rounded
    # before P.V, O rounded), whose O a careful kernel's D would read
    o_ref = oracle.rounded_reference(qs, ks, vs, causal=causal, scale=scale, dtype=name, **hooks)
    ref = ds_of(o_ref)
    err = float(np.abs(ds.detach().double().cpu().numpy() - want).max())
    bound = 2 * float(np.abs(ref - want).max()) + 1e-5 * float(np.abs(want).max())
    assert err <= bound, f"dsinks: err {err:.3g} > bound {bound:.3g}"


def test_sinks_replay_in_a_graph_and_compile() -> None:
    q = torch.randn(1, 4, 128, 64, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    sinks = torch.zeros(4, device="cuda")

    def f(q: Any, k: Any, v: Any, s: Any) -> Any:
        return fgt.attention(q, k, v, causal=True, sinks=s)

    want = f(q, k, v, sinks)
    got = torch.compile(f, fullgraph=True)(q, k, v, sinks)
    torch.testing.assert_close(got, want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        og = f(q, k, v, sinks)
    sinks.fill_(3.0)  # a new sink value, read by the replay
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(og, f(q, k, v, sinks))
    assert not torch.equal(og, want)


def _docs_after_the_sink(b, h, q_idx, kv_idx, doc_ids):
    """The document mask on the problem with the sink prepended: key 0 is the sink (every
    row sees it), key j > 0 is the real key j - 1."""
    real = hk.maximum(kv_idx - 1, 0)
    return hk.logical_or(kv_idx == 0, doc_ids[q_idx] == doc_ids[real])


DOCS_AFTER_SINK = hk.trace_mask_mod(_docs_after_the_sink, hk.Aux("doc_ids", "int32", 1))


def test_sinks_beside_a_document_mask_match_the_oracle() -> None:
    from flashgen.generator.hooks import library

    b, h, t, d = 1, 4, 300, 128
    g = torch.Generator(device="cuda").manual_seed(9)
    q, k, v = (
        torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        for _ in range(3)
    )  # fmt: skip
    ids = torch.sort(torch.randint(0, 4, (t,), generator=g, device="cuda")).values.int()
    sinks = (torch.randn(h, device="cuda", generator=g) + 4.0).requires_grad_()
    o, lse = fgt.attention(q, k, v, causal=True, sinks=sinks, mask_mod=library.document_hook(),
                           aux={"doc_ids": ids}, return_lse=True)  # fmt: skip
    do = torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=g)
    dq, dk, dv, ds = torch.autograd.grad(o, (q, k, v, sinks), do)
    torch.cuda.synchronize()
    hooks = {
        "score_mod": HookCall(SINK, {"sinks": sinks.detach().cpu().numpy()}),
        "mask_mod": HookCall(DOCS_AFTER_SINK, {"doc_ids": ids.cpu().numpy()}),
    }
    qs, ks, vs = _np(q), _prepend_zero_key(_np(k)), _prepend_zero_key(_np(v))
    res = oracle.check_outputs(_np(o), lse.detach().cpu().numpy(), qs, ks, vs, causal=True,
                               scale=d**-0.5, dtype="bf16", **hooks)  # fmt: skip
    assert res.passed, res
    assert torch.isfinite(dq).all() and torch.isfinite(ds).all()


def test_bad_sinks_are_named() -> None:
    q = torch.randn(1, 4, 16, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"sinks.shape=\(3,\)"):
        fgt.attention(q, q, q, sinks=torch.zeros(3, device="cuda"))
    with pytest.raises(ValueError, match="sinks.dtype=torch.float16"):
        fgt.attention(q, q, q, sinks=torch.zeros(4, device="cuda", dtype=torch.float16))
