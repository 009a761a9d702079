"""`Hook`: one traced score_mod or mask_mod, its aux declarations and its identity."""

from __future__ import annotations

import weakref
from functools import cached_property
from typing import Literal

from flashgen.generator.hooks.aux import Aux
from flashgen.generator.hooks.canonical import canonical_form, digest
from flashgen.generator.hooks.diff import derivative
from flashgen.generator.hooks.expr import DType, Expr

Kind = Literal["score_mod", "mask_mod"]
KINDS: tuple[Kind, ...] = ("score_mod", "mask_mod")


class Hook:
    """A traced hook: `kind` ("score_mod": returns the new score, a float; "mask_mod": returns
    whether the key is kept, a bool), its expression, its aux declarations in ABI order, and
    the traced function's name (for messages and comments only: not part of its identity).

    Made by `trace_score_mod` / `trace_mask_mod`. Immutable; two hooks are equal when their
    canonical forms are (so equal hooks compile to the same kernel)."""

    kind: Kind
    expr: Expr
    aux: tuple[Aux, ...]
    name: str
    canonical: str  # the canonical form (canonical.py): the text the identity is hashed from
    digest: str  # a short hex digest of the canonical form, for kernel names

    def __init__(self, kind: Kind, expr: Expr, aux: tuple[Aux, ...], name: str = "") -> None:
        want = DType.FLOAT if kind == "score_mod" else DType.BOOL
        if kind not in KINDS or expr.dtype is not want:
            raise ValueError(f"a {kind} hook returns a {want.value}, not a {expr.dtype.value}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "expr", expr)
        object.__setattr__(self, "aux", tuple(aux))
        object.__setattr__(self, "name", name)
        # identity computed here, not lazily: torch.compile traces the front door's reads of
        # it (flashgen.hooked), and dynamo cannot trace hashlib inside a lazy property
        object.__setattr__(self, "canonical", canonical_form(kind, (expr,), self.aux))
        object.__setattr__(self, "digest", digest(self.canonical))
        _LIVE[(kind, self.digest)] = self

    def __setattr__(self, name: str, value: object) -> None:
        # cached_property writes the instance __dict__ directly, never through here
        raise AttributeError(f"a Hook is immutable (setting {name!r})")

    @cached_property
    def grad(self) -> Expr:
        """score_mod only: d(new score) / d(score), simplified (the backward's factor on dS)."""
        if self.kind != "score_mod":
            raise ValueError(f"{self.kind} {self.name or ''}: a mask has no derivative")
        return derivative(self.expr)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Hook):
            return NotImplemented
        return self.canonical == other.canonical

    def __hash__(self) -> int:
        return hash(self.canonical)

    def __repr__(self) -> str:
        aux = ", ".join(f"{a.name}: {a.dtype}[{a.ndim}]" for a in self.aux)
        return f"<{self.kind} {self.name or '?'} {self.digest} ({aux}): {self.expr}>"


# Every hook alive in this process by (kind, digest), weakly (a traced hook that is dropped
# goes). A hooked kernel's token names the digest; the feature registry falls back to this
# when the token was made where its registration could not run (inside torch.compile's
# tracing, which does not replay writes to module dicts).
_LIVE: weakref.WeakValueDictionary[tuple[Kind, str], Hook] = weakref.WeakValueDictionary()


def live_hook(kind: Kind, digest: str) -> Hook | None:
    """The hook of `kind` with `digest` made in this process and still alive, or None."""
    return _LIVE.get((kind, digest))
