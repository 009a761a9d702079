"""C++ for a hook: readable inline functions a kernel template calls per score element.

For a score_mod hook named N (default `score_mod_<digest>`) three functions are emitted:

    float N(float score, int b, int h, int q_idx, int kv_idx, int q_len, int kv_len, AUX...)
    float N_grad(<the same parameters>)                  // d N / d score
    float N_value_grad(<the same parameters>, float& dscore)  // both, sharing their work

and for a mask_mod hook `bool N(int b, int h, int q_idx, int kv_idx, int q_len, int kv_len,
AUX...)`, true for a key the query keeps. Every input is always a parameter, in this order,
used or not, so a template calls every hook the same way. `score` is the scaled score in
natural-log units (scale * q.k); the result is too (the kernels multiply by log2(e) after).
`q_len`, `kv_len` are Tq and Tk. AUX are the aux declarations in order: a rank-0 aux is
`float name` / `int name` by value; rank 1 is `const float* __restrict__ name` (or `const int*`);
rank 2 is that pointer then `int name_stride`, its row stride in elements (element [i, j] is
`name[(long long)i * name_stride + j]`). Aux reads are unchecked: call a hook only for rows and
keys inside the problem (q_idx < q_len, kv_idx < kv_len), or pass clamped indices.

The body has one `const` statement per shared subexpression (`t0`, `t1`, ...; also one for an
expression too long to read inline); everything else is inlined, fully parenthesized. Float math
is fp32 and int math int32. Math functions: `math="precise"` (the default) emits libdevice's
`expf`, `logf`, `tanhf` (within 2 ulp); `math="fast"` emits `fg_fast_exp` / `fg_fast_log`
(`__expf`/`__logf` on the SFU) and `fg_fast_tanh` (`tanh.approx.f32`), for 16-bit kernels whose
error budget allows it, as the softcap's 16-bit path does in templates/_common.cuh.j2 (on the
host these fall back to the precise functions). minimum/maximum of floats are fminf/fmaxf.

Helpers (`fg_floordiv`, `fg_mod`: Python's floor semantics; int min/max/abs; the fast math
functions) come once per translation unit from `helpers()`, behind an include guard; they are
`__host__ __device__`, as is any hook emitted with `qualifiers=HOST_DEVICE`, so the same code
can be run on the CPU against the oracle.

For a mask_mod, `emit_tile_class` also writes its verdict on a whole tile (hooks/tiles.py):

    int N_tile(int b, int h, int q_lo, int q_hi, int kv_lo, int kv_hi, int q_len, int kv_len,
               AUX...)

FG_TILE_NONE when the mask drops every key of rows q_lo..q_hi x keys kv_lo..kv_hi (inclusive),
FG_TILE_ALL when it keeps every one, FG_TILE_SOME otherwise or when it cannot tell: interval
arithmetic, one statement per node, on helpers from `tile_helpers()` (once per translation unit).
For each summarized table (tiles.summarized_aux: a rank-1 int32 aux read at a range of
indices) the verdict takes two more parameters after AUX, `const int* __restrict__ fg_sum_NAME,
int fg_n_NAME`: the table's range summary (hooks/summary.py; NULL: none, the read is unknown)
and its length, read by `fg_ir_load_summary` from `summary_helpers()`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal

from flashgen.generator.hooks.aux import Aux
from flashgen.generator.hooks.expr import INPUTS, INT32_MIN, DType, Expr, postorder, to_text
from flashgen.generator.hooks.hook import Hook
from flashgen.generator.hooks.summary import CHUNK
from flashgen.generator.hooks.tiles import summarized_aux, tracked

DEVICE = "__device__ __forceinline__"
"""The default qualifiers: what the kernel templates' own helpers use."""
HOST_DEVICE = "__host__ __device__ __forceinline__"
"""Qualifiers for a hook also compiled for the host (tests run it against the oracle)."""
Math = Literal["precise", "fast"]
INLINE_LIMIT = 72  # an inline expression longer than this gets a statement of its own

