"""A score_mod lowered for 16-bit kernels: the whole per-element step from raw score to base-2
logit as one inline function, with every loop-invariant factor folded out of it.

A kernel calls a score_mod once per score element, so its per-element instruction count is the
hook's cost. `emit_logit` writes

    float N(float s, float s_scale, int b, int h, int q_idx, int kv_idx, int q_base, int q_off,
            int kv_base, int kv_off, int q_len, int kv_len, AUX...)

returning `hook(s * s_scale, b, h, q_idx, kv_idx, ...) * log2(e)`, where `q_idx == q_base +
q_off` for every row below q_len and `kv_idx == kv_base + kv_off` for every key below kv_len
(the rows and keys past them may pass clamped indices, so that aux reads stay in range: their
logits are never used, so any value serves). A kernel passes its row group's and tile's first
row and key as the bases and the element's offsets, compile-time constants once its loop is
unrolled.

Three rewrites make the per-element code as short as the built-in features' (the precise
emitter, cuda.py, keeps the hook's operations one for one: IEEE division, libdevice tanhf, and
the kernel's own `* scale` and `* log2(e)` around the call):

1. Affine forms. Every float subexpression is kept as `a + m * v`: `a` and `m` invariant (no
   score, no kv_idx: computed once per row or tile, the compiler hoists them), `v` the varying
   part. Multiplying or dividing by an invariant, adding one, negating, and the final
   `* log2(e)` change `a` and `m` only, so `c * tanh(s * scale / c) * log2(e)` costs one FMUL
   into the tanh and one FFMA out of it, as the built-in softcap. A division by an invariant is
   a multiplication by its reciprocal (computed once).
2. tanh on the SFU: `tanh(u) = 1 - 2 / (2^(2 u log2 e) + 1)` with `ex2.approx` and
   `rcp.approx`, the built-in 16-bit softcap's formula (templates/_common.cuh.j2), in the affine
   form `1 + (-2) * r`; its error bound is `TANH_SFU_ERROR` (derived there; the oracle adds it:
   features/hook.py `HookCall.lse_terms`).
3. Int to float without I2F per element: `to_float(E)` for an int E whose only varying term is
   `+kv_idx` or `-kv_idx` in a sum becomes `(float)(E at q_base, kv_base) + (float)(+-q_off
   +-kv_off)` (q_idx splits when it is one term of the sum): one conversion per tile, and a
   constant the compiler folds and shares between the elements with the same offsets, as the
   built-in ALiBi's `pb0 + (float)(8 * h - x)`. `to_float` of an int `abs`, `minimum`,
   `maximum` or negation is moved inside them (fabsf, fminf, fmaxf: exact). Exact while the
   values stay below 2^24 in magnitude; above, one more rounding (the oracle counts two per
   to_float).

exp and log stay precise (expf, logf) on their folded argument; anything else varying is
emitted as the precise emitter would, on the materialized `a + m * v` (one FFMA).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from flashgen.generator.hooks.cuda import DEVICE, _literal, _render, _unwrap, aux_parameters
from flashgen.generator.hooks.expr import DType, Expr, postorder
from flashgen.generator.hooks.hook import Hook

LOG2E = 1.4426950408889634
U32 = 2.0**-24
EX2_REL = 2.0**-22
"""ex2.approx.ftz.f32: at most 2 ulps (relative 2 * 2^-23) over its range (PTX ISA, ex2)."""
RCP_REL = 2.0**-23
"""rcp.approx.ftz.f32: at most 1 ulp (relative 2^-23) over its range (PTX ISA, rcp)."""
ARG_GAIN = 0.4484
"""max over u of |u| * (1 - tanh(u)^2) (at u ~ 0.7717): how much a relative error of the tanh's
argument moves the tanh, absolutely."""
ARG_REL = 5 * U32
"""The folded argument's relative error: the reciprocal, two constant products and the
per-element multiply (each one rounding), and 2 log2(e) as an fp32 constant."""
TANH_SFU_ERROR = 2 * (EX2_REL + U32 + RCP_REL) + U32 + ARG_GAIN * ARG_REL
"""An absolute bound on |tanh_sfu(u) - tanh(u)| for every float u (tanh units). With
R = 1 / (e^(2u) + 1), the kernel computes r = rcp(RN(ex2(t) + 1)), t the folded argument:
ex2's relative error reaches r scaled by e / (e + 1) <= 1, the FADD's rounding and rcp's error
directly, so r = R (1 + rho), |rho| <= EX2_REL + U32 + RCP_REL (first order), and
|2 r - 2 R| <= 2 |rho| (2R <= 2); the FFMA 1 - 2r rounds once more (|.| <= 1: U32); the
argument's error moves tanh by at most ARG_GAIN * ARG_REL. About 1.0e-6 (tests/generator/hooks/
test_fold.py checks it against float64 on a float32 model of the formula, worst cases included).
The constants folded around the tanh (c, -2c log2 e) round like any other operation of the
hook: the oracle's op count covers them."""

