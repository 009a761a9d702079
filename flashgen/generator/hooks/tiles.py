"""A mask_mod over a whole tile at once: does it keep ALL, NONE or SOME of the tile's keys?

A kernel walks key tiles of BC keys for a block of query rows. Given the box of rows
[q_lo, q_hi] x keys [kv_lo, kv_hi] (and b, h, q_len, kv_len and the aux scalars, which are one
value per tile), `classify` answers soundly: `ALL` only if the mask keeps every element of the
box, `NONE` only if it drops every one, `SOME` otherwise (including whenever it cannot tell).
A kernel may then skip a NONE tile (no loads, no GEMMs) and take an ALL tile without the
element-wise mask, exactly as the built-in causal and window masks do with their tile span.

The method is interval arithmetic over the expression (cuda.py emits the same rules as C++,
`emit_tile_class`):

- an int node's value over the box lies in a range [lo, hi]: inputs and scalars are points,
  q_idx and kv_idx their box sides; + - * min max abs neg are exact per operation; `//` and
  `%` by a constant (a one-point range) are bounded, by anything else unknown;
- a bool node is a truth set: may it be false, may it be true (both: unknown); comparisons of
  ranges, and / or / not / where / == of bools in three-valued logic;
- an int32 aux element at an index that is one value over the whole box (`win[h]`) is read;
  a rank-1 int32 table read at a range of indices [lo, hi] (`doc_ids[q_idx]`) is bounded by its
  range summary (hooks/summary.py: the min and max over the chunks of [lo, hi] clipped to
  [0, n - 1]) when one is passed for it. The clip is sound because the hook contract
  (hooks/aux.py) says every index the hook evaluates is inside its table: the indices it
  really reads over the box lie in [lo, hi] and in [0, n - 1]. The summary assumes nothing of
  the table's values (no order);
- what it cannot bound is unknown (any int, or either truth): floats (float math, comparisons
  of floats), other aux tensor elements (a 2-D table at a range, a table with no summary).

Sound: each rule's result contains every value the node takes in the box (operands are
treated as independent, which only widens). Monotone: every rule maps narrower operands to a
narrower (or equal) result, so a box inside another never gets a vaguer verdict; in
particular a verdict of NONE (ALL) on several tiles at once holds for each of them, which lets
a kernel cross a run of dropped tiles with a few verdicts on growing runs. Int bounds are
clamped into int32: a hook's ints must stay there (docs/hooks.md). Exact for
expressions in which every input occurs once per comparison and each side of an and/or is
monotone in the same corner, which covers the library's causal, window and prefix-LM masks:
they classify every tile as the built-in causal / window tile spans do.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashgen.generator.hooks.aux import Aux, aux_used
from flashgen.generator.hooks.expr import INT32_MAX, INT32_MIN, DType, Expr, postorder
from flashgen.generator.hooks.hook import Hook
from flashgen.generator.hooks.summary import RangeSummary, lookup

# A truth set, as two bits: may the bool be false (1), may it be true (2).
FALSE = 1
TRUE = 2
EITHER = FALSE | TRUE

Range = tuple[int, int]
"""An int node's values over the box lie in [lo, hi] (lo <= hi)."""
FULL: Range = (INT32_MIN, INT32_MAX)
"""The range of an int that cannot be bounded: any int32."""


class TileClass(enum.IntEnum):
    """A mask_mod's verdict on a tile: the truth set of its value over the tile's elements."""

    NONE = FALSE  # every key dropped: the tile may be skipped
    ALL = TRUE  # every key kept: no element-wise mask needed
    SOME = EITHER  # some of each, or not known


@dataclass(frozen=True)
class Box:
    """The elements of one tile: rows q_lo..q_hi and keys kv_lo..kv_hi (inclusive, inside the
    problem), of batch b, query head h, in a problem of q_len x kv_len."""

    q_lo: int
    q_hi: int
    kv_lo: int
    kv_hi: int
    b: int
    h: int
    q_len: int
    kv_len: int