_CTYPE = {DType.FLOAT: "float", DType.INT: "int", DType.BOOL: "bool"}
_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
    "and": "&&",
    "or": "||",
}
_MATH = {
    "precise": {"exp": "expf", "log": "logf", "tanh": "tanhf"},
    "fast": {"exp": "fg_fast_exp", "log": "fg_fast_log", "tanh": "fg_fast_tanh"},
}

HELPERS = r"""#ifndef FLASHGEN_HOOK_HELPERS
#define FLASHGEN_HOOK_HELPERS
// Helpers of flashgen's score_mod / mask_mod functions.
// Python's floor division and modulo on int32 (C++'s / and % truncate toward zero):
// -7 // 2 == -4 and -7 % 2 == 1. A zero divisor is undefined, as for / and %.
__host__ __device__ __forceinline__ int fg_floordiv(int a, int b) {
  const int q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__host__ __device__ __forceinline__ int fg_mod(int a, int b) {
  const int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__host__ __device__ __forceinline__ int fg_imin(int a, int b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int fg_imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ __forceinline__ int fg_iabs(int a) { return a < 0 ? -a : a; }
// math="fast": the SFU's approximations on the device, the precise functions on the host
__host__ __device__ __forceinline__ float fg_fast_exp(float x) {
#ifdef __CUDA_ARCH__
  return __expf(x);
#else
  return expf(x);
#endif
}
__host__ __device__ __forceinline__ float fg_fast_log(float x) {
#ifdef __CUDA_ARCH__
  return __logf(x);
#else
  return logf(x);
#endif
}
__host__ __device__ __forceinline__ float fg_fast_tanh(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return tanhf(x);
#endif
}
#endif  // FLASHGEN_HOOK_HELPERS
"""


def helpers() -> str:
    """The helper functions every hook's code may call (once per translation unit; guarded)."""
    return HELPERS


def parameters(hook: Hook) -> list[tuple[str, str]]:
    """The generated functions' parameters as (C type, name), in order (see the module doc)."""
    names = [n for n in INPUTS if hook.kind == "score_mod" or n != "score"]
    out = [(_CTYPE[INPUTS[n]], n) for n in names]
    for a in hook.aux:
        out += aux_parameters(a)
    return out


def aux_parameters(a: Aux) -> list[tuple[str, str]]:
    """One aux declaration's parameters: a scalar by value, or the pointer (and row stride)."""
    if a.ndim == 0:
        return [(a.ctype, a.name)]
    pointer = [(f"const {a.ctype}* __restrict__", a.name)]
    return pointer + ([("int", f"{a.name}_stride")] if a.ndim == 2 else [])


def signature(hook: Hook, name: str, qualifiers: str = DEVICE, *, grad_out: bool = False) -> str:
    """`qualifiers ret name(params)`: the declaration of a generated function."""
    params = [f"{t} {n}" for t, n in parameters(hook)]
    if grad_out:
        params.append("float& dscore")
    ret = "float" if hook.kind == "score_mod" else "bool"
    return f"{qualifiers} {ret} {name}({', '.join(params)})"


def default_name(hook: Hook) -> str:
    """`score_mod_<digest>` / `mask_mod_<digest>`: a name unique to the hook's identity."""
    return f"{hook.kind}_{hook.digest}"


def emit_hook(
    hook: Hook, name: str | None = None, qualifiers: str = DEVICE, math: Math = "precise"
) -> str:
    """The C++ functions of one hook (a score_mod's value, derivative and both; a mask_mod's
    one), preceded by a comment naming the hook and its expression. Needs `helpers()` first."""
    name = name or default_name(hook)
    what = f"// {hook.kind} {hook.name or '?'} (hook {hook.digest}): {to_text(hook.expr)}\n"
    if hook.kind == "mask_mod":
        return what + _function(signature(hook, name, qualifiers), [hook.expr], math)
    grad = hook.grad
    parts = [
        _function(signature(hook, name, qualifiers), [hook.expr], math),
        f"// d {name} / d score: {to_text(grad)}\n"
        + _function(signature(hook, f"{name}_grad", qualifiers), [grad], math),
        f"// {name} and its derivative (into dscore) at once\n"
        + _function(
            signature(hook, f"{name}_value_grad", qualifiers, grad_out=True),
            [hook.expr, grad],
            math,
        ),
    ]
    return what + "\n".join(parts)


