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
