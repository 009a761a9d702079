"""The symbolic expressions a score_mod or mask_mod is written in: typed, immutable, hash-consed.

A hook is a Python function over these values. Each operation builds a node; nothing is
computed. Every node has one of three types (`DType`): `float` (fp32 in the kernels, float64 in
the oracle), `int` (int32 in the kernels, int64 in the oracle: results must stay in int32 range;
there is no wraparound to mimic) and `bool`.

Type rules (checked as the expression is built; a violation is a `HookTypeError` that names the
value, the rule and the fix):

- `+ - *`, unary `-`, `abs`, `minimum`, `maximum`: int with int gives int; a float on either side
  makes the result float (the int side is converted, exactly below 2^24 in fp32).
- `/` is true division: always float, as in Python (`q_idx / 2` is a float).
- `//` and `%` take ints only and follow Python's floor semantics for negative operands
  (`-7 // 2 == -4`, `-7 % 2 == 1`); the C++ is emitted to match. A zero divisor is an error in
  the oracle and undefined in the kernel.
- `exp`, `log`, `tanh` give float (an int argument is converted).
- `< <= > >=` compare numbers (promoted as above); `==` and `!=` also compare two bools. Each
  gives a bool.
- `logical_and`, `logical_or`, `logical_not` (and their spellings `&`, `|`, `~` on bools) take
  bools. Python's `and`, `or`, `not`, `if` and chained comparisons cannot be overloaded: they
  call `bool()` on an expression, which raises and names `where` / `logical_and` as the fix.
- `where(c, a, b)`: c a bool; a and b both numbers (promoted) or both bools.
- Bools take no arithmetic (`where(c, 1.0, 0.0)` turns one into a number); floats never index an
  aux tensor and never become ints.
- Python numbers mix in freely: a Python `bool` is a bool constant, an `int` an int constant (it
  must fit int32), a `float` a float constant (finite fp32 range, or +-inf / nan).

Nodes are hash-consed: building the same structure twice returns the same object, so structural
equality is identity (`a is b`). `==` is the symbolic comparison, never structural equality, so
nodes hash by identity and may be dict keys (each key is compared by identity first).
"""

from __future__ import annotations

import enum
import math
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38


class HookError(Exception):
    """Base of the errors a hook's expression raises (a misuse named with its fix)."""


class HookTypeError(HookError, TypeError):
    """An operation the expression set does not take for these operand types."""


class HookValueError(HookError, ValueError):
    """A value the expression set cannot represent (a constant out of range, a bad name)."""


def fail(value: str, rule: str, fix: str, kind: type[HookError] = HookTypeError) -> NoReturn:
    """Raise `kind` with flashgen's one-line message shape: `value: rule; fix`."""
    raise kind(f"{value}: {rule}; {fix}")


class DType(enum.Enum):
    """The three value types of the expression set."""

    FLOAT = "float"
    INT = "int"
    BOOL = "bool"

    @property
    def numeric(self) -> bool:
        return self is not DType.BOOL

    @property
    def article(self) -> str:
        """ "an int", "a float", "a bool": the type in a message."""
        return ("an " if self is DType.INT else "a ") + self.value


# Operations, by the name nodes carry in `Expr.op`. Leaves: const (value: the Python number),
# input (value: the input's name), scalar (value: an aux declaration of ndim 0), load (value: an
# aux declaration; args: its indices).
UNARY = ("neg", "abs", "exp", "log", "tanh", "to_float", "not")
BINARY = ("add", "sub", "mul", "div", "floordiv", "mod", "min", "max")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
LOGICAL = ("and", "or")
LEAVES = ("const", "input", "scalar")
COMMUTATIVE = frozenset({"add", "mul", "min", "max", "eq", "ne", "and", "or"})
"""Operations whose operands may be swapped without changing any result bit (IEEE + and * are
commutative; fminf/fmaxf are except for the sign of a zero result)."""


