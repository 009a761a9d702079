"""A hook's canonical form: the stable text its identity (and the kernel name's hash) comes from.

The form depends only on the expression's structure: never on Python object ids, hash seeds,
the order nodes were built in, the user's function or variable names, nor the operand order of
a commutative operation (`+ * minimum maximum == != & |`, whose operands are listed in a
structural order; IEEE `+` and `*` give the same bits either way round, and `fminf`/`fmaxf`
differ at most in the sign of a zero result).

Aux tensors are named by position, with their type and rank (`aux1:int32[1]`), not by their
Python names: the kernel ABI takes them positionally, so renaming an aux tensor keeps the
hook's identity and reordering the declarations changes it. (The generated C++ still uses the
names, for readability; two hooks that differ only in aux names have one hash and the same
machine code.)

Shared subexpressions appear once: the form is a numbered list of nodes in post-order, as in
an SSA listing, so its size is linear in the expression's DAG.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from flashgen.generator.hooks.aux import Aux
from flashgen.generator.hooks.expr import COMMUTATIVE, Expr, postorder

FORMAT = "flashgen-hook/1"
"""The first line of every canonical form; bump it when the form changes meaning."""
DIGEST_CHARS = 12


def _leaf_text(n: Expr, aux_pos: dict[Aux, int]) -> str:
    if n.op == "const":
        v = n.value
        return f"const {v.hex() if isinstance(v, float) else repr(v)}"
    if n.op == "input":
        return f"input {n.value}"
    if n.op in ("scalar", "load"):
        return f"{n.op} aux{aux_pos[n.value]}"
    return n.op


def canonical_form(kind: str, roots: Sequence[Expr], aux: Sequence[Aux]) -> str:
    """The canonical text of a hook of kind `kind` ("score_mod", "mask_mod") returning
    `roots`, with aux tensors `aux` in ABI order (each read aux must be among them)."""
    aux_pos = {a: i for i, a in enumerate(aux)}
    for n in postorder(*roots):
        if n.op in ("scalar", "load") and n.value not in aux_pos:
            raise ValueError(f"aux tensor {n.value.name} is read but not declared")
    order = _structural_order(roots, aux_pos)
    lines = [f"{FORMAT} {kind}"]
    lines += [f"aux{i} {a.dtype}[{a.ndim}]" for i, a in enumerate(aux)]
    number: dict[int, int] = {}
    # post-order again, visiting a commutative node's operands in structural order
    stack: list[tuple[Expr, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            if id(n) in number:
                continue
            number[id(n)] = len(number)
            args = " ".join(f"%{number[id(a)]}" for a in order[id(n)])
            head = f"%{number[id(n)]} = {n.dtype.value} {_leaf_text(n, aux_pos)}"
            lines.append(f"{head} {args}".rstrip())
            continue
        if id(n) in number:
            continue
        stack.append((n, True))
        stack.extend((a, False) for a in reversed(order[id(n)]) if id(a) not in number)
    lines.append("return " + " ".join(f"%{number[id(r)]}" for r in roots))
    return "\n".join(lines)


def _structural_order(roots: Sequence[Expr], aux_pos: dict[Aux, int]) -> dict[int, list[Expr]]:
    """Each node's operands in listing order: as written, or for a commutative operation by
    their structural signature (a digest of the subtree that ignores object identity)."""
    sig: dict[int, str] = {}
    order: dict[int, list[Expr]] = {}
    for n in postorder(*roots):
        args = list(n.args)
        if n.op in COMMUTATIVE:
            args.sort(key=lambda a: sig[id(a)])
        order[id(n)] = args
        text = f"{n.dtype.value} {_leaf_text(n, aux_pos)} " + " ".join(sig[id(a)] for a in args)
        sig[id(n)] = hashlib.sha256(text.encode()).hexdigest()
    return order


def digest(canonical: str, chars: int = DIGEST_CHARS) -> str:
    """A short hex digest of a canonical form (what a kernel name carries)."""
    return hashlib.sha256(canonical.encode()).hexdigest()[:chars]