PARAMS = (
    "s",
    "s_scale",
    "b",
    "h",
    "q_idx",
    "kv_idx",
    "q_base",
    "q_off",
    "kv_base",
    "kv_off",
    "q_len",
    "kv_len",
)
"""The fixed parameters of a logit function, in order (s and s_scale float, the rest int)."""
_VARYING = frozenset({"score", "kv_idx"})

LOGIT_HELPERS = r"""#ifndef FLASHGEN_HOOK_LOGIT_HELPERS
#define FLASHGEN_HOOK_LOGIT_HELPERS
// The SFU's 2^x and 1/x (ex2.approx: 2 ulps, rcp.approx: 1 ulp; flush-to-zero), for the
// lowered score_mods of 16-bit kernels (flashgen/generator/hooks/fold.py); on the host (tests)
// the precise functions
__host__ __device__ __forceinline__ float fg_sfu_ex2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}
__host__ __device__ __forceinline__ float fg_sfu_rcp(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return 1.0f / x;
#endif
}
#endif  // FLASHGEN_HOOK_LOGIT_HELPERS
"""

Inv = float | str
"""An invariant value: a Python number (folded here, emitted as an fp32 literal) or C++ text."""


@dataclass(frozen=True)
class Form:
    """A float value `a + sum(m * v for m, v in terms)`: each m invariant, each v varying C++
    text; no terms for an invariant (then the value is `a`); `a` None for no additive part (so
    no 0 * inf ever appears)."""

    a: Inv | None
    terms: tuple[tuple[Inv, str], ...] = ()

    @property
    def invariant(self) -> bool:
        return not self.terms


def logit_helpers() -> str:
    """The SFU helpers the logit functions call (once per translation unit; guarded)."""
    return LOGIT_HELPERS


def logit_signature(hook: Hook, name: str, qualifiers: str = DEVICE) -> str:
    """`qualifiers float name(s, s_scale, b, h, q_idx, kv_idx, q_base, q_off, kv_base, kv_off,
    q_len, kv_len, AUX...)`."""
    params = [f"{'float' if p.startswith('s') else 'int'} {p}" for p in PARAMS]
    params += [f"{t} {n}" for a in hook.aux for t, n in aux_parameters(a)]
    return f"{qualifiers} float {name}({', '.join(params)})"


def emit_logit(hook: Hook, name: str, qualifiers: str = DEVICE) -> str:
    """A score_mod's base-2 logit function for 16-bit kernels (see the module doc); needs
    `logit_helpers()` (and cuda.helpers()) first."""
    if hook.kind != "score_mod":
        raise ValueError(f"{hook.kind} {hook.name or '?'}: only a score_mod has a logit")
    body = _Lowering(hook.expr)
    root = body.form(hook.expr)
    out = body.materialize(_scale(root, LOG2E))
    what = (
        f"// score_mod {hook.name or '?'} (hook {hook.digest}) times log2(e), at score s * "
        "s_scale, row q_base + q_off, key kv_base + kv_off;\n// invariant factors folded, "
        "tanh on the SFU (flashgen/generator/hooks/fold.py)\n"
    )
    lines = [*body.lines, f"  return {_unwrap(out)};"]
    return what + logit_signature(hook, name, qualifiers) + " {\n" + "\n".join(lines) + "\n}\n"


def logit_grad_signature(hook: Hook, name: str, qualifiers: str = DEVICE) -> str:
    """`logit_signature` with a last parameter `float& dscore` (the derivative's out)."""
    return logit_signature(hook, name, qualifiers)[:-1] + ", float& dscore)"


