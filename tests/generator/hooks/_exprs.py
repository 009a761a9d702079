"""Random float expressions over every input kind, for the derivative and C++ checks."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from flashgen.generator import hooks as hk
from flashgen.generator.hooks import Aux, Expr, Hook
from flashgen.generator.hooks.expr import const

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


# ---- random masks, for the tile verdict (hooks/tiles.py) -----------------------------------------

MASK_AUX = (Aux("ids", "int32", 1), Aux("lim", "int32", 0), Aux("gain", "float32", 0))
IDS_SIZE = 64  # ids has one entry per index 0..63; masks clamp their indices into it


def _int_leaf(rng: random.Random, inputs: list[Expr], ids: Any, lim: Expr) -> Expr:
    pick = rng.randrange(8)
    if pick < 4:
        return rng.choice(inputs)
    if pick == 4:
        return const(rng.randint(-5, 20))
    if pick == 5:
        return lim
    if pick == 6:
        return ids[inputs[1]]  # h: one index over a tile, so a value the verdict reads
    clamped = hk.minimum(hk.maximum(rng.choice(inputs[2:4]) - rng.randint(0, 9), 0), IDS_SIZE - 1)
    return ids[clamped]


def _grow_int(rng: random.Random, depth: int, leaf: Callable[[], Expr]) -> Expr:
    """An int expression whose values stay far inside int32 for inputs below 64."""
    if depth == 0:
        return leaf()
    a = _grow_int(rng, depth - 1, leaf)
    op = rng.randrange(12)
    if op == 0:
        return a + _grow_int(rng, depth - 1, leaf)
    if op == 1:
        return a - _grow_int(rng, depth - 1, leaf)
    if op == 2:
        return a * rng.choice([-3, -1, 2, 5])
    if op == 3:
        return a * _grow_int(rng, depth - 2, leaf) if depth > 1 else -a
    if op == 4:
        return hk.minimum(a, _grow_int(rng, depth - 1, leaf))
    if op == 5:
        return hk.maximum(a, _grow_int(rng, depth - 1, leaf))
    if op == 6:
        return abs(a)
    if op == 7:
        return a // rng.choice([-7, -2, 1, 3, 16])
    if op == 8:
        return a % rng.choice([-5, 2, 4, 64])
    if op == 9:
        return a // (abs(_grow_int(rng, depth - 1, leaf)) + 1)  # not a constant: unknown
    if op == 10:
        return hk.where(_grow_bool(rng, depth - 1, leaf), a, _grow_int(rng, depth - 1, leaf))
    return -a


def _grow_bool(rng: random.Random, depth: int, leaf: Callable[[], Expr]) -> Expr:
    pick = rng.randrange(10) if depth > 0 else 0
    if pick <= 3:
        a, b = _grow_int(rng, max(depth - 1, 0), leaf), _grow_int(rng, max(depth - 1, 0), leaf)
        return rng.choice([a < b, a <= b, a > b, a >= b, a == b, a != b])
    x, y = _grow_bool(rng, depth - 1, leaf), _grow_bool(rng, depth - 1, leaf)
    if pick == 4:
        return x & y
    if pick == 5:
        return x | y
    if pick == 6:
        return ~x
    if pick == 7:
        return hk.where(x, y, _grow_bool(rng, depth - 1, leaf))
    if pick == 8:
        return (x == y) if rng.random() < 0.5 else (x != y)
    return hk.to_float(leaf()) * 0.5 < 3.25  # a float comparison: unknown to the verdict


def random_mask_mod(seed: int, depth: int = 3) -> Callable[..., Expr]:
    """A mask_mod(b, h, q_idx, kv_idx, ids, lim, gain) built from `seed`: int arithmetic,
    comparisons and logic over every input, aux lookups and a float comparison."""

    def mask_mod(b: Expr, h: Expr, q_idx: Expr, kv_idx: Expr, ids: Any, lim: Expr, gain: Expr):
        rng = random.Random(seed)
        inputs = [b, h, q_idx, kv_idx, hk.Q_LEN, hk.KV_LEN]
        expr = _grow_bool(rng, depth, lambda: _int_leaf(rng, inputs, ids, lim))
        return expr & (gain > -1e30) if rng.random() < 0.1 else expr

    mask_mod.__name__ = f"random_mask_{seed}"
    return mask_mod


def random_mask_hook(seed: int, depth: int = 3) -> Hook:
    return hk.trace_mask_mod(random_mask_mod(seed, depth), *MASK_AUX)