Bound = Range | int | None
"""What the analysis knows of a node: a Range (int), a truth set (bool), None (a float)."""


def tracked(expr: Expr) -> list[Expr]:
    """The nodes the analysis bounds, each after its operands: the int and bool nodes that
    `expr` reaches without passing through a float (a comparison of floats is unknown, so what
    is under it is never needed), and the indices of int32 aux loads."""
    keep: set[int] = set()
    stack = [expr]
    while stack:
        n = stack.pop()
        if id(n) in keep or n.dtype is DType.FLOAT:
            continue
        keep.add(id(n))
        if n.op in ("lt", "le", "gt", "ge", "eq", "ne") and n.args[0].dtype is DType.FLOAT:
            continue
        stack.extend(n.args)
    return [n for n in postorder(expr) if id(n) in keep]


def summarized_aux(hook: Hook | Expr) -> tuple[Aux, ...]:
    """The aux tables a range summary helps bound, in first-use order: the rank-1 int32 auxes
    the analysis reads (`tracked`) at an index that depends on q_idx or kv_idx, so that it is
    not one value over a tile. Decided by the expression alone, so a hook's identity fixes
    which summaries its kernels take."""
    expr = hook.expr if isinstance(hook, Hook) else hook
    varies: set[int] = set()
    for n in postorder(expr):
        if (n.op == "input" and n.value in ("q_idx", "kv_idx")) or any(
            id(a) in varies for a in n.args
        ):
            varies.add(id(n))
    out: list[Aux] = []
    for n in tracked(expr):
        a = n.value if n.op == "load" else None
        if a is None or a.ndim != 1 or a.dtype != "int32" or a in out:
            continue
        if id(n.args[0]) in varies:
            out.append(a)
    return tuple(out)


def classify(
    hook: Hook | Expr,
    box: Box,
    aux: Mapping[str, Any] | None = None,
    summaries: Mapping[str, RangeSummary] | None = None,
) -> TileClass:
    """Whether the mask keeps ALL, NONE or SOME of the box's elements (sound; see the module
    doc). `aux`: the hook's int scalars by name, and any int32 table it reads at one index.
    `summaries`: range summaries (hooks/summary.py `summarize`) of rank-1 int32 tables by name,
    which bound reads of them at a range of indices; without one such a read is unknown."""
    expr = hook.expr if isinstance(hook, Hook) else hook
    if expr.dtype is not DType.BOOL:
        raise ValueError(f"classify takes a mask (a bool expression), not {expr.dtype.article}")
    if box.q_lo > box.q_hi or box.kv_lo > box.kv_hi:
        raise ValueError(f"{box}: an empty box has no verdict; pass lo <= hi on both sides")
    if summaries:
        tables = {a.name for a in aux_used(expr) if a.ndim == 1 and a.dtype == "int32"}
        if not set(summaries) <= tables:
            raise ValueError(
                f"summaries of {sorted(set(summaries) - tables)}: the mask reads no rank-1 int32 "
                f"table of that name (it reads {sorted(tables) or 'none'}); pass summaries only "
                "of the tables it reads"
            )
    known: dict[int, Bound] = {}
    for n in tracked(expr):
        known[id(n)] = bound(n, [known.get(id(a)) for a in n.args], box, aux or {}, summaries)
    truth = known[id(expr)]
    assert isinstance(truth, int)
    return TileClass(truth)


def box_inputs(box: Box) -> dict[str, Any]:
    """A hook's inputs over every element of `box`: rows as a column, keys as a row (they
    broadcast to the box), the rest one value each (numpy_eval's input form)."""
    return {
        "b": box.b,
        "h": box.h,
        "q_idx": np.arange(box.q_lo, box.q_hi + 1).reshape(-1, 1),
        "kv_idx": np.arange(box.kv_lo, box.kv_hi + 1).reshape(1, -1),
        "q_len": box.q_len,
        "kv_len": box.kv_len,
    }


