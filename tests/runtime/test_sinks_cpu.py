"""flashgen.sinks without a GPU: the forward's rescale and the backward's reuse of the plain
attention backward give exactly the sink attention's outputs and gradients (float64, with
reference attention ops standing in for the kernels), and bad sinks are named."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import flashgen.sinks as sk  # noqa: E402


def _scores(q: Any, k: Any, causal: bool, scale: float) -> Any:
    g = q.shape[1] // k.shape[1]
    s = scale * q @ k.repeat_interleave(g, 1).transpose(-1, -2)
    if causal:
        tq, tk = s.shape[-2:]
        keep = torch.arange(tk)[None, :] <= torch.arange(tq)[:, None] + tk - tq
        s = s.masked_fill(~keep, float("-inf"))
    return s


def _forward(q, k, v, causal, scale, variant, *rest):
    """What the attention kernel returns: O and the natural-log LSE (no sink)."""
    s = _scores(q, k, causal, scale)
    g = q.shape[1] // k.shape[1]
    return torch.softmax(s, -1) @ v.repeat_interleave(g, 1), torch.logsumexp(s, -1)


def _backward(q, k, v, o, lse, do, causal, scale, deterministic, *features):
    """What the backward kernels compute from the LSE and O they are handed."""
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    p = torch.exp(_scores(q, k, causal, scale) - lse[..., None])
    dp = do @ vv.transpose(-1, -2)
    ds = p * (dp - (do * o).sum(-1, keepdim=True))
    dq = scale * ds @ kk
    dk = (scale * ds.transpose(-1, -2) @ q).unflatten(1, (k.shape[1], g)).sum(2)
    dv = (p.transpose(-1, -2) @ do).unflatten(1, (k.shape[1], g)).sum(2)
    return dq, dk, dv


def _explicit(q, k, v, sinks, causal, scale):
    """Sink attention written out: the sink as an extra score column with a zero value."""
    s = _scores(q, k, causal, scale)
    col = sinks.view(1, -1, 1, 1).expand(*s.shape[:3], 1)
    full = torch.cat([col, s], -1)
    p = torch.softmax(full, -1)[..., 1:]
    g = q.shape[1] // k.shape[1]
    return p @ v.repeat_interleave(g, 1), torch.logsumexp(full, -1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h_kv", [4, 2])
def test_the_decomposition_gives_the_sink_attention_and_its_gradients(monkeypatch, causal, h_kv):
    monkeypatch.setattr(sk, "_ops", lambda: (_forward, _backward))
    g = torch.Generator().manual_seed(h_kv + causal)
    q = torch.randn(2, 4, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, h_kv, 11, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, h_kv, 11, 8, generator=g, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    do = torch.randn(2, 4, 9, 8, generator=g, dtype=torch.float64)
    o, lse = sk.SinkAttention.apply(q, k, v, sinks, causal, 0.3, None, False)
    got = torch.autograd.grad(o, (q, k, v, sinks), do)
    o64, lse64 = _explicit(q, k, v, sinks, causal, 0.3)
    want = torch.autograd.grad(o64, (q, k, v, sinks), do)
    torch.testing.assert_close(o, o64, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, lse64, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_a_sink_far_below_the_scores_changes_nothing_and_far_above_takes_every_row():
    o0 = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    lse0 = torch.randn(1, 2, 3, dtype=torch.float64)
    o, lse = sk.with_sinks(o0, lse0, torch.tensor([-1e4, 1e4], dtype=torch.float64))
    torch.testing.assert_close(o[:, 0], o0[:, 0])
    torch.testing.assert_close(lse[:, 0], lse0[:, 0])
    assert (o[:, 1] == 0).all() and (lse[:, 1] == 1e4).all()


@pytest.mark.parametrize(
    "sinks, message",
    [
        ("no", "sinks: a str"),
        (torch.zeros(4), "sinks on cpu"),
    ],
)
def test_bad_sinks_are_named(sinks, message):
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match=message):
        sk.check_sinks(sinks, q)


def test_the_hooked_decomposition_passes_hooks_aux_and_features_through(monkeypatch):
    """HookedSinkAttention over stand-in hooked ops (a mask of keys from an aux table): the
    ops get the hooks, aux lists and features in their own order, and the results and
    gradients are the explicit sink attention's under that mask."""
    seen: dict[str, Any] = {}

    def keep_of(aux: list[Any], tk: int) -> Any:
        return aux[0][:tk].bool()  # aux tensor 0: 1 for a key every row may see

    def fwd(q, k, v, causal, scale, hooks, aux, floats, ints, *rest):
        seen["fwd"] = (hooks, floats, ints, rest)
        s = _scores(q, k, causal, scale).masked_fill(~keep_of(aux, k.shape[2]), float("-inf"))
        g = q.shape[1] // k.shape[1]
        return torch.softmax(s, -1) @ v.repeat_interleave(g, 1), torch.logsumexp(s, -1)

    def bwd(q, k, v, o, lse, do, causal, scale, det, hooks, aux, floats, ints, *features):
        seen["bwd"] = (hooks, floats, ints, det, features)
        g = q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        s = _scores(q, k, causal, scale).masked_fill(~keep_of(aux, k.shape[2]), float("-inf"))
        p = torch.exp(s - lse[..., None])
        ds = p * (do @ vv.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
        dq = scale * ds @ kk
        dk = (scale * ds.transpose(-1, -2) @ q).unflatten(1, (k.shape[1], g)).sum(2)
        dv = (p.transpose(-1, -2) @ do).unflatten(1, (k.shape[1], g)).sum(2)
        return dq, dk, dv

    monkeypatch.setattr(sk, "_hooked_ops", lambda: (fwd, bwd))
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([1, 0, 1, 1, 0, 1, 1], dtype=torch.int32)
    do = torch.randn(1, 4, 6, 8, generator=g, dtype=torch.float64)
    o, lse = sk.HookedSinkAttention.apply(
        q, k, v, sinks, True, 0.5, False, "maskmodx", [2.5], [3], 1, keep, -1, -1, 0.0, None
    )
    got = torch.autograd.grad(o, (q, k, v, sinks), do)
    assert seen["fwd"] == ("maskmodx", [2.5], [3], (-1, -1, 0.0, None, False))
    assert seen["bwd"] == ("maskmodx", [2.5], [3], False, (-1, -1, 0.0, None))
    # the explicit sink attention under the same mask (masked keys: -inf scores)
    s = _scores(q, k, True, 0.5).masked_fill(~keep.bool(), float("-inf"))
    full = torch.cat([sinks.view(1, -1, 1, 1).expand(1, 4, 6, 1), s], -1)
    o64 = torch.softmax(full, -1)[..., 1:] @ v.repeat_interleave(2, 1)
    want = torch.autograd.grad(o64, (q, k, v, sinks), do)
    torch.testing.assert_close(o, o64, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(full, -1), rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