def emit_logit_grad(hook: Hook, name: str, qualifiers: str = DEVICE) -> str:
    """A score_mod's base-2 logit, as `emit_logit`'s, that also sets `dscore` to the hook's
    derivative by its score (`hook.grad`, natural units: the factor a backward multiplies dS
    by), lowered in the same body: the subexpressions the two share (softcap's tanh, on the
    SFU) are computed once. For the backward of 16-bit kernels (family wgmma's), which
    recomputes P exactly as the forward's `emit_logit` computed the logit."""
    if hook.kind != "score_mod":
        raise ValueError(f"{hook.kind} {hook.name or '?'}: only a score_mod has a logit")
    body = _Lowering(hook.expr, hook.grad)
    value = body.materialize(_scale(body.form(hook.expr), LOG2E))
    grad = body.materialize(body.form(hook.grad))
    what = (
        f"// score_mod {hook.name or '?'} (hook {hook.digest}) times log2(e), as emit_logit "
        "lowers it, and in dscore its\n// derivative by the score (flashgen/generator/hooks/"
        "fold.py: emit_logit_grad)\n"
    )
    lines = [*body.lines, f"  dscore = {_unwrap(grad)};", f"  return {_unwrap(value)};"]
    return what + logit_grad_signature(hook, name, qualifiers) + " {\n" + "\n".join(lines) + "\n}\n"


def sfu_nodes(expr: Expr) -> list[Expr]:
    """The nodes `emit_logit` evaluates on the SFU (a varying tanh): each adds up to
    TANH_SFU_ERROR, times how much the result moves with it, to the logit's error."""
    return [n for n in postorder(expr) if n.op == "tanh" and _varies(n)]


# ---- invariant arithmetic ------------------------------------------------------------------


def _text(x: Inv) -> str:
    return _literal(x, DType.FLOAT) if isinstance(x, float) else x


def _mul(x: Inv, y: Inv) -> Inv:
    if isinstance(x, float) and isinstance(y, float):
        return x * y
    sign = _cancels(x, y)
    if sign is not None:  # c * (1 / c): exactly 1 in real arithmetic, one rounding less in fp32
        return sign
    if x == 1.0 or y == 1.0:
        return y if x == 1.0 else x
    if x == -1.0 or y == -1.0:
        return _neg(y if x == -1.0 else x)
    return f"({_text(x)} * {_text(y)})"


def _cancels(x: Inv, y: Inv) -> float | None:
    """+-1.0 when x * y is c * (1 / c) or c * -(1 / c) (either order) for one invariant text c
    (as `_rcp` and `_neg` write them), else None. A derivative meets it where the chain rule
    multiplies by a factor and then by its reciprocal: softcap's `c * tanh'(s / c) / c`."""
    for a, b in ((x, y), (y, x)):
        if isinstance(a, str) and isinstance(b, str):
            if b == f"(1.0f / {a})":
                return 1.0
            if b == f"(-(1.0f / {a}))":
                return -1.0
    return None


def _neg(x: Inv) -> Inv:
    return -x if isinstance(x, float) else f"(-{x})"


def _add(x: Inv | None, y: Inv | None) -> Inv | None:
    if x is None or y is None:
        return y if x is None else x
    if isinstance(x, float) and isinstance(y, float):
        return x + y
    return f"({_text(x)} + {_text(y)})"


def _rcp(x: Inv) -> Inv:
    if isinstance(x, float) and x != 0.0 and math.isfinite(x):
        return 1.0 / x
    return f"(1.0f / {_text(x)})"


def _scale(f: Form, k: Inv) -> Form:
    """f * k for an invariant k: every part scales, nothing is computed per element."""
    a = None if f.a is None else _mul(f.a, k)
    return Form(a, tuple((_mul(m, k), v) for m, v in f.terms))


def _sum(f: Form, g: Form) -> Form:
    """f + g: the additive parts add (invariant), the varying terms join (a shared v merges)."""
    terms: dict[str, Inv] = {v: m for m, v in f.terms}
    for m, v in g.terms:
        both = _add(terms.get(v), m)
        assert both is not None
        terms[v] = both
    return Form(_add(f.a, g.a), tuple((m, v) for v, m in terms.items()))