class Expr:
    """One node of a hook expression. Build nodes with the operators and module functions,
    never directly: the constructor is private to keep every node interned and typed."""

    __slots__ = ("op", "dtype", "args", "value", "__weakref__")

    op: str
    dtype: DType
    args: tuple[Expr, ...]
    value: Any

    def __init__(self, op: str, dtype: DType, args: tuple[Expr, ...], value: Any) -> None:
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "value", value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"hook expressions are immutable (setting {name!r})")

    # identity hashing: interning makes identity structural equality (see the module doc)
    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return to_text(self)

    # ---- arithmetic -----------------------------------------------------------------------
    def __add__(self, other: Operand) -> Expr:
        return _arith("add", self, other)

    def __radd__(self, other: Operand) -> Expr:
        return _arith("add", other, self)

    def __sub__(self, other: Operand) -> Expr:
        return _arith("sub", self, other)

    def __rsub__(self, other: Operand) -> Expr:
        return _arith("sub", other, self)

    def __mul__(self, other: Operand) -> Expr:
        return _arith("mul", self, other)

    def __rmul__(self, other: Operand) -> Expr:
        return _arith("mul", other, self)

    def __truediv__(self, other: Operand) -> Expr:
        return _divide(self, other)

    def __rtruediv__(self, other: Operand) -> Expr:
        return _divide(other, self)

    def __floordiv__(self, other: Operand) -> Expr:
        return _int_only("floordiv", "//", self, other)

    def __rfloordiv__(self, other: Operand) -> Expr:
        return _int_only("floordiv", "//", other, self)

    def __mod__(self, other: Operand) -> Expr:
        return _int_only("mod", "%", self, other)

    def __rmod__(self, other: Operand) -> Expr:
        return _int_only("mod", "%", other, self)

    def __neg__(self) -> Expr:
        return _unary_numeric("neg", "-", self)

    def __pos__(self) -> Expr:
        _require_numeric(self, "unary +")
        return self

    def __abs__(self) -> Expr:
        return abs_(self)

    # ---- comparisons (symbolic: they build bool nodes) -----------------------------------------
    def __lt__(self, other: Operand) -> Expr:
        return _compare("lt", self, other)

    def __le__(self, other: Operand) -> Expr:
        return _compare("le", self, other)

    def __gt__(self, other: Operand) -> Expr:
        return _compare("gt", self, other)

    def __ge__(self, other: Operand) -> Expr:
        return _compare("ge", self, other)

    def __eq__(self, other: object) -> Expr:  # type: ignore[override]
        return _compare("eq", self, other)

    def __ne__(self, other: object) -> Expr:  # type: ignore[override]
        return _compare("ne", self, other)

    # ---- & | ~ on bools: the logical operations (FlexAttention users write masks so) ----
    def __and__(self, other: Operand) -> Expr:
        return _logical("and", "&", self, other)

    def __rand__(self, other: Operand) -> Expr:
        return _logical("and", "&", other, self)

    def __or__(self, other: Operand) -> Expr:
        return _logical("or", "|", self, other)

    def __ror__(self, other: Operand) -> Expr:
        return _logical("or", "|", other, self)

    def __invert__(self) -> Expr:
        if self.dtype is not DType.BOOL:
            fail(
                f"~({self})",
                f"~ is logical not and takes a bool, not {self.dtype.value} (no bitwise ops)",
                "write -x - 1 for an int's bitwise complement, or use a comparison",
            )
        return logical_not(self)

    # ---- what an expression refuses, each with its fix ---------------------------------------
    def __bool__(self) -> bool:
        fail(
            f"bool({self})",
            "a hook expression has no Python truth value while it is traced (Python's if, "
            "and, or, not, chained comparisons a < b < c, and min()/max()/sorted() all ask "
            "for one)",
            "use hk.where(c, a, b) for if/else, hk.logical_and / logical_or / logical_not "
            "(or & | ~ with parentheses) for and/or/not, hk.minimum / hk.maximum for min/max",
        )

    def __iter__(self) -> NoReturn:
        fail(
            f"iter({self})",
            "a hook expression is one value per (b, h, q_idx, kv_idx), not a sequence",
            "declare an aux tensor (hk.Aux) and index it to look values up",
        )

    def __index__(self) -> NoReturn:
        fail(
            f"{self} used as a Python index",
            "Python lists, tuples and arrays cannot be indexed by a traced expression",
            "pass the table as an aux tensor (hk.Aux('table', 'float32', 1)) and index that",
        )

    def __int__(self) -> NoReturn:
        fail(
            f"int({self})",
            "a traced expression has no Python value",
            "keep it symbolic; for float -> int there is no conversion (ints index, floats do not)",
        )

    def __float__(self) -> NoReturn:
        fail(
            f"float({self})",
            "a traced expression has no Python value (math.exp and friends ask for one)",
            "use the hook functions: hk.exp, hk.log, hk.tanh, hk.to_float",
        )

    def __complex__(self) -> NoReturn:
        self.__float__()

    def __round__(self, ndigits: int | None = None) -> NoReturn:
        _unsupported(f"round({self})")

    def __trunc__(self) -> NoReturn:
        _unsupported(f"math.trunc({self})")

    def __floor__(self) -> NoReturn:
        _unsupported(f"math.floor({self})", "for ints use // (floor division)")

    def __ceil__(self) -> NoReturn:
        _unsupported(f"math.ceil({self})", "for ints use -((-a) // b)")

    def __pow__(self, other: Any) -> NoReturn:
        _unsupported(f"({self}) ** {other!r}", "write x * x for a square, hk.exp(y * hk.log(x))")

    def __rpow__(self, other: Any) -> NoReturn:
        _unsupported(f"{other!r} ** ({self})", "write hk.exp(x * math.log(base))")

    def __matmul__(self, other: Any) -> NoReturn:
        _unsupported(f"({self}) @ {other!r}")

    def __lshift__(self, other: Any) -> NoReturn:
        _unsupported(f"({self}) << {other!r}", "multiply by 2 ** n")

    def __rshift__(self, other: Any) -> NoReturn:
        _unsupported(f"({self}) >> {other!r}", "use // 2 ** n")

    def __xor__(self, other: Any) -> NoReturn:
        _unsupported(f"({self}) ^ {other!r}", "for bools use a != b")

    def __getitem__(self, key: Any) -> NoReturn:
        fail(
            f"({self})[{key!r}]",
            "only aux tensors are indexed",
            "declare the table as hk.Aux(name, dtype, ndim) and index the argument it becomes",
        )

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> NoReturn:
        # numpy would otherwise make an object array and call a missing method
        fail(
            f"numpy.{getattr(ufunc, '__name__', ufunc)} on a hook expression",
            "numpy functions compute on arrays, not on traced expressions",
            "use the hook functions (hk.exp, hk.where, hk.minimum, ...)",
        )


