"""Aux tensors: the user's arrays (and scalars) a hook reads, declared with `Aux`.

An aux tensor is declared by name, element type and rank; the traced function receives one
argument per declaration, in order. A rank-0 aux is a run-time scalar (one value per call,
passed by value: a softcap's cap, a window's sides) and is an expression itself. A rank-1 or
rank-2 aux is indexed with int expressions: `doc_ids[q_idx]`, `bias[h, kv_idx - q_idx + 1023]`.

The kernels read aux tensors unchecked, so every index must be in range wherever the hook is
evaluated, both branches of a `where` included (the oracle evaluates every branch and refuses an
out-of-range index). Clamp an index that can leave the table: `hk.minimum(hk.maximum(i, 0), n - 1)`.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from typing import Any, NoReturn

from flashgen.generator.hooks.expr import (
    INPUTS,
    DType,
    Expr,
    HookValueError,
    fail,
    lift,
    node,
    postorder,
)

AUX_DTYPES: dict[str, DType] = {"int32": DType.INT, "float32": DType.FLOAT}
"""Element types an aux tensor may have, and the expression type an element reads as."""
AUX_CTYPES = {"int32": "int", "float32": "float"}

# names the generated C++ already uses, or that would shadow a C/C++ word in it
_RESERVED = frozenset(INPUTS) | {
    "auto", "bool", "break", "case", "char", "const", "continue", "default", "do", "double",
    "else", "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union",
    "unsigned", "void", "volatile", "while", "class", "delete", "new", "this", "true", "false",
    "template", "typename", "namespace", "operator", "private", "public", "protected", "virtual",
    "min", "max", "abs", "exp", "log", "tanh", "grad",
}  # fmt: skip
_IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Aux:
    """An aux tensor declaration: `Aux("doc_ids", "int32", 1)`.

    `name` is the parameter's name in the generated C++ (a C identifier; not an input name, a
    C++ keyword, nor `t<digits>` / `fg_...`, which the generated code uses), `dtype` is
    "int32" or "float32", `ndim` is 0 (a scalar passed by value), 1 or 2 (a device array; a
    rank-2 one also takes its row stride, in elements).
    """

    name: str
    dtype: str
    ndim: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _IDENT.match(self.name):
            fail(
                f"Aux name {self.name!r}",
                "must be a C identifier (a letter, then letters, digits or _)",
                "e.g. Aux('doc_ids', 'int32', 1)",
                HookValueError,
            )
        generated = re.match(r"^t[0-9]+$", self.name) or self.name.startswith("fg_")
        if self.name in _RESERVED or keyword.iskeyword(self.name) or generated:
            fail(
                f"Aux name {self.name!r}",
                "is taken (a hook input, a C++ or Python keyword, or a name the generated "
                "code uses: t<digits>, fg_...)",
                f"rename it, e.g. {self.name}_tab",
                HookValueError,
            )
        if self.dtype not in AUX_DTYPES:
            fail(
                f"Aux {self.name!r} dtype={self.dtype!r}",
                f"must be one of {', '.join(map(repr, AUX_DTYPES))}",
                "store ids and positions as int32, values as float32",
                HookValueError,
            )
        if isinstance(self.ndim, bool) or self.ndim not in (0, 1, 2):
            fail(
                f"Aux {self.name!r} ndim={self.ndim!r}",
                "must be 0 (a scalar), 1 or 2",
                "flatten a larger table into 2 dimensions and index it with a computed row",
                HookValueError,
            )

    @property
    def expr_dtype(self) -> DType:
        """The expression type one element reads as."""
        return AUX_DTYPES[self.dtype]

    @property
    def ctype(self) -> str:
        """The C element type (`int` or `float`)."""
        return AUX_CTYPES[self.dtype]

    def symbol(self) -> Expr | AuxRef:
        """What the traced function receives for it: the scalar's expression (ndim 0) or an
        indexable reference."""
        if self.ndim == 0:
            return node("scalar", self.expr_dtype, value=self)
        return AuxRef(self)


class AuxRef:
    """A rank-1 or rank-2 aux tensor inside a traced function: index it to read an element."""

    __slots__ = ("aux",)

    def __init__(self, aux: Aux) -> None:
        self.aux = aux

    def __repr__(self) -> str:
        return f"<aux {self.aux.name}: {self.aux.dtype}, {self.aux.ndim}-D>"

    def __getitem__(self, key: Any) -> Expr:
        keys = key if isinstance(key, tuple) else (key,)
        a = self.aux
        if len(keys) != a.ndim:
            want = "one index" if a.ndim == 1 else f"{a.ndim} indices"
            example = f"{a.name}[q_idx]" if a.ndim == 1 else f"{a.name}[h, kv_idx]"
            fail(
                f"{a.name}[{', '.join(map(_show, keys))}]",
                f"{a.name} is a {a.ndim}-D aux tensor and takes {want}, got {len(keys)}",
                f"index it as {example}",
            )
        indices = []
        for k in keys:
            if isinstance(k, slice) or k is Ellipsis or k is None:
                fail(
                    f"{a.name}[{', '.join(map(_show, keys))}]",
                    "aux tensors take one int expression per dimension (no slices, ..., None)",
                    f"read one element, e.g. {a.name}[q_idx]",
                )
            e = lift(k)
            if e.dtype is not DType.INT:
                fail(
                    f"{a.name}[{', '.join(map(_show, keys))}]",
                    f"indices must be ints, and {e} is {e.dtype.article}",
                    "index with int expressions (b, h, q_idx, kv_idx, int aux values, // and %)"
                    "; floats never convert to ints",
                )
            indices.append(e)
        return node("load", a.expr_dtype, tuple(indices), a)

    def hook_misuse(self) -> NoReturn:
        """Called when the reference itself meets arithmetic: say to index it."""
        a = self.aux
        example = f"{a.name}[q_idx]" if a.ndim == 1 else f"{a.name}[h, kv_idx]"
        fail(
            f"aux tensor {a.name} ({a.ndim}-D) used as a value",
            "an aux tensor of rank 1 or 2 is read one element at a time",
            f"index it, e.g. {example}",
        )

    def __bool__(self) -> bool:
        self.hook_misuse()

    def _refuse(self, *_: Any) -> NoReturn:
        self.hook_misuse()

    # arithmetic and comparisons on the reference itself (left operand): the same message
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __neg__ = __abs__ = __and__ = __or__ = __invert__ = _refuse

    def __eq__(self, other: object) -> NoReturn:  # type: ignore[override]
        self.hook_misuse()

    def __ne__(self, other: object) -> NoReturn:  # type: ignore[override]
        self.hook_misuse()

    __hash__ = object.__hash__


def _show(k: Any) -> str:
    return str(k) if isinstance(k, Expr) else repr(k)


def aux_used(*roots: Expr) -> list[Aux]:
    """The aux declarations the expressions read, in first-use order."""
    out: list[Aux] = []
    for n in postorder(*roots):
        if n.op in ("load", "scalar") and n.value not in out:
            out.append(n.value)
    return out