def _varies(n: Expr) -> bool:
    return any(x.op == "input" and x.value in _VARYING for x in postorder(n))


# ---- the lowering ----------------------------------------------------------------------------


class _Lowering:
    """One function body: each node's Form (floats) or C++ text (ints, bools), statements for
    the values used more than once."""

    def __init__(self, *roots: Expr) -> None:
        # uses over every root: a node two roots share (a value and its derivative) is bound
        # to a statement once and read by both
        self.uses: Counter[int] = Counter(id(r) for r in roots)
        seen: set[int] = set()
        for root in roots:
            for n in postorder(root):
                if id(n) not in seen:
                    seen.add(id(n))
                    self.uses.update(id(a) for a in n.args)
        self.lines: list[str] = []
        self.forms: dict[int, Form] = {}
        self.texts: dict[int, str] = {}
        self.vary: dict[int, bool] = {}

    # -- statements
    def bind(self, text: str, ctype: str = "float") -> str:
        """A `const` statement for text (a plain name or literal stays as it is)."""
        if text.isidentifier() or _is_literal(text):
            return text
        var = f"t{len(self.lines)}"
        self.lines.append(f"  const {ctype} {var} = {_unwrap(text)};")
        return var

    def materialize(self, f: Form) -> str:
        """The C++ text of f: a chain of one FFMA per varying term (FMUL / FADD for a first
        term without an additive part, or a factor of +-1)."""
        out = None if f.a is None else _text(f.a)
        for m, v in f.terms:
            if out is None:
                out = v if m == 1.0 else f"(-{v})" if m == -1.0 else f"({v} * {_text(m)})"
            elif m == 1.0 or m == -1.0:
                out = f"({out} {'+' if m == 1.0 else '-'} {v})"
            else:
                out = f"fmaf({_text(m)}, {_unwrap(v)}, {_unwrap(out)})"
        assert out is not None, "a form has an additive part or a term"
        return out

    # -- walking
    def form(self, root: Expr) -> Form:
        """root's Form, every node under it lowered first (statements in self.lines)."""
        for n in postorder(root):
            if id(n) in self.vary:
                continue  # lowered already, under an earlier root
            self.vary[id(n)] = (n.op == "input" and n.value in _VARYING) or any(
                self.vary[id(a)] for a in n.args
            )
            if n.dtype is DType.FLOAT:
                self.forms[id(n)] = self._shared(n, self._float(n))
            else:
                self.texts[id(n)] = self._shared_text(n, self._other(n))
        return self.forms[id(root)]

    def _shared(self, n: Expr, f: Form) -> Form:
        """f, with its parts bound to statements when n is used more than once."""
        if self.uses[id(n)] < 2 or n.op in ("const", "input", "scalar"):
            return f
        a = f.a if f.a is None or isinstance(f.a, float) else self.bind(f.a)
        terms = tuple(
            (m if isinstance(m, float) else self.bind(m), self.bind(v)) for m, v in f.terms
        )
        return Form(a, terms)

    def _shared_text(self, n: Expr, text: str) -> str:
        if self.uses[id(n)] < 2 or n.op in ("const", "input", "scalar"):
            return text
        return self.bind(text, "bool" if n.dtype is DType.BOOL else "int")

    def _arg_text(self, a: Expr) -> str:
        if a.dtype is DType.FLOAT:
            return self.materialize(self.forms[id(a)])
        return self.texts[id(a)]

    def _other(self, n: Expr) -> str:
        """An int or bool node's C++ text (the precise emitter's; kv_idx is kv_idx)."""
        return _render(n, [self._arg_text(a) for a in n.args], "precise")

    def _float(self, n: Expr) -> Form:
        """A float node's affine form (rewrites 1 and 2 of the module doc)."""
        op = n.op
        if op == "const":
            return Form(float(n.value))
        if op == "input":  # the score
            return Form(None, (("s_scale", "s"),))
        if not self.vary[id(n)]:  # computed once: the precise emitter's C++
            return Form(_render(n, [self._arg_text(a) for a in n.args], "precise"))
        if op == "to_float":
            return self._from_int(n.args[0])
        f = [self.forms[id(a)] for a in n.args if a.dtype is DType.FLOAT]
        if op == "neg":
            return _scale(f[0], -1.0)
        if op in ("add", "sub"):
            return _sum(f[0], f[1] if op == "add" else _scale(f[1], -1.0))
        if op == "mul" and (f[0].invariant or f[1].invariant):
            inv, var = (f[0], f[1]) if f[0].invariant else (f[1], f[0])
            assert inv.a is not None
            return _scale(var, inv.a)
        if op == "div" and f[1].invariant:
            assert f[1].a is not None
            return _scale(f[0], _rcp(f[1].a))
        if op == "tanh":
            arg = self.materialize(_scale(f[0], 2.0 * LOG2E))
            r = f"fg_sfu_rcp(fg_sfu_ex2({_unwrap(arg)}) + 1.0f)"
            return Form(1.0, ((-2.0, r),))
        return Form(None, ((1.0, _render(n, [self._arg_text(a) for a in n.args], "precise")),))

    def _from_int(self, e: Expr) -> Form:
        """to_float(e) for an int e (rewrite 3 of the module doc)."""
        if not self.vary[id(e)]:
            return Form(f"(float){self.texts[id(e)]}")
        if e.op == "neg":
            return _scale(self._from_int(e.args[0]), -1.0)
        if e.op in ("abs", "min", "max"):
            fn = {"abs": "fabsf", "min": "fminf", "max": "fmaxf"}[e.op]
            parts = [_unwrap(self.materialize(self._from_int(a))) for a in e.args]
            return Form(None, ((1.0, f"{fn}({', '.join(parts)})"),))
        split = self._index_split(e)
        if split is None:
            return Form(None, ((1.0, f"(float){self.texts[id(e)]}"),))
        rest, offsets = split
        return Form(f"(float){rest}", ((1.0, f"(float){offsets}"),))

    def _index_split(self, e: Expr) -> tuple[str, str] | None:
        """e = rest + offsets, as C++: `rest` e with q_idx -> q_base and kv_idx -> kv_base (one
        value per row and tile), `offsets` the +-q_off +-kv_off left (a constant once unrolled);
        when e is a sum of terms whose only varying one is +-kv_idx, else None. q_idx splits
        only when it is one term of the sum (else it stays in `rest`, as itself)."""
        terms: list[tuple[int, Expr]] = []
        stack = [(1, e)]
        while stack:
            sign, x = stack.pop()
            if x.op in ("add", "sub"):
                stack.append((sign if x.op == "add" else -sign, x.args[1]))
                stack.append((sign, x.args[0]))
            elif x.op == "neg":
                stack.append((-sign, x.args[0]))
            else:
                terms.append((sign, x))
        kv = [(s, x) for s, x in terms if self.vary[id(x)]]
        if len(kv) != 1 or not _is_input(kv[0][1], "kv_idx"):
            return None
        split_q = sum(_is_input(x, "q_idx") for _, x in terms) == 1
        based = {"kv_idx": "kv_base", **({"q_idx": "q_base"} if split_q else {})}
        offset = {"kv_idx": "kv_off", "q_idx": "q_off"}

        def name(x: Expr) -> str | None:  # the input x splits into based[name] + offset[name]
            return x.value if x.op == "input" and x.value in based else None

        parts = [(s, based[n] if (n := name(x)) else self.texts[id(x)]) for s, x in terms]
        rest = _signed_sum(parts)
        offsets = [(s, offset[n]) for s, x in terms if (n := name(x))]
        return f"({rest})", f"({_signed_sum(offsets)})"


def _is_input(x: Expr, name: str) -> bool:
    return x.op == "input" and x.value == name


def _signed_sum(terms: list[tuple[int, str]]) -> str:
    """C++ of +-t0 +- t1 ..., in order."""
    text = ""
    for sign, t in terms:
        if text:
            text += (" + " if sign > 0 else " - ") + t
        else:
            text = t if sign > 0 else f"-{t}"
    return text


def _is_literal(text: str) -> bool:
    try:
        float(text.rstrip("f").strip("()"))
    except ValueError:
        return False
    return True


__all__ = [
    "LOGIT_HELPERS",
    "PARAMS",
    "TANH_SFU_ERROR",
    "Form",
    "emit_logit",
    "emit_logit_grad",
    "logit_grad_signature",
    "logit_helpers",
    "logit_signature",
    "sfu_nodes",
]
