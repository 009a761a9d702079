"""Algebraic clean-up of expressions: constant folding and the identities that symbolic
differentiation leaves behind (x * 1, x + 0, 0 - x, where with a constant condition, ...).

Used on derivatives, not on the forward expressions users write: a forward hook is compiled
as written, so the kernel's fp32 arithmetic is the user's. Folding computes in float64 (Python
floats), so a folded constant may differ from the fp32 result of the unfolded operations in
the last bit; the backward factor this is used for tolerates that.

`x * 0` folds to 0 even though inf * 0 is nan: a derivative term that is structurally zero is
absent, as in autograd, which never multiplies by the gradient of a constant.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from flashgen.generator.hooks.expr import (
    DType,
    Expr,
    HookValueError,
    const,
    node,
    rebuild,
)


def simplify(e: Expr) -> Expr:
    """`e` with constants folded and trivial operations removed (same value wherever both
    are defined; see the module doc for the x * 0 convention)."""
    return rebuild(e, _rule)


def is_const(e: Expr, value: float | None = None) -> bool:
    """Whether `e` is a constant (equal to `value` when one is given; 0 matches -0.0)."""
    if e.op != "const" or e.dtype is DType.BOOL:
        return e.op == "const" and value is None
    return value is None or e.value == value


def _rule(n: Expr, args: tuple[Expr, ...]) -> Expr:
    if not args:
        return n
    if n.op != "load" and all(a.op == "const" for a in args):
        folded = _fold(n, [a.value for a in args])
        if folded is not None:
            return folded
    better = _identity(n.op, args)
    if better is not None:
        return better
    return node(n.op, n.dtype, args, n.value)


def _identity(op: str, args: tuple[Expr, ...]) -> Expr | None:
    """The simpler equivalent of op(args), or None."""
    a = args[0]
    b = args[1] if len(args) > 1 else a
    if op == "add":
        return b if is_const(a, 0) else a if is_const(b, 0) else None
    if op == "sub":
        if is_const(b, 0):
            return a
        return node("neg", b.dtype, (b,)) if is_const(a, 0) else None
    if op == "mul":
        if is_const(a, 0) or is_const(b, 0):
            return const(0.0 if a.dtype is DType.FLOAT else 0)
        if is_const(a, 1) or is_const(b, 1):
            return b if is_const(a, 1) else a
        if is_const(a, -1) or is_const(b, -1):
            x = b if is_const(a, -1) else a
            return node("neg", x.dtype, (x,))
        return None
    if op == "div":
        return a if is_const(b, 1) else None
    if op in ("neg", "not"):
        return a.args[0] if a.op == op else None
    if op == "where":
        c, x, y = args
        if c.op == "const":
            return x if c.value else y
        return x if x is y else None
    if op in ("and", "or"):
        for p, q in ((a, b), (b, a)):
            if p.op == "const":
                # and: true keeps the other, false decides; or: the reverse
                return q if p.value == (op == "and") else p
    return None


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}


def _nan_skipping(pick: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """fminf/fmaxf semantics for `pick` (min or max): a nan operand yields the other
    (numpy_eval uses np.fmin/np.fmax too)."""

    def op(x: Any, y: Any) -> Any:
        if isinstance(x, float) and math.isnan(x):
            return y
        if isinstance(y, float) and math.isnan(y):
            return x
        return pick(x, y)

    return op


_fmin = _nan_skipping(min)
_fmax = _nan_skipping(max)


def _fold(n: Expr, v: list[Any]) -> Expr | None:
    """The constant op(v), or None when it should stay an operation (a zero divisor, a
    domain error, an int result outside int32, a float outside fp32's range)."""
    op = n.op
    try:
        if op in _ARITH:
            out = _ARITH[op](v[0], v[1])
        elif op == "div":
            out = v[0] / v[1] if v[1] != 0 else None
        elif op in ("floordiv", "mod"):
            out = None if v[1] == 0 else (v[0] // v[1] if op == "floordiv" else v[0] % v[1])
        elif op in ("min", "max"):
            out = (_fmin if op == "min" else _fmax)(v[0], v[1])
        elif op == "neg":
            out = -v[0]
        elif op == "abs":
            out = abs(v[0])
        elif op == "exp":
            out = math.exp(v[0])
        elif op == "log":
            out = math.log(v[0]) if v[0] > 0 else None
        elif op == "tanh":
            out = math.tanh(v[0])
        elif op == "to_float":
            out = float(v[0])
        elif op == "and":
            out = bool(v[0] and v[1])
        elif op == "or":
            out = bool(v[0] or v[1])
        elif op == "not":
            out = not v[0]
        elif op == "where":
            out = v[1] if v[0] else v[2]
        else:
            return None
    except (OverflowError, ValueError):
        return None
    if out is None:
        return None
    if n.dtype is DType.FLOAT:
        out = float(out)
    try:
        return const(out)
    except HookValueError:  # outside int32 / fp32: leave it to the kernel's arithmetic
        return None
