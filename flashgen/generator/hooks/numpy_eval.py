"""The float64 oracle's evaluation of a hook: NumPy, vectorised over broadcast inputs.

Floats are float64 (the kernels: fp32), ints are int64 (the kernels: int32; a hook whose int
values leave int32 is outside the contract, so no int32 wraparound is imitated), bools are
bool. Integer `//` and `%` are NumPy's floor division and modulo, Python's semantics, which the
generated C++ reproduces; a zero int divisor is an error here. `minimum`/`maximum` on floats
are `np.fmin`/`np.fmax` (a nan operand yields the other: fminf/fmaxf). A float32 aux tensor's
elements are rounded to float32 before use (what the kernels read); an int32 aux tensor must
hold int32 values.

Every branch of a `where` is evaluated, so an aux index must be in range for every
(b, h, q_idx, kv_idx) evaluated, taken branch or not; an index outside its table is an error
naming the tensor, the index expression and the range it left (the kernels read unchecked).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from flashgen.generator.hooks.aux import Aux
from flashgen.generator.hooks.expr import (
    INT32_MAX,
    INT32_MIN,
    DType,
    Expr,
    postorder,
    to_text,
)
from flashgen.generator.hooks.hook import Hook

Array = npt.NDArray[Any]

_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "and": np.logical_and,
    "or": np.logical_or,
}
_UNARY = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "not": np.logical_not,
}
_NP_TYPE = {DType.FLOAT: np.float64, DType.INT: np.int64, DType.BOOL: np.bool_}


def evaluate(expr: Expr, inputs: Mapping[str, Any], aux: Mapping[str, Any] | None = None) -> Array:
    """`expr`'s value over the broadcast of `inputs` (by input name: "score", "b", "h",
    "q_idx", "kv_idx", "q_len", "kv_len"; only those the expression reads are needed), with
    aux tensors `aux` by declared name: an array of the broadcast shape of what it reads."""
    return evaluate_many((expr,), inputs, aux)[0]


def evaluate_many(
    exprs: tuple[Expr, ...], inputs: Mapping[str, Any], aux: Mapping[str, Any] | None = None
) -> list[Array]:
    """`evaluate` for several expressions at once, sharing their common subexpressions."""
    aux = aux or {}
    val: dict[int, Array] = {}
    with np.errstate(all="ignore"):  # inf and nan are values here, as in fp32 kernels
        for n in postorder(*exprs):
            val[id(n)] = _eval(n, [val[id(a)] for a in n.args], inputs, aux)
    return [val[id(r)] for r in exprs]


def _eval(n: Expr, args: list[Array], inputs: Mapping[str, Any], aux: Mapping[str, Any]) -> Array:
    op = n.op
    if op == "const":
        return np.asarray(n.value, _NP_TYPE[n.dtype])
    if op == "input":
        if n.value not in inputs:
            raise ValueError(
                f"input {n.value}: the expression reads it and no value was given; "
                f"pass inputs[{n.value!r}]"
            )
        return np.asarray(inputs[n.value], _NP_TYPE[n.dtype])
    if op == "scalar":
        return _aux_value(n.value, aux)
    if op == "load":
        return _load(n, args, aux)
    if op in _BINARY:
        return np.asarray(_BINARY[op](args[0], args[1]))
    if op in _UNARY:
        return np.asarray(_UNARY[op](args[0]))
    if op == "div":
        return np.asarray(np.true_divide(args[0], args[1]))
    if op in ("floordiv", "mod"):
        if np.any(args[1] == 0):
            raise ZeroDivisionError(
                f"{to_text(n)}: integer division by zero (undefined in the kernels); "
                "keep the divisor nonzero, e.g. hk.maximum(d, 1)"
            )
        fn = np.floor_divide if op == "floordiv" else np.mod
        return np.asarray(fn(args[0], args[1]))
    if op in ("min", "max"):
        if n.dtype is DType.FLOAT:
            return np.asarray((np.fmin if op == "min" else np.fmax)(args[0], args[1]))
        return np.asarray((np.minimum if op == "min" else np.maximum)(args[0], args[1]))
    if op == "to_float":
        return args[0].astype(np.float64)
    if op == "where":
        return np.asarray(np.where(args[0], args[1], args[2]))
    raise AssertionError(f"no evaluation rule for {op}")


def _aux_value(a: Aux, aux: Mapping[str, Any]) -> Array:
    """The aux tensor `a`'s value, checked and converted (int64 / float64 of float32)."""
    if a.name not in aux:
        raise ValueError(
            f"aux tensor {a.name}: the expression reads it and no value was given; "
            f"pass aux[{a.name!r}] ({a.dtype}, {a.ndim}-D)"
        )
    arr = np.asarray(aux[a.name])
    if arr.ndim != a.ndim:
        raise ValueError(
            f"aux tensor {a.name}: shape {arr.shape} has {arr.ndim} dimensions and it was "
            f"declared with {a.ndim}; pass a {a.ndim}-D array"
        )
    if a.dtype == "float32":
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"aux tensor {a.name}: dtype {arr.dtype} is not numeric")
        return arr.astype(np.float32).astype(np.float64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"aux tensor {a.name}: dtype {arr.dtype} for an int32 tensor; pass integers "
            "(.astype(np.int32))"
        )
    if arr.size and (arr.min() < INT32_MIN or arr.max() > INT32_MAX):
        raise ValueError(f"aux tensor {a.name}: values outside int32; the kernels read int32")
    return arr.astype(np.int64)


