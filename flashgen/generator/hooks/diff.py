"""d(score_mod) / d(score): the factor the backward multiplies dS by, as another expression.

Forward-mode differentiation over the DAG, one derivative per float node, sharing the forward
nodes it reuses (tanh's derivative 1 - t * t reuses t = tanh(x); exp's reuses exp(x)). Int and
bool nodes, aux lookups, aux scalars and constants do not depend on the score: their
derivative is structurally zero and is never built. The result is simplified (simplify.py).

Choices at the points where a derivative does not exist, matching PyTorch's autograd:
- `abs(x)`: sign(x) * dx, with sign(0) = 0 (torch's abs backward).
- `minimum(a, b)` / `maximum(a, b)`: the derivative of the operand that is selected; on a tie
  (a == b) half of each, (da + db) / 2 (torch.minimum / torch.maximum split the gradient
  evenly). A nan operand: the other operand is selected (fminf/fmaxf), and the derivative is
  then its derivative when `a` is the nan; with `b` nan the tie rule yields db, not da
  (nan scores are not a case the backward is checked on).
- `where(c, a, b)`: where(c, da, db); the condition is piecewise constant.
- `log(x)` at x <= 0 and `x / y` at y = 0 give what the formula gives (inf, nan), as torch.
"""

from __future__ import annotations

from flashgen.generator.hooks.expr import DType, Expr, const, node, postorder
from flashgen.generator.hooks.simplify import simplify

_ZERO = None  # a structurally zero derivative, kept as None so no 0 * x is ever built


def derivative(e: Expr, wrt: str = "score") -> Expr:
    """d e / d (the float input named `wrt`), simplified: a float expression."""
    if e.dtype is not DType.FLOAT:
        raise ValueError(f"{e}: only a float expression has a derivative ({e.dtype.value} here)")
    d: dict[int, Expr | None] = {}
    for n in postorder(e):
        d[id(n)] = _rule(n, [d[id(a)] for a in n.args], wrt)
    out = d[id(e)]
    return simplify(out) if out is not None else const(0.0)


def _f(x: float) -> Expr:
    return const(x)


def _add(a: Expr | None, b: Expr | None) -> Expr | None:
    if a is None or b is None:
        return a if b is None else b
    return node("add", DType.FLOAT, (a, b))


def _sub(a: Expr | None, b: Expr | None) -> Expr | None:
    if b is None:
        return a
    if a is None:
        return node("neg", DType.FLOAT, (b,))
    return node("sub", DType.FLOAT, (a, b))


def _mul(a: Expr, b: Expr | None) -> Expr | None:
    return None if b is None else node("mul", DType.FLOAT, (a, b))


def _or_zero(x: Expr | None) -> Expr:
    return _f(0.0) if x is None else x


def _where(c: Expr, a: Expr | None, b: Expr | None) -> Expr | None:
    if a is None and b is None:
        return None
    return node("where", DType.FLOAT, (c, _or_zero(a), _or_zero(b)))


def _rule(n: Expr, da: list[Expr | None], wrt: str) -> Expr | None:
    """The derivative of node n given its operands' derivatives (None: zero)."""
    if n.dtype is not DType.FLOAT:
        return _ZERO  # ints and bools are piecewise constant in the score
    op, args = n.op, n.args
    if op == "input":
        return _f(1.0) if n.value == wrt else _ZERO
    if op in ("const", "scalar", "load", "to_float"):
        return _ZERO  # a float aux element is read at int indices: constant in the score
    if op == "add":
        return _add(da[0], da[1])
    if op == "sub":
        return _sub(da[0], da[1])
    if op == "neg":
        return _sub(None, da[0])
    if op == "mul":
        return _add(_mul(args[1], da[0]), _mul(args[0], da[1]))
    if op == "div":
        # d(a / b) = (da - (a / b) * db) / b, reusing the quotient n itself
        top = _sub(da[0], _mul(n, da[1]))
        return None if top is None else node("div", DType.FLOAT, (top, args[1]))
    if op == "exp":
        return _mul(n, da[0])
    if op == "log":
        return None if da[0] is None else node("div", DType.FLOAT, (da[0], args[0]))
    if op == "tanh":
        one_minus_t2 = node("sub", DType.FLOAT, (_f(1.0), node("mul", DType.FLOAT, (n, n))))
        return _mul(one_minus_t2, da[0])
    if op == "abs":
        if da[0] is None:
            return None
        x = args[0]
        neg = node("neg", DType.FLOAT, (da[0],))
        inner = node("where", DType.FLOAT, (node("lt", DType.BOOL, (x, _f(0.0))), neg, _f(0.0)))
        return node("where", DType.FLOAT, (node("gt", DType.BOOL, (x, _f(0.0))), da[0], inner))
    if op in ("min", "max"):
        if da[0] is None and da[1] is None:
            return None
        a, b = args
        first = node("lt" if op == "min" else "gt", DType.BOOL, (a, b))
        tie = node("eq", DType.BOOL, (a, b))
        half = node("mul", DType.FLOAT, (_f(0.5), _or_zero(_add(da[0], da[1]))))
        rest = node("where", DType.FLOAT, (tie, half, _or_zero(da[1])))
        return node("where", DType.FLOAT, (first, _or_zero(da[0]), rest))
    if op == "where":
        return _where(args[0], da[1], da[2])
    raise AssertionError(f"no derivative rule for float op {op}")
