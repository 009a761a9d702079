"""Random float expressions over every input kind, for the derivative and C++ checks."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from flashgen.generator import hooks as hk
from flashgen.generator.hooks import Aux, Expr, Hook

# the aux tensors every random hook declares (it may read any of them)
RANDOM_AUX = (Aux("table", "float32", 2), Aux("ids", "int32", 1), Aux("gain", "float32", 0))


def _leaf(rng: random.Random, score: Expr, ints: list[Expr], table: Any, gain: Expr) -> Expr:
    pick = rng.randrange(5)
    if pick == 0:
        return score
    if pick == 1:
        return hk.to_float(rng.choice(ints)) * 0.25
    if pick == 2:
        # h in [0, 4), kv_idx in [0, Tk): the table is sized for both (tests use Tk <= 16)
        return table[ints[0], ints[2]]
    if pick == 3:
        return gain * score
    return hk.where(score > 0.0, 1.5, -0.75) if rng.random() < 0.5 else score


def _grow(rng: random.Random, depth: int, leaf: Callable[[], Expr]) -> Expr:
    """A float expression whose magnitude stays moderate (bounded by construction)."""
    if depth == 0:
        return leaf()
    a = _grow(rng, depth - 1, leaf)
    b = _grow(rng, depth - 1, leaf)
    op = rng.randrange(12)
    if op == 0:
        return a + b
    if op == 1:
        return a - b
    if op == 2:
        return hk.tanh(a) * b
    if op == 3:
        return a / (1.0 + b * b)
    if op == 4:
        return hk.exp(hk.tanh(a)) * b
    if op == 5:
        return hk.log(1.0 + a * a)
    if op == 6:
        return hk.tanh(a)
    if op == 7:
        return abs(a) - 0.5 * b
    if op == 8:
        return hk.minimum(a, b)
    if op == 9:
        return hk.maximum(a, -b)
    if op == 10:
        return hk.where(a < b, a * 0.5, -b)
    return -a


def random_score_mod(seed: int, depth: int = 4) -> Callable[..., Expr]:
    """A score_mod(score, b, h, q_idx, kv_idx, table, ids, gain) built from `seed`."""

    def score_mod(
        score: Expr, b: Expr, h: Expr, q_idx: Expr, kv_idx: Expr, table: Any, ids: Any, gain: Expr
    ) -> Expr:
        rng = random.Random(seed)
        ints = [h, q_idx, kv_idx, ids[kv_idx], (q_idx - kv_idx) // 3, (kv_idx - q_idx) % 5]
        return _grow(rng, depth, lambda: _leaf(rng, score, ints, table, gain))

    score_mod.__name__ = f"random_{seed}"
    return score_mod


def random_hook(seed: int, depth: int = 4) -> Hook:
    return hk.trace_score_mod(random_score_mod(seed, depth), *RANDOM_AUX)