def brute_force(hook: Hook | Expr, box: Box, aux: Mapping[str, Any] | None = None) -> TileClass:
    """The exact verdict, from the float64 oracle's value of every element (numpy_eval)."""
    from flashgen.generator.hooks.numpy_eval import evaluate

    expr = hook.expr if isinstance(hook, Hook) else hook
    keep = np.broadcast_to(
        evaluate(expr, box_inputs(box), aux), (box.q_hi - box.q_lo + 1, box.kv_hi - box.kv_lo + 1)
    )
    return TileClass((FALSE if not keep.all() else 0) | (TRUE if keep.any() else 0))


# ---- the rules, one per operation ---------------------------------------------------------------


def bound(
    n: Expr,
    args: list[Bound],
    box: Box,
    aux: Mapping[str, Any],
    summaries: Mapping[str, RangeSummary] | None = None,
) -> Bound:
    """What node `n` may be over `box`, given what its operands may be (None for a float)."""
    if n.dtype is DType.BOOL:
        return _truth(n, args)
    return clip(_range(n, args, box, aux, summaries or {}))


def clip(r: Range) -> Range:
    """`r` within int32 (a hook's ints stay there): each bound clamped into it, which keeps
    every rule monotone (a smaller box never gets a wider range; see `classify`)."""
    return (min(max(r[0], INT32_MIN), INT32_MAX), min(max(r[1], INT32_MIN), INT32_MAX))


def _range(
    n: Expr, args: list[Any], box: Box, aux: Mapping[str, Any], summaries: Mapping[str, Any]
) -> Range:
    op = n.op
    if op == "const":
        return (n.value, n.value)
    if op == "input":
        if n.value == "q_idx":
            return (box.q_lo, box.q_hi)
        if n.value == "kv_idx":
            return (box.kv_lo, box.kv_hi)
        v = getattr(box, n.value)
        return (v, v)
    if op == "scalar":
        v = int(_aux_scalar(n.value, aux))
        return (v, v)
    if op == "load":
        return _load(n.value, args, aux, summaries)
    if op in _ARITH:
        return _ARITH[op](*args)
    if op == "where":
        return _where_range(args[0], args[1], args[2])
    raise AssertionError(f"no range rule for int {op}")


def _aux_scalar(a: Aux, aux: Mapping[str, Any]) -> Any:
    if a.name not in aux:
        raise ValueError(f"aux {a.name}: the mask reads it; pass aux[{a.name!r}]")
    return aux[a.name]


def _load(
    a: Aux, index: list[Range], aux: Mapping[str, Any], summaries: Mapping[str, Any]
) -> Range:
    """An int32 table at one index over the whole box reads one value; a rank-1 one at a range
    of indices is bounded by its summary, if given (FULL when the clipped range is empty: no
    index is in the table, which the hook contract rules out); anything else is FULL."""
    if any(lo != hi for lo, hi in index):
        s = summaries.get(a.name)
        if s is None:
            return FULL
        return lookup(s, index[0][0], index[0][1]) or FULL
    v = int(np.asarray(_aux_scalar(a, aux))[tuple(lo for lo, _ in index)])
    return (v, v)


def _add(a: Range, b: Range) -> Range:
    return (a[0] + b[0], a[1] + b[1])


def _sub(a: Range, b: Range) -> Range:
    return (a[0] - b[1], a[1] - b[0])


def _mul(a: Range, b: Range) -> Range:
    p = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return (min(p), max(p))


def _neg(a: Range) -> Range:
    return (-a[1], -a[0])


def _abs(a: Range) -> Range:
    if a[0] >= 0:
        return a
    if a[1] <= 0:
        return _neg(a)
    return (0, max(-a[0], a[1]))


def _min(a: Range, b: Range) -> Range:
    return (min(a[0], b[0]), min(a[1], b[1]))