def emit_source(*hooks: Hook, qualifiers: str = DEVICE, math: Math = "precise") -> str:
    """The helpers and every hook's functions (default names): a self-contained block."""
    return "\n".join([helpers(), *(emit_hook(h, None, qualifiers, math) for h in hooks)])


# ---- the body ------------------------------------------------------------------------------


def _function(decl: str, roots: list[Expr], math: Math) -> str:
    """A function body returning roots[0] (and, with two roots, writing roots[1] to dscore)."""
    nodes = postorder(*roots)
    uses: Counter[int] = Counter(id(r) for r in roots)
    for n in nodes:
        uses.update(id(a) for a in n.args)
    text: dict[int, str] = {}
    lines: list[str] = []
    for n in nodes:
        inline = _render(n, [text[id(a)] for a in n.args], math)
        leaf = n.op in ("const", "input", "scalar")
        # a root used once is returned as it stands, however long
        long = len(inline) > INLINE_LIMIT and not any(n is r for r in roots)
        if not leaf and (uses[id(n)] > 1 or long):
            var = f"t{len(lines)}"
            lines.append(f"  const {_CTYPE[n.dtype]} {var} = {_unwrap(inline)};")
            text[id(n)] = var
        else:
            text[id(n)] = inline
    if len(roots) == 2:
        lines.append(f"  dscore = {_unwrap(text[id(roots[1])])};")
    lines.append(f"  return {_unwrap(text[id(roots[0])])};")
    return decl + " {\n" + "\n".join(lines) + "\n}\n"


