"""User score and mask functions as symbolic expressions: the layer a hooked kernel stands on.

    import math
    from flashgen.generator import hooks as hk

    def soft_doc(score, b, h, q_idx, kv_idx, doc_ids, cap):
        same = doc_ids[q_idx] == doc_ids[kv_idx]
        return hk.where(same, cap * hk.tanh(score / cap), -math.inf)

    hook = hk.trace_score_mod(soft_doc, hk.Aux("doc_ids", "int32", 1), hk.Aux("cap", "float32", 0))
    hook.digest       # identity for kernel names (canonical.py)
    hook.grad         # d new score / d score, for the backward (diff.py)
    hk.emit_source(hook)                     # C++ device functions (cuda.py)
    hk.evaluate_hook(hook, heads=..., ...)   # the float64 oracle's values (numpy_eval.py)

Modules, one job each: expr (nodes, types, operators), aux (aux tensor declarations and
lookups), canonical (the stable text a hook's identity is hashed from), hook (`Hook`), simplify
(folding), diff (the derivative in the score), trace (calling the user's function), cuda (C++),
numpy_eval (the oracle), tiles (a mask's verdict on a whole tile: ALL, NONE or SOME of its
keys kept), library (ready-made hooks). docs/hooks.md is the user's guide.
The kernels' side (tokens, aux ABI block, template calls, oracle and launcher values) is
generator/features/hook.py; family mma's forward takes hooks.
"""

from flashgen.generator.hooks.aux import Aux, AuxRef
from flashgen.generator.hooks.cuda import emit_hook, emit_source, helpers, parameters, signature
from flashgen.generator.hooks.diff import derivative
from flashgen.generator.hooks.expr import (
    KV_LEN,
    Q_LEN,
    DType,
    Expr,
    HookError,
    HookTypeError,
    HookValueError,
    exp,
    log,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    tanh,
    to_float,
    where,
)
from flashgen.generator.hooks.expr import abs_ as abs  # noqa: A004 (the hook function, on purpose)
from flashgen.generator.hooks.hook import Hook
from flashgen.generator.hooks.numpy_eval import evaluate, evaluate_hook, grid
from flashgen.generator.hooks.simplify import simplify
from flashgen.generator.hooks.trace import trace_mask_mod, trace_score_mod

__all__ = [
    "KV_LEN",
    "Q_LEN",
    "Aux",
    "AuxRef",
    "DType",
    "Expr",
    "Hook",
    "HookError",
    "HookTypeError",
    "HookValueError",
    "abs",
    "derivative",
    "emit_hook",
    "emit_source",
    "evaluate",
    "evaluate_hook",
    "exp",
    "grid",
    "helpers",
    "log",
    "logical_and",
    "logical_not",
    "logical_or",
    "maximum",
    "minimum",
    "parameters",
    "signature",
    "simplify",
    "tanh",
    "to_float",
    "trace_mask_mod",
    "trace_score_mod",
    "where",
]