def _max(a: Range, b: Range) -> Range:
    return (max(a[0], b[0]), max(a[1], b[1]))


def _floordiv(a: Range, d: Range) -> Range:
    """x // c for a constant c != 0 is monotone in x (decreasing for c < 0)."""
    if d[0] != d[1] or d[0] == 0:
        return FULL
    lo, hi = a[0] // d[0], a[1] // d[0]
    return (min(lo, hi), max(lo, hi))


def _mod(a: Range, d: Range) -> Range:
    """x % c for a constant c != 0: within one period of c it rises with x; else any residue
    (Python's sign: [0, c - 1] for c > 0, [c + 1, 0] for c < 0)."""
    c = d[0]
    if d[0] != d[1] or c == 0:
        return FULL
    if a[0] // c == a[1] // c:
        return (a[0] % c, a[1] % c)
    return (0, c - 1) if c > 0 else (c + 1, 0)


_ARITH: dict[str, Callable[..., Range]] = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "neg": _neg,
    "abs": _abs,
    "min": _min,
    "max": _max,
    "floordiv": _floordiv,
    "mod": _mod,
}


def _where_range(c: int, a: Range, b: Range) -> Range:
    if c == TRUE:
        return a
    if c == FALSE:
        return b
    return (min(a[0], b[0]), max(a[1], b[1]))


def _truth(n: Expr, args: list[Any]) -> int:
    op = n.op
    if op == "const":
        return TRUE if n.value else FALSE
    if op in _COMPARE:
        if args[0] is None:  # floats: not bounded
            return EITHER
        if isinstance(args[0], int):  # two bools (== and != only)
            same = truth_eq(args[0], args[1])
            return same if op == "eq" else truth_not(same)
        return _COMPARE[op](args[0], args[1])
    if op == "not":
        return truth_not(args[0])
    if op == "and":
        return truth_and(args[0], args[1])
    if op == "or":
        return truth_or(args[0], args[1])
    if op == "where":
        return _where_truth(args[0], args[1], args[2])
    raise AssertionError(f"no truth rule for {op}")  # bool loads and scalars do not exist


def _lt(a: Range, b: Range) -> int:
    return (TRUE if a[0] < b[1] else 0) | (FALSE if a[1] >= b[0] else 0)


def _le(a: Range, b: Range) -> int:
    return (TRUE if a[0] <= b[1] else 0) | (FALSE if a[1] > b[0] else 0)


def _eq(a: Range, b: Range) -> int:
    overlap = a[0] <= b[1] and b[0] <= a[1]
    one_value = a[0] == a[1] == b[0] == b[1]
    return (TRUE if overlap else 0) | (0 if one_value else FALSE)


_COMPARE: dict[str, Callable[[Range, Range], int]] = {
    "lt": _lt,
    "le": _le,
    "gt": lambda a, b: _lt(b, a),
    "ge": lambda a, b: _le(b, a),
    "eq": _eq,
    "ne": lambda a, b: truth_not(_eq(a, b)),
}


def truth_not(t: int) -> int:
    """not: may be true where t may be false, and the other way round."""
    return ((t & FALSE) << 1) | ((t & TRUE) >> 1)


def truth_and(a: int, b: int) -> int:
    """a and b: true only if both may be; false if either may be."""
    return ((a | b) & FALSE) | (a & b & TRUE)


def truth_or(a: int, b: int) -> int:
    """a or b: true if either may be; false only if both may be."""
    return ((a | b) & TRUE) | (a & b & FALSE)


def truth_eq(a: int, b: int) -> int:
    """a == b for bools: true if they may agree, false if they may differ."""
    return (TRUE if a & b else 0) | (FALSE if a & truth_not(b) else 0)


def _where_truth(c: int, a: int, b: int) -> int:
    if c == TRUE:
        return a
    if c == FALSE:
        return b
    return a | b