Operand = Expr | bool | int | float
"""What the operators take: an expression or a Python number."""

_TABLE: weakref.WeakValueDictionary[tuple[Any, ...], Expr] = weakref.WeakValueDictionary()


def _value_key(op: str, value: Any) -> Any:
    # 1, 1.0 and True are one dict key in Python, and 0.0 == -0.0; constants must stay apart
    if op == "const":
        if isinstance(value, float):
            return ("f", value.hex())
        return (type(value).__name__, value)
    return value


def node(op: str, dtype: DType, args: tuple[Expr, ...] = (), value: Any = None) -> Expr:
    """The interned node (op, dtype, args, value): the low-level constructor, no type checks.
    For modules of this package that build already-typed nodes (simplify, diff, aux)."""
    # args are interned, so their ids name them; a live node holds its args, so no id in a
    # live key can be reused by another object
    key = (op, dtype, tuple(id(a) for a in args), _value_key(op, value))
    found = _TABLE.get(key)
    if found is not None:
        return found
    made = Expr(op, dtype, args, value)
    _TABLE[key] = made
    return made


# ---- constants and inputs ------------------------------------------------------------------


def const(value: bool | int | float) -> Expr:
    """A constant node (a Python bool, int within int32, or float within fp32's range)."""
    if isinstance(value, bool):
        return node("const", DType.BOOL, value=value)
    if isinstance(value, int):
        if not INT32_MIN <= value <= INT32_MAX:
            fail(
                f"constant {value}",
                "int constants must fit int32 (the kernels' index type)",
                "use a smaller value, or a float constant if it is not an index",
                HookValueError,
            )
        return node("const", DType.INT, value=value)
    if isinstance(value, float):
        if math.isfinite(value) and abs(value) > FLOAT32_MAX:
            fail(
                f"constant {value!r}",
                "float constants must fit fp32 (the kernels compute in fp32)",
                f"use a value of magnitude <= {FLOAT32_MAX:.6g}, or math.inf",
                HookValueError,
            )
        return node("const", DType.FLOAT, value=value)
    fail(f"constant {value!r}", "a constant is a bool, int or float", "pass a Python number")


