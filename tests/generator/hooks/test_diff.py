"""d(score_mod) / d(score): checked against float64 finite differences, and its conventions at
the points where no derivative exists."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flashgen.generator import hooks as hk
from flashgen.generator.hooks.library import alibi_hook, softcap_hook

from ._exprs import RANDOM_AUX, random_hook

H, TQ, TK = 3, 5, 16


def aux_values(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "table": rng.standard_normal((4, TK)).astype(np.float32),
        "ids": rng.integers(-3, 4, TK).astype(np.int32),
        "gain": np.float32(rng.uniform(0.5, 2.0)),
        "softcap": np.float32(rng.uniform(0.5, 50.0)),
        "alibi_slopes": rng.uniform(0.0, 1.0, 4).astype(np.float32),
    }


def check_against_finite_differences(hook: hk.Hook, seed: int) -> int:
    """Checks hook.grad at random scores; returns how many points were smooth enough to check.
    A point is skipped when its one-sided differences disagree (a kink: abs, min, a where
    whose condition reads the score), where no derivative exists to compare."""
    rng = np.random.default_rng(seed)
    aux = aux_values(rng)
    s = rng.standard_normal((H, TQ, TK)) * 3.0
    step = 1e-6 * np.maximum(1.0, np.abs(s))

    def f(x: np.ndarray) -> np.ndarray:
        return hk.evaluate_hook(hook, heads=range(H), tq=TQ, tk=TK, score=x, aux=aux)

    up, mid, down = f(s + step), f(s), f(s - step)
    fwd, bwd = (up - mid) / step, (mid - down) / step
    central = (up - down) / (2 * step)
    scale = 1.0 + np.abs(central)
    smooth = np.abs(fwd - bwd) <= 1e-3 * scale
    grad = hk.evaluate_hook(hook, heads=range(H), tq=TQ, tk=TK, score=s, aux=aux, grad=True)
    bad = smooth & ~(np.abs(grad - central) <= 1e-5 * scale)
    assert not bad.any(), (hook, s[bad][:5], grad[bad][:5], central[bad][:5])
    return int(smooth.sum())


@pytest.mark.parametrize("make", [softcap_hook, alibi_hook])
def test_library_derivatives(make: Any) -> None:
    assert check_against_finite_differences(make(), seed=1) == H * TQ * TK


@pytest.mark.parametrize("seed", range(12))
def test_random_expression_derivatives(seed: int) -> None:
    hook = random_hook(seed)
    assert hook.aux == RANDOM_AUX
    # nearly every point is smooth: a test that checked nothing would pass vacuously
    assert check_against_finite_differences(hook, seed) >= 0.9 * H * TQ * TK


def test_the_finite_difference_check_catches_a_wrong_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashgen.generator.hooks import diff

    rule = diff._rule

    def wrong(n: Any, da: Any, wrt: str) -> Any:  # tanh' as 1 + t * t
        if n.op == "tanh" and da[0] is not None:
            return hk.Expr.__mul__(1.0 + n * n, da[0])
        return rule(n, da, wrt)

    monkeypatch.setattr(diff, "_rule", wrong)
    with pytest.raises(AssertionError):
        check_against_finite_differences(softcap_hook(), seed=1)


def grad_at(fn: Any, points: list[float]) -> np.ndarray:
    hook = hk.trace_score_mod(fn)
    s = np.asarray(points, np.float64).reshape(1, 1, -1)
    return hk.evaluate_hook(hook, heads=[0], tq=1, tk=len(points), score=s, grad=True).reshape(-1)


def test_conventions_at_kinks_match_torch() -> None:
    # abs: sign(0) = 0; minimum/maximum: a tie splits the gradient evenly
    assert list(grad_at(lambda s, b, h, q, kv: abs(s), [-2.0, 0.0, 3.0])) == [-1.0, 0.0, 1.0]
    assert list(grad_at(lambda s, b, h, q, kv: hk.maximum(s, 1.0), [0.0, 1.0, 2.0])) == [
        0.0,
        0.5,
        1.0,
    ]
    assert list(grad_at(lambda s, b, h, q, kv: hk.minimum(2.0 * s, s), [-1.0, 0.0, 1.0])) == [
        2.0,
        1.5,
        1.0,
    ]
    # where: the taken branch's derivative, the condition piecewise constant
    assert list(grad_at(lambda s, b, h, q, kv: hk.where(s > 0, s * 3.0, -s), [-1.0, 1.0])) == [
        -1.0,
        3.0,
    ]


def test_derivatives_are_simplified() -> None:
    def show(fn: Any) -> str:
        return repr(hk.trace_score_mod(fn).grad)

    assert show(lambda s, b, h, q, kv: s) == "1.0"
    assert show(lambda s, b, h, q, kv: s * 2.0 + hk.to_float(q)) == "2.0"
    assert show(lambda s, b, h, q, kv: 0.0 * hk.exp(q) + 1.0) == "0.0"
    masked = "where((q_idx < kv_idx), 1.0, 0.0)"
    assert show(lambda s, b, h, q, kv: hk.where(q < kv, s, -1e30)) == masked
    assert show(lambda s, b, h, q, kv: hk.where(True, s * s, s)) == "(s + s)".replace("s", "score")
    assert show(lambda s, b, h, q, kv: -hk.where(q < kv, -s, -s)) == "1.0"  # where(c, x, x), -(-1)
    assert show(lambda s, b, h, q, kv: hk.exp(s)) == "exp(score)"  # reuses the forward node
    with pytest.raises(ValueError, match="a mask has no derivative"):
        _ = hk.trace_mask_mod(lambda b, h, q, kv: q >= kv).grad
