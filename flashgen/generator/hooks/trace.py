"""Tracing: a user's Python score_mod / mask_mod called once on symbolic inputs -> a `Hook`.

    def rel_bias(score, b, h, q_idx, kv_idx, bias):
        return score + bias[h, hk.minimum(hk.maximum(kv_idx - q_idx + 1023, 0), 2046)]

    hook = hk.trace_score_mod(rel_bias, hk.Aux("bias", "float32", 2))

The function is called once, with `score` (float), `b`, `h`, `q_idx`, `kv_idx` (ints) and one
argument per aux declaration, in order; `hk.Q_LEN` and `hk.KV_LEN` (Tq and Tk) may be read from
anywhere. Python runs as usual around the expressions (loops over Python values, helper
functions, closures over Python numbers all work); what depends on the inputs must be written
with the expression set (see expr.py). Errors the expression set raises are re-raised with the
hook's name in front, as the same exception type.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from flashgen.generator.hooks.aux import Aux, aux_used
from flashgen.generator.hooks.expr import (
    INPUTS,
    DType,
    Expr,
    HookError,
    HookTypeError,
    HookValueError,
    fail,
    input_node,
    lift,
    postorder,
)
from flashgen.generator.hooks.hook import Hook, Kind

_POSITIONAL = {
    "score_mod": ("score", "b", "h", "q_idx", "kv_idx"),
    "mask_mod": ("b", "h", "q_idx", "kv_idx"),
}


def trace_score_mod(fn: Callable[..., Any], *aux: Aux) -> Hook:
    """Trace `fn(score, b, h, q_idx, kv_idx, *aux)`, which returns the new score (a float
    expression, in the natural-log units of the scaled score it is given)."""
    return _trace("score_mod", fn, aux)


def trace_mask_mod(fn: Callable[..., Any], *aux: Aux) -> Hook:
    """Trace `fn(b, h, q_idx, kv_idx, *aux)`, which returns True for the keys a query keeps
    (a bool expression)."""
    return _trace("mask_mod", fn, aux)


def as_hook(value: Any, kind: str) -> Hook:
    """`value` as a hook: a traced Hook as it is, a plain function traced as a `kind` hook
    without aux ("score_mod" or "mask_mod"). TypeError for anything else; the tracer's own
    exception when tracing fails (callers add where the value came from). The hook's kind is
    the caller's to check."""
    if isinstance(value, Hook):
        return value
    if not callable(value):
        raise TypeError(f"a {type(value).__name__}; a hook is a traced Hook or a function")
    return trace_score_mod(value) if kind == "score_mod" else trace_mask_mod(value)


def _trace(kind: Kind, fn: Callable[..., Any], aux: tuple[Aux, ...]) -> Hook:
    name = getattr(fn, "__name__", type(fn).__name__)
    label = f"{kind} {name}"
    _check_aux(label, aux)
    positional = _POSITIONAL[kind]
    args: list[Any] = [input_node(p, INPUTS[p]) for p in positional]
    args += [a.symbol() for a in aux]
    _check_arity(label, kind, fn, positional, aux, len(args))
    try:
        out = fn(*args)
        expr = _result(kind, out)
    except HookError as exc:
        # the same type, so callers may catch TypeError / ValueError as documented
        raise type(exc)(f"{label}: {exc}") from None
    _check_reads(label, kind, expr, aux)
    return Hook(kind, expr, aux, name)


def _check_aux(label: str, aux: tuple[Aux, ...]) -> None:
    seen: set[str] = set()
    for a in aux:
        if not isinstance(a, Aux):
            fail(
                f"{label}: aux declaration {a!r}",
                "each aux tensor is declared as hk.Aux(name, dtype, ndim)",
                "e.g. trace_mask_mod(fn, hk.Aux('doc_ids', 'int32', 1))",
            )
        if a.name in seen:
            fail(
                f"{label}: aux name {a.name!r} declared twice",
                "aux names are the generated function's parameter names and must differ",
                "rename one of them",
                HookValueError,
            )
        seen.add(a.name)
    strides = {f"{a.name}_stride": a.name for a in aux if a.ndim == 2}
    for a in aux:
        if a.name in strides:
            fail(
                f"{label}: aux name {a.name!r}",
                f"is the C++ name of the row stride of {strides[a.name]} (a 2-D aux tensor)",
                f"rename it, e.g. {a.name}_",
                HookValueError,
            )


def _check_arity(
    label: str,
    kind: Kind,
    fn: Callable[..., Any],
    positional: tuple[str, ...],
    aux: tuple[Aux, ...],
    count: int,
) -> None:
    if not callable(fn):
        fail(f"{kind} {fn!r}", "must be a function", f"pass a function {_wanted(kind, aux)}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return
    try:
        sig.bind(*range(count))
    except TypeError:
        stars: dict[object, str] = {
            inspect.Parameter.VAR_POSITIONAL: "*",
            inspect.Parameter.VAR_KEYWORD: "**",
        }
        shown = ", ".join(stars.get(p.kind, "") + p.name for p in sig.parameters.values())
        fail(
            f"{label}({shown})",
            f"is called with {count} arguments: {', '.join(positional)}, then one per aux "
            f"tensor declared ({len(aux)} here)",
            f"define it as {_wanted(kind, aux)}, or declare the aux tensors it takes",
        )


def _wanted(kind: Kind, aux: tuple[Aux, ...]) -> str:
    params = ", ".join([*_POSITIONAL[kind], *(a.name for a in aux)])
    return f"def {kind}({params})"


def _result(kind: Kind, out: Any) -> Expr:
    """The returned value as an expression of the kind's type, or the error naming the fix."""
    if kind == "score_mod":
        want, fix = DType.FLOAT, "return the new score, e.g. `return score` or a float expression"
    else:
        want, fix = DType.BOOL, "return a condition, e.g. `return kv_idx <= q_idx`"
    if out is None:
        fail("returned None", f"a {kind} returns a {want.value}", fix)
    try:
        expr = lift(out)
    except HookTypeError:
        fail(f"returned {out!r} (a {type(out).__name__})", f"a {kind} returns a {want.value}", fix)
    if expr.dtype is want:
        return expr
    if kind == "score_mod" and expr.dtype is DType.INT:
        fix = "convert it with hk.to_float(...)"
    elif kind == "score_mod":
        fix = (
            "a condition is a mask: trace it with trace_mask_mod, or keep the score where it "
            "holds with hk.where(c, score, -math.inf)"
        )
    else:
        fix = "compare it, e.g. `return x != 0`"
    fail(f"returned {expr} ({expr.dtype.article})", f"a {kind} returns a {want.value}", fix)


def _check_reads(label: str, kind: Kind, expr: Expr, aux: tuple[Aux, ...]) -> None:
    for a in aux_used(expr):
        if a not in aux:
            fail(
                f"{label}: aux tensor {a.name} ({a.dtype}[{a.ndim}])",
                "is read but not declared in this trace (a reference kept from another one?)",
                "pass its hk.Aux declaration to this trace and use the argument it becomes",
                HookValueError,
            )
    allowed = set(_POSITIONAL[kind]) | {"q_len", "kv_len"}
    for n in postorder(expr):
        if n.op == "input" and n.value not in allowed:
            fail(
                f"{label}: input {n.value}",
                f"is not an input of a {kind} (it takes {', '.join(sorted(allowed))})",
                "use only the arguments the function is given",
                HookValueError,
            )