def input_node(name: str, dtype: DType) -> Expr:
    """The hook input `name` (see `INPUTS`)."""
    return node("input", dtype, value=name)


INPUTS: dict[str, DType] = {
    "score": DType.FLOAT,
    "b": DType.INT,
    "h": DType.INT,
    "q_idx": DType.INT,
    "kv_idx": DType.INT,
    "q_len": DType.INT,
    "kv_len": DType.INT,
}
"""The inputs, in the order the generated C++ functions take them: the scaled score (natural-log
units, what the softmax exponentiates), batch, query head, query row, key, and the problem's
query and key counts Tq and Tk (which the bottom-right alignment p = q_idx + Tk - Tq needs)."""

Q_LEN = input_node("q_len", DType.INT)
"""Tq, the number of queries of the problem (an int input every hook may read)."""
KV_LEN = input_node("kv_len", DType.INT)
"""Tk, the number of keys of the problem (an int input every hook may read)."""


# ---- coercion and type checks --------------------------------------------------------------


def lift(x: object) -> Expr:
    """`x` as an expression: itself, or a constant for a Python (or NumPy) number."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, int, float)):
        return const(x)
    misuse = getattr(x, "hook_misuse", None)  # an aux tensor used without its indices
    if callable(misuse):
        misuse()
    np_value = _numpy_scalar(x)
    if np_value is not None:
        return const(np_value)
    fail(
        f"{x!r} (a {type(x).__name__})",
        "hook expressions mix only with Python numbers (bool, int, float)",
        "use a number, another hook expression, or an aux tensor for arrays",
    )


def _numpy_scalar(x: object) -> bool | int | float | None:
    # numpy is a dependency, but this module does not need it for anything else
    import numpy as np

    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return None


def _require_numeric(x: Expr, what: str) -> None:
    if not x.dtype.numeric:
        fail(
            f"{x} (a bool) in {what}",
            f"{what} takes ints and floats, not bools",
            "turn a condition into a number with hk.where(c, 1.0, 0.0)",
        )


def to_float(x: Operand) -> Expr:
    """An int expression as a float (exact below 2^24 in fp32); a float unchanged."""
    e = lift(x)
    _require_numeric(e, "to_float")
    if e.dtype is DType.FLOAT:
        return e
    if e.op == "const":
        return const(float(e.value))  # the same number, written as the fp32 literal
    return node("to_float", DType.FLOAT, (e,))


def _promote(a: Expr, b: Expr) -> tuple[Expr, Expr, DType]:
    if a.dtype is DType.FLOAT or b.dtype is DType.FLOAT:
        return to_float(a), to_float(b), DType.FLOAT
    return a, b, DType.INT


_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "min": "minimum", "max": "maximum"}


def _arith(op: str, x: object, y: object) -> Expr:
    a, b = lift(x), lift(y)
    _require_numeric(a, _SYMBOL[op])
    _require_numeric(b, _SYMBOL[op])
    a, b, dtype = _promote(a, b)
    return node(op, dtype, (a, b))


def _divide(x: object, y: object) -> Expr:
    a, b = lift(x), lift(y)
    _require_numeric(a, "/")
    _require_numeric(b, "/")
    return node("div", DType.FLOAT, (to_float(a), to_float(b)))


def _int_only(op: str, symbol: str, x: object, y: object) -> Expr:
    a, b = lift(x), lift(y)
    for e in (a, b):
        if e.dtype is not DType.INT:
            fail(
                f"({a}) {symbol} ({b})",
                f"{symbol} takes ints (Python floor semantics), and {e} is {e.dtype.article}",
                "divide floats with / ; for ints keep both operands int",
            )
    return node(op, DType.INT, (a, b))


def _unary_numeric(op: str, what: str, x: object) -> Expr:
    e = lift(x)
    _require_numeric(e, what)
    return node(op, e.dtype, (e,))


def _compare(op: str, x: object, y: object) -> Expr:
    a, b = lift(x), lift(y)
    if a.dtype is DType.BOOL and b.dtype is DType.BOOL:
        if op not in ("eq", "ne"):
            fail(
                f"({a}) {_CMP[op]} ({b})",
                "bools compare only with == and !=",
                "combine conditions with hk.logical_and / logical_or",
            )
        return node(op, DType.BOOL, (a, b))
    if a.dtype is DType.BOOL or b.dtype is DType.BOOL:
        fail(
            f"({a}) {_CMP[op]} ({b})",
            "a bool compares only with a bool",
            "compare numbers with numbers, or turn the bool into one with hk.where(c, 1, 0)",
        )
    a, b, _ = _promote(a, b)
    return node(op, DType.BOOL, (a, b))


_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _logical(op: str, symbol: str, x: object, y: object) -> Expr:
    a, b = lift(x), lift(y)
    for e in (a, b):
        if e.dtype is not DType.BOOL:
            fail(
                f"({a}) {symbol} ({b})",
                f"{symbol} is logical {op} and takes bools, and {e} is {e.dtype.article} "
                "(no bitwise ops on ints)",
                "compare first, e.g. (q_idx >= kv_idx) & (kv_idx < n), with the parentheses",
            )
    return node(op, DType.BOOL, (a, b))


def _unsupported(what: str, fix: str = "") -> NoReturn:
    fail(
        what,
        "not in the hook expression set (+ - * / // %, comparisons, where, exp, log, tanh, "
        "abs, minimum, maximum, logical ops, aux lookups)",
        fix or "write it with those operations",
    )


# ---- the public functions ------------------------------------------------------------------


def where(cond: Operand, a: Operand, b: Operand) -> Expr:
    """`a` where `cond` holds, else `b` (both branches are evaluated: see aux index rules)."""
    c, x, y = lift(cond), lift(a), lift(b)
    if c.dtype is not DType.BOOL:
        fail(
            f"where({c}, ...)",
            f"the condition must be a bool, and it is {c.dtype.article}",
            "compare it, e.g. where(x != 0, a, b)",
        )
    if x.dtype is DType.BOOL and y.dtype is DType.BOOL:
        return node("where", DType.BOOL, (c, x, y))
    if x.dtype is DType.BOOL or y.dtype is DType.BOOL:
        fail(
            f"where({c}, {x}, {y})",
            "the branches must be both numbers or both bools",
            "write the bool branch as a number (hk.where(c, 1.0, 0.0)) or compare the number",
        )
    x, y, dtype = _promote(x, y)
    return node("where", dtype, (c, x, y))


def logical_and(a: Operand, b: Operand) -> Expr:
    """`a and b` for bool expressions (also `a & b`)."""
    return _logical("and", "logical_and", a, b)


def logical_or(a: Operand, b: Operand) -> Expr:
    """`a or b` for bool expressions (also `a | b`)."""
    return _logical("or", "logical_or", a, b)


def logical_not(a: Operand) -> Expr:
    """`not a` for a bool expression (also `~a`)."""
    e = lift(a)
    if e.dtype is not DType.BOOL:
        fail(
            f"logical_not({e})",
            f"takes a bool, and {e} is {e.dtype.article}",
            "compare first, e.g. logical_not(x == 0)",
        )
    return node("not", DType.BOOL, (e,))


def _float_unary(op: str, x: Operand) -> Expr:
    e = lift(x)
    _require_numeric(e, op)
    return node(op, DType.FLOAT, (to_float(e),))


def exp(x: Operand) -> Expr:
    """e ** x (float)."""
    return _float_unary("exp", x)


def log(x: Operand) -> Expr:
    """The natural logarithm (float; nan below 0, -inf at 0)."""
    return _float_unary("log", x)


def tanh(x: Operand) -> Expr:
    """The hyperbolic tangent (float)."""
    return _float_unary("tanh", x)


def abs_(x: Operand) -> Expr:
    """|x|, int or float as x (Python's abs() on an expression calls this)."""
    return _unary_numeric("abs", "abs", x)


def minimum(a: Operand, b: Operand) -> Expr:
    """The smaller of a and b (floats: fminf, so a nan operand yields the other one)."""
    return _arith("min", a, b)


def maximum(a: Operand, b: Operand) -> Expr:
    """The larger of a and b (floats: fmaxf, so a nan operand yields the other one)."""
    return _arith("max", a, b)


# ---- walking and printing ------------------------------------------------------------------


def postorder(*roots: Expr) -> list[Expr]:
    """Every distinct node under `roots`, each after its args (iterative: no recursion limit)."""
    seen: set[int] = set()
    out: list[Expr] = []
    stack: list[tuple[Expr, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            out.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        stack.extend((a, False) for a in reversed(n.args) if id(a) not in seen)
    return out


_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "floordiv": "//",
    "mod": "%",
    **_CMP,
    "and": "&",
    "or": "|",
}
_CALL = {"abs": "abs", "exp": "exp", "log": "log", "tanh": "tanh", "to_float": "to_float"}
_CALL.update({"min": "minimum", "max": "maximum", "not": "logical_not", "where": "where"})

TEXT_LIMIT = 200


def to_text(e: Expr, limit: int = TEXT_LIMIT) -> str:
    """A Python-like rendering of `e` for messages (cut at about `limit` characters)."""
    memo: dict[int, str] = {}
    for n in postorder(e):
        memo[id(n)] = _short(_render(n, [memo[id(a)] for a in n.args]), limit)
    return memo[id(e)]


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _render(n: Expr, args: list[str]) -> str:
    if n.op == "const":
        return repr(n.value)
    if n.op in ("input", "scalar"):
        return str(n.value if n.op == "input" else n.value.name)
    if n.op == "load":
        return f"{n.value.name}[{', '.join(args)}]"
    if n.op == "neg":
        return f"-{args[0]}"
    if n.op in _INFIX:
        return f"({args[0]} {_INFIX[n.op]} {args[1]})"
    return f"{_CALL[n.op]}({', '.join(args)})"


Rule = Callable[[Expr, tuple[Expr, ...]], Expr]
"""A rebuild rule: a node and its (rebuilt) args -> its replacement (simplify, substitution)."""


def rebuild(root: Expr, rule: Rule) -> Expr:
    """`root` rebuilt bottom-up: each node replaced by `rule(node, new_args)`."""
    memo: dict[int, Expr] = {}
    for n in postorder(root):
        memo[id(n)] = rule(n, tuple(memo[id(a)] for a in n.args))
    return memo[id(root)]