def _unwrap(text: str) -> str:
    """`text` without one pair of outer parentheses, when they enclose all of it."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(text) - 1:
            return text  # "(a) + (b)": the first pair closes early
    return text[1:-1]


def _render(n: Expr, args: list[str], math: Math) -> str:
    """n's C++ text given its operands' texts; compound forms come parenthesized."""
    op = n.op
    if op == "const":
        return _literal(n.value, n.dtype)
    if op == "input":
        return str(n.value)
    if op == "scalar":
        return str(n.value.name)
    if op == "load":
        a: Aux = n.value
        if a.ndim == 1:
            return f"{a.name}[{_unwrap(args[0])}]"
        # 64-bit offset: i * stride may pass 2^31 in a large table
        return f"{a.name}[(long long){args[0]} * {a.name}_stride + {args[1]}]"
    if op in _INFIX:
        return f"({args[0]} {_INFIX[op]} {args[1]})"
    if op == "neg":
        return f"(-{args[0]})"
    if op == "not":
        return f"(!{args[0]})"
    if op == "to_float":
        return f"(float){args[0]}"
    if op == "where":
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if op in ("floordiv", "mod"):
        return f"fg_{op}({_unwrap(args[0])}, {_unwrap(args[1])})"
    if op in ("min", "max", "abs"):
        fn = {"min": "fminf", "max": "fmaxf", "abs": "fabsf"}[op]
        if n.dtype is DType.INT:
            fn = {"min": "fg_imin", "max": "fg_imax", "abs": "fg_iabs"}[op]
        return f"{fn}({', '.join(_unwrap(x) for x in args)})"
    if op in ("exp", "log", "tanh"):
        return f"{_MATH[math][op]}({_unwrap(args[0])})"
    raise AssertionError(f"no C++ for {op}")


def _literal(v: bool | int | float, dtype: DType) -> str:
    if dtype is DType.BOOL:
        return "true" if v else "false"
    if dtype is DType.INT:
        if v == INT32_MIN:
            return "(-2147483647 - 1)"  # 2147483648 alone is not an int literal
        return f"({v})" if v < 0 else str(v)
    f = float(v)
    if f != f:
        return "NAN"
    if f in (float("inf"), float("-inf")):
        return "INFINITY" if f > 0 else "(-INFINITY)"
    text = repr(f) + "f"  # shortest round-trip decimal; the compiler rounds it to fp32
    return f"({text})" if f < 0 or text.startswith("-") else text


# ---- a mask_mod's verdict on a tile (hooks/tiles.py: the rules and why they are sound) -----------

TILE_HELPERS = r"""#ifndef FLASHGEN_HOOK_TILE_HELPERS
#define FLASHGEN_HOOK_TILE_HELPERS
// Interval arithmetic for a mask_mod over a tile of rows x keys (flashgen/generator/hooks/
// tiles.py has the same rules in Python, tested against every element of random tiles).
// An int expression's values over the tile lie in [lo, hi]: 64-bit, so no bound overflows,
// and each bound clamped into int32 after every operation (a hook's ints stay in int32).
#define FG_TILE_FN __host__ __device__ __forceinline__
struct fg_irange {
  long long lo, hi;
};
// A bool's truth set over the tile: only false, only true, either. A mask's truth set is the
// tile's class: every key dropped (NONE), every key kept (ALL), some of each or unknown (SOME).
constexpr int FG_FALSE = 1, FG_TRUE = 2, FG_EITHER = 3;
constexpr int FG_TILE_NONE = FG_FALSE, FG_TILE_ALL = FG_TRUE, FG_TILE_SOME = FG_EITHER;
constexpr long long FG_I32_MIN = -2147483648LL, FG_I32_MAX = 2147483647LL;
FG_TILE_FN long long fg_ll_min(long long a, long long b) { return a < b ? a : b; }
FG_TILE_FN long long fg_ll_max(long long a, long long b) { return a > b ? a : b; }
FG_TILE_FN fg_irange fg_ir_full() { return fg_irange{FG_I32_MIN, FG_I32_MAX}; }
FG_TILE_FN fg_irange fg_ir_point(long long v) { return fg_irange{v, v}; }
FG_TILE_FN long long fg_ll_clamp32(long long v) {
  return fg_ll_min(fg_ll_max(v, FG_I32_MIN), FG_I32_MAX);
}
FG_TILE_FN fg_irange fg_ir_clip(long long lo, long long hi) {
  return fg_irange{fg_ll_clamp32(lo), fg_ll_clamp32(hi)};
}
FG_TILE_FN fg_irange fg_ir_add(fg_irange a, fg_irange b) {
  return fg_ir_clip(a.lo + b.lo, a.hi + b.hi);
}
FG_TILE_FN fg_irange fg_ir_sub(fg_irange a, fg_irange b) {
  return fg_ir_clip(a.lo - b.hi, a.hi - b.lo);
}
FG_TILE_FN fg_irange fg_ir_neg(fg_irange a) { return fg_ir_clip(-a.hi, -a.lo); }
FG_TILE_FN fg_irange fg_ir_mul(fg_irange a, fg_irange b) {
  const long long p0 = a.lo * b.lo, p1 = a.lo * b.hi, p2 = a.hi * b.lo, p3 = a.hi * b.hi;
  return fg_ir_clip(fg_ll_min(fg_ll_min(p0, p1), fg_ll_min(p2, p3)),
                    fg_ll_max(fg_ll_max(p0, p1), fg_ll_max(p2, p3)));
}
FG_TILE_FN fg_irange fg_ir_abs(fg_irange a) {
  if (a.lo >= 0) return a;
  if (a.hi <= 0) return fg_ir_neg(a);
  return fg_irange{0, fg_ll_max(-a.lo, a.hi)};
}
FG_TILE_FN fg_irange fg_ir_min(fg_irange a, fg_irange b) {
  return fg_irange{fg_ll_min(a.lo, b.lo), fg_ll_min(a.hi, b.hi)};
}
FG_TILE_FN fg_irange fg_ir_max(fg_irange a, fg_irange b) {
  return fg_irange{fg_ll_max(a.lo, b.lo), fg_ll_max(a.hi, b.hi)};
}
// Python's floor division of 64-bit values (bounds of int32 values: no overflow)
FG_TILE_FN long long fg_ll_floordiv(long long a, long long b) {
  const long long q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
// x // c for a constant c != 0 is monotone in x; any other divisor: unknown
FG_TILE_FN fg_irange fg_ir_floordiv(fg_irange a, fg_irange d) {
  if (d.lo != d.hi || d.lo == 0) return fg_ir_full();
  const long long x = fg_ll_floordiv(a.lo, d.lo), y = fg_ll_floordiv(a.hi, d.lo);
  return fg_ir_clip(fg_ll_min(x, y), fg_ll_max(x, y));
}
// x % c for a constant c != 0 rises with x inside one period of c; across periods any residue
FG_TILE_FN fg_irange fg_ir_mod(fg_irange a, fg_irange d) {
  const long long c = d.lo;
  if (d.lo != d.hi || c == 0) return fg_ir_full();
  const long long qa = fg_ll_floordiv(a.lo, c), qb = fg_ll_floordiv(a.hi, c);
  if (qa == qb) return fg_irange{a.lo - qa * c, a.hi - qb * c};
  return c > 0 ? fg_irange{0, c - 1} : fg_irange{c + 1, 0};
}
// an int32 table element: known when its index is one value over the whole tile
FG_TILE_FN fg_irange fg_ir_load(const int* __restrict__ t, fg_irange i) {
  return i.lo == i.hi ? fg_ir_point(t[i.lo]) : fg_ir_full();
}
FG_TILE_FN fg_irange fg_ir_load(const int* __restrict__ t, int stride, fg_irange i,
                                fg_irange j) {
  return i.lo == i.hi && j.lo == j.hi ? fg_ir_point(t[i.lo * stride + j.lo]) : fg_ir_full();
}
FG_TILE_FN fg_irange fg_ir_where(int c, fg_irange a, fg_irange b) {
  if (c == FG_TRUE) return a;
  if (c == FG_FALSE) return b;
  return fg_irange{fg_ll_min(a.lo, b.lo), fg_ll_max(a.hi, b.hi)};
}
// comparisons: true if some pair of values satisfies it, false if some pair does not
FG_TILE_FN int fg_ir_lt(fg_irange a, fg_irange b) {
  return (a.lo < b.hi ? FG_TRUE : 0) | (a.hi >= b.lo ? FG_FALSE : 0);
}
FG_TILE_FN int fg_ir_le(fg_irange a, fg_irange b) {
  return (a.lo <= b.hi ? FG_TRUE : 0) | (a.hi > b.lo ? FG_FALSE : 0);
}
FG_TILE_FN int fg_ir_eq(fg_irange a, fg_irange b) {
  const bool overlap = a.lo <= b.hi && b.lo <= a.hi;
  const bool one_value = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  return (overlap ? FG_TRUE : 0) | (one_value ? 0 : FG_FALSE);
}
// three-valued logic on truth sets
FG_TILE_FN int fg_not(int t) { return ((t & FG_FALSE) << 1) | ((t & FG_TRUE) >> 1); }
FG_TILE_FN int fg_and(int a, int b) { return ((a | b) & FG_FALSE) | (a & b & FG_TRUE); }
FG_TILE_FN int fg_or(int a, int b) { return ((a | b) & FG_TRUE) | (a & b & FG_FALSE); }
FG_TILE_FN int fg_truth_eq(int a, int b) {
  return ((a & b) ? FG_TRUE : 0) | ((a & fg_not(b)) ? FG_FALSE : 0);
}
FG_TILE_FN int fg_truth_where(int c, int a, int b) {
  return c == FG_TRUE ? a : c == FG_FALSE ? b : (a | b);
}
#undef FG_TILE_FN
#endif  // FLASHGEN_HOOK_TILE_HELPERS
"""

SUMMARY_HELPERS = (
    r"""#ifndef FLASHGEN_HOOK_SUMMARY_HELPERS
#define FLASHGEN_HOOK_SUMMARY_HELPERS
// A rank-1 int32 table read at a range of indices, bounded by its range summary (flashgen/
// generator/hooks/summary.py): for chunk i of FG_SUMMARY_CHUNK elements and level k, the min
// (s[(2k) nc + i]) and max (s[(2k + 1) nc + i]) over chunks i .. i + 2^k - 1, nc chunks. The
// index range is clipped to the table, [0, n - 1]: sound, as a hook reads only indices inside
// its tables (its contract); then chunks a..b are two level-k runs, 2^k <= b - a + 1.
#define FG_TILE_FN __host__ __device__ __forceinline__
constexpr int FG_SUMMARY_CHUNK = """
    + str(CHUNK)
    + r""";
FG_TILE_FN int fg_floor_log2(int x) {  // x >= 1
#ifdef __CUDA_ARCH__
  return 31 - __clz(x);
#else
  return 31 - __builtin_clz((unsigned)x);
#endif
}
// Not inlined: a verdict runs once per key tile or run of tiles, and inlined twice per verdict
// into wgmma's consumer loop (d 128: O, S and P live there) its loads and 64-bit index math
// made ptxas 13.0 spill 20-28 B; as a call it spills nothing.
__host__ __device__ __noinline__ fg_irange fg_ir_load_summary(const int* __restrict__ t,
                                                              const int* __restrict__ s, int n,
                                                              fg_irange i) {
  if (i.lo == i.hi) return fg_ir_point(t[i.lo]);
  if (s == nullptr) return fg_ir_full();  // no summary passed: unknown, as without one
  const long long lo = fg_ll_max(i.lo, 0), hi = fg_ll_min(i.hi, (long long)n - 1);
  if (lo > hi) return fg_ir_full();  // no index inside the table: the contract is broken
  const int a = (int)(lo / FG_SUMMARY_CHUNK), b = (int)(hi / FG_SUMMARY_CHUNK);
  const int nc = (n - 1) / FG_SUMMARY_CHUNK + 1;
  const int k = fg_floor_log2(b - a + 1), j = b - (1 << k) + 1;
  const int* __restrict__ lv = s + 2LL * k * nc;
  return fg_irange{fg_ll_min(lv[a], lv[j]), fg_ll_max(lv[nc + a], lv[nc + j])};
}
#undef FG_TILE_FN
#endif  // FLASHGEN_HOOK_SUMMARY_HELPERS
"""
)

TILE_INPUTS = ("b", "h", "q_lo", "q_hi", "kv_lo", "kv_hi", "q_len", "kv_len")
"""The fixed parameters of a tile verdict, in order (all int), before the hook's AUX."""
_TILE_CALL = {
    "add": "fg_ir_add",
    "sub": "fg_ir_sub",
    "mul": "fg_ir_mul",
    "neg": "fg_ir_neg",
    "abs": "fg_ir_abs",
    "min": "fg_ir_min",
    "max": "fg_ir_max",
    "floordiv": "fg_ir_floordiv",
    "mod": "fg_ir_mod",
    "lt": "fg_ir_lt",
    "le": "fg_ir_le",
    "eq": "fg_ir_eq",
    "not": "fg_not",
    "and": "fg_and",
    "or": "fg_or",
}
TILE_COMMENT_LIMIT = 72


def tile_helpers() -> str:
    """The interval helpers every tile verdict calls (once per translation unit; guarded)."""
    return TILE_HELPERS


def summary_helpers() -> str:
    """The range-summary reader of verdicts with summarized tables (once per translation unit,
    after `tile_helpers()`; guarded)."""
    return SUMMARY_HELPERS


def summary_parameters(a: Aux) -> list[tuple[str, str]]:
    """The verdict's parameters for table `a`'s range summary: its pointer and the length."""
    return [("const int* __restrict__", f"fg_sum_{a.name}"), ("int", f"fg_n_{a.name}")]


def tile_signature(
    hook: Hook, name: str, qualifiers: str = DEVICE, summarized: Sequence[Aux] = ()
) -> str:
    """`qualifiers int name(b, h, q_lo, q_hi, kv_lo, kv_hi, q_len, kv_len, AUX..., SUMMARIES...)`
    (SUMMARIES: `summary_parameters` of each table in `summarized`, in order)."""
    params = [f"int {n}" for n in TILE_INPUTS]
    params += [f"{t} {n}" for a in hook.aux for t, n in aux_parameters(a)]
    params += [f"{t} {n}" for a in summarized for t, n in summary_parameters(a)]
    return f"{qualifiers} int {name}({', '.join(params)})"


def emit_tile_class(
    hook: Hook,
    name: str | None = None,
    qualifiers: str = DEVICE,
    summarized: Sequence[Aux] | None = None,
) -> str:
    """A mask_mod's verdict on a tile as a C++ function (default name `<default_name>_tile`):
    FG_TILE_NONE / FG_TILE_ALL only when the mask drops / keeps every element of the tile,
    else FG_TILE_SOME. `summarized`: the tables whose range summaries it takes (default: all
    of `tiles.summarized_aux(hook)`; each must be one of those). Needs `tile_helpers()` first,
    and `summary_helpers()` when it takes any summary."""
    if hook.kind != "mask_mod":
        raise ValueError(f"{hook.kind} {hook.name or '?'}: only a mask_mod has a tile verdict")
    name = name or f"{default_name(hook)}_tile"
    candidates = summarized_aux(hook)
    summarized = candidates if summarized is None else tuple(summarized)
    if not set(summarized) <= set(candidates):
        raise ValueError(
            f"summarized={[a.name for a in summarized]}: {hook.name or 'the mask'} reads "
            f"{[a.name for a in candidates] or 'no table'} at a range of indices; summaries "
            "are only of those (tiles.summarized_aux)"
        )
    names = {a.name for a in summarized}
    text: dict[int, str] = {}
    lines: list[str] = []
    for n in tracked(hook.expr):
        call = _tile_render(n, [text.get(id(a), "") for a in n.args], names)
        if n.op in ("const", "input", "scalar"):
            text[id(n)] = call
            continue
        var = f"t{len(lines)}"
        ctype = "int" if n.dtype is DType.BOOL else "fg_irange"
        lines.append(f"  const {ctype} {var} = {call};  // {to_text(n, TILE_COMMENT_LIMIT)}")
        text[id(n)] = var
    lines.append(f"  return {text[id(hook.expr)]};")
    what = (
        f"// mask_mod {hook.name or '?'} (hook {hook.digest}) over rows q_lo..q_hi x keys "
        "kv_lo..kv_hi (inclusive):\n// FG_TILE_NONE only if it drops every key there, "
        "FG_TILE_ALL only if it keeps every one,\n// else FG_TILE_SOME (interval arithmetic, "
        "flashgen/generator/hooks/tiles.py)\n"
    )
    decl = tile_signature(hook, name, qualifiers, summarized)
    return what + decl + " {\n" + "\n".join(lines) + "\n}\n"


def _tile_render(n: Expr, args: list[str], summarized: set[str]) -> str:
    """The C++ of node n's range (an int) or truth set (a bool), given its operands'."""
    op = n.op
    if op == "const":
        if n.dtype is DType.BOOL:
            return "FG_TRUE" if n.value else "FG_FALSE"
        return f"fg_ir_point({_literal(n.value, n.dtype)})"
    if op == "input":
        if n.value in ("q_idx", "kv_idx"):
            side = n.value[:-4]
            return f"fg_irange{{{side}_lo, {side}_hi}}"
        return f"fg_ir_point({n.value})"
    if op == "scalar":
        return f"fg_ir_point({n.value.name})"
    if op == "load":
        a: Aux = n.value
        if a.name in summarized:
            return f"fg_ir_load_summary({a.name}, fg_sum_{a.name}, fg_n_{a.name}, {args[0]})"
        stride = [f"{a.name}_stride"] if a.ndim == 2 else []
        return f"fg_ir_load({', '.join([a.name, *stride, *args])})"
    if op in ("lt", "le", "gt", "ge", "eq", "ne") and n.args[0].dtype is DType.FLOAT:
        return "FG_EITHER"  # floats are not bounded
    if op in ("eq", "ne") and n.args[0].dtype is DType.BOOL:
        same = f"fg_truth_eq({args[0]}, {args[1]})"
        return same if op == "eq" else f"fg_not({same})"
    if op in ("gt", "ge"):
        return f"{_TILE_CALL['lt' if op == 'gt' else 'le']}({args[1]}, {args[0]})"
    if op == "ne":
        return f"fg_not(fg_ir_eq({args[0]}, {args[1]}))"
    if op == "where":
        fn = "fg_truth_where" if n.dtype is DType.BOOL else "fg_ir_where"
        return f"{fn}({', '.join(args)})"
    return f"{_TILE_CALL[op]}({', '.join(args)})"