def _load(n: Expr, indices: list[Array], aux: Mapping[str, Any]) -> Array:
    a: Aux = n.value
    table = _aux_value(a, aux)
    for axis, (idx, e) in enumerate(zip(indices, n.args, strict=True)):
        size = table.shape[axis]
        if idx.size and (idx.min() < 0 or idx.max() >= size):
            bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
            raise IndexError(
                f"{to_text(n)}: index {to_text(e)} reaches {bad}, outside [0, {size}) for axis "
                f"{axis} of {a.name} (shape {table.shape}); the kernels read aux tensors "
                "unchecked, so every index must be in range wherever the hook is evaluated, "
                "both branches of a where included; size the table to cover it or clamp the "
                "index, e.g. hk.minimum(hk.maximum(i, 0), n - 1)"
            )
    return np.asarray(table[tuple(np.broadcast_arrays(*indices))])


# ---- the standard grid ---------------------------------------------------------------------


def grid(
    heads: Any, tq: int, tk: int, b: int = 0, q_len: int | None = None, kv_len: int | None = None
) -> dict[str, Array]:
    """The integer inputs of one (batch, heads) block of a (Tq, Tk) problem, shaped to
    broadcast against scores of shape (len(heads), Tq, Tk): h (H, 1, 1) the query heads
    `heads`, q_idx (1, Tq, 1), kv_idx (1, 1, Tk), b, q_len = Tq and kv_len = Tk (scalars)."""
    h = np.asarray(heads, np.int64).reshape(-1, 1, 1)
    return {
        "b": np.asarray(b, np.int64),
        "h": h,
        "q_idx": np.arange(tq, dtype=np.int64).reshape(1, tq, 1),
        "kv_idx": np.arange(tk, dtype=np.int64).reshape(1, 1, tk),
        "q_len": np.asarray(tq if q_len is None else q_len, np.int64),
        "kv_len": np.asarray(tk if kv_len is None else kv_len, np.int64),
    }


def evaluate_hook(
    hook: Hook,
    *,
    heads: Any,
    tq: int,
    tk: int,
    score: Any = None,
    b: int = 0,
    aux: Mapping[str, Any] | None = None,
    grad: bool = False,
) -> Array:
    """A hook over the grid (`grid`) as a full (len(heads), Tq, Tk) array: a score_mod's new
    scores for `score` of that shape (or its derivative in the score with `grad=True`), or a
    mask_mod's kept keys."""
    inputs: dict[str, Any] = dict(grid(heads, tq, tk, b))
    shape = (inputs["h"].shape[0], tq, tk)
    if hook.kind == "score_mod":
        if score is None:
            raise ValueError(f"score_mod {hook.name}: pass score, an array of shape {shape}")
        inputs["score"] = np.asarray(score, np.float64)
    expr = hook.grad if grad else hook.expr
    out: Array = np.broadcast_to(evaluate(expr, inputs, aux), shape).copy()
    return out
