"""User hooks (score_mod, mask_mod) compiled into a variant: tokens, aux ABI block, C++ calls.

A hooked variant carries its hook's identity in a feature token, `scoremod<digest>` or
`maskmod<digest>` (the hook's 12-hex-digit canonical digest, hooks/canonical.py), so the kernel
name, the cache key and `KernelSpec.from_name` treat it like any other variant. The token
names the hook; the hook's expression lives in this process's registry (`register`, which
`token_of` calls): rendering a hooked spec looks the hook up by its token and raises
`HookNotRegistered` (value, rule, fix) when it was never registered here, e.g. for a name read
back from a file in a fresh process.

Why not a `Feature` in `RUNTIME_FEATURES`: a feature's token is fixed and its arguments join
every kernel's ABI. A hook's token differs per hook, and its aux block (`HOOK_PARAMS`: four aux
pointers with a row stride each, four float and four int scalars) is appended only to the
signatures of hooked variants (forward, and all three backward kernels), so no existing kernel,
launcher or bundle changes. The block is fixed whatever the hook (one struct format for every
hooked variant); a hook's aux declarations are mapped onto its slots in order (`slots`).

Range summaries (hooks/summary.py) of the tables a mask_mod reads at a range of indices
(`tiles.summarized_aux`: `doc_ids[q_idx]`) travel in the pointer slots the aux declarations
leave free, after them (`summary_slots`): hook_ptr<j> the summary, hook_stride<j> (unused by a
1-D table otherwise) the table's length. So the block, and every kernel's ABI, stay as they
were; which summaries a variant takes follows from its hooks' expressions (their tokens). A
table that finds no free slot has no summary (its tile verdicts stay element-wise). Family
wgmma's forward reads them in its tile verdicts; every other kernel ignores the slots; a NULL
summary means none (the verdict is then as without one). The block's last pointer slot, when
the declarations and summaries leave it free, carries a block map (`map_slot`; the verdicts
made before the launch, runtime/block_map.py), read by family wgmma's kernels; NULL: none.

The same module holds the hook's value for the oracle (`HookCall`: the hook and its aux arrays
by name; its float64 logits, kept keys and error terms) and for the launcher (`HookArgs`: the
aux device pointers and scalars as kernel arguments).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from flashgen.generator.features.base import U32
from flashgen.generator.hooks import Aux, DType, Hook
from flashgen.generator.hooks.cuda import (
    emit_hook,
    emit_tile_class,
    helpers,
    summary_helpers,
    tile_helpers,
)
from flashgen.generator.hooks.expr import Expr, const, node, postorder, rebuild
from flashgen.generator.hooks.fold import (
    TANH_SFU_ERROR,
    emit_logit,
    emit_logit_grad,
    logit_helpers,
    sfu_nodes,
)
from flashgen.generator.hooks.hook import live_hook
from flashgen.generator.hooks.numpy_eval import evaluate_many
from flashgen.generator.hooks.tiles import summarized_aux
from flashgen.generator.param import Param

# ---- tokens and the registry ------------------------------------------------------------------

KIND_TOKENS = {"score_mod": "scoremod", "mask_mod": "maskmod"}
"""A hook kind's token prefix; the family lists the prefixes it takes in `Family.features`."""
_TOKEN = re.compile(r"(scoremod|maskmod)([0-9a-f]{12})")
_REGISTRY: dict[str, Hook] = {}


class HookNotRegistered(LookupError):
    """A hooked spec was rendered in a process that never registered its hook."""


def token_of(hook: Hook) -> str:
    """The feature token of `hook` (`scoremod<digest>`), registering the hook in this process
    so that specs carrying the token can be rendered."""
    token = f"{KIND_TOKENS[hook.kind]}{hook.digest}"
    _REGISTRY[token] = hook
    return token


def register(hook: Hook) -> str:
    """Make `hook` renderable in this process; returns its token (same as `token_of`)."""
    return token_of(hook)


def is_hook_token(token: object) -> bool:
    """Whether `token` is a hook token (`scoremod` or `maskmod` then 12 hex digits)."""
    return isinstance(token, str) and _TOKEN.fullmatch(token) is not None


def token_kind(token: str) -> str:
    """The family-support key of a hook token: `scoremod` or `maskmod`."""
    m = _TOKEN.fullmatch(token)
    if m is None:
        raise ValueError(f"{token!r} is not a hook token (scoremod<12 hex> or maskmod<12 hex>)")
    return m[1]


def hook_of(token: str) -> Hook:
    """The registered hook of `token`; HookNotRegistered (with the fix) when there is none."""
    hook = _REGISTRY.get(token)
    m = _TOKEN.fullmatch(token)
    if hook is None and m is not None:  # made (traced) here, its token built elsewhere
        hook = live_hook("score_mod" if m[1] == "scoremod" else "mask_mod", m[2])
        if hook is not None:
            _REGISTRY[token] = hook
    if hook is None:
        raise HookNotRegistered(
            f"feature {token}: no hook with digest {token[-12:]} is registered in this process "
            "(a kernel name carries the hook's digest, not its expression); trace the hook and "
            "call flashgen.generator.features.hook.register(hook) (or build the spec's token "
            "with token_of(hook)) before rendering"
        )
    return hook


def hook_tokens(features: Sequence[str]) -> tuple[str, ...]:
    """The hook tokens among a spec's features, score_mod first."""
    found = [f for f in features if is_hook_token(f)]
    return tuple(sorted(found, key=lambda t: (not t.startswith("scoremod"), t)))


def hooks_of(features: Sequence[str]) -> tuple[Hook, ...]:
    """The registered hooks of a spec's features, score_mod first."""
    return tuple(hook_of(t) for t in hook_tokens(features))


# ---- the aux ABI block ------------------------------------------------------------------------

MAX_POINTERS = 4
MAX_FLOATS = 4
MAX_INTS = 4
HOOK_PARAMS: tuple[Param, ...] = (
    *(
        Param(f"hook_ptr{i}", "const void*", "P", "feature", "HOOK: aux tensor" if i == 0 else "")
        for i in range(MAX_POINTERS)
    ),
    *(
        Param(
            f"hook_stride{i}", "int", "i", "feature", "HOOK: 2-D aux row stride" if i == 0 else ""
        )
        for i in range(MAX_POINTERS)
    ),
    *(
        Param(f"hook_f{i}", "float", "f", "feature", "HOOK: float aux scalar" if i == 0 else "")
        for i in range(MAX_FLOATS)
    ),
    *(
        Param(f"hook_i{i}", "int", "i", "feature", "HOOK: int aux scalar" if i == 0 else "")
        for i in range(MAX_INTS)
    ),
)
"""The aux block a hooked variant takes after the forward ABI: pointers (a 1-D or 2-D aux
tensor each), their row strides in elements (2-D only; 0 otherwise), float and int scalars."""


@dataclass(frozen=True)
class Slot:
    """Where one aux declaration travels: `kind` "ptr" (hook_ptr<i>, and hook_stride<i> when
    2-D), "float" (hook_f<i>) or "int" (hook_i<i>); or where a table's range summary does,
    "summary" (hook_ptr<i>, its length in hook_stride<i>; `summary_slots`)."""

    aux: Aux
    kind: str
    index: int


def slots(hooks: Sequence[Hook]) -> tuple[Slot, ...]:
    """The aux declarations of `hooks` (score_mod first) on the block's slots, in order. An aux
    name two hooks share is one value (one slot; both must declare it alike). ValueError when
    the hooks need more slots than the block has. Memoized by the hooks (a front door asks on
    every call to place that call's aux pointers)."""
    return _slots(tuple(hooks))


@functools.lru_cache(maxsize=256)
def _slots(hooks: tuple[Hook, ...]) -> tuple[Slot, ...]:
    out: list[Slot] = []
    by_name: dict[str, Slot] = {}
    count = {"ptr": 0, "float": 0, "int": 0}
    limit = {"ptr": MAX_POINTERS, "float": MAX_FLOATS, "int": MAX_INTS}
    for hook in hooks:
        for a in hook.aux:
            seen = by_name.get(a.name)
            if seen is not None:
                if seen.aux != a:
                    raise ValueError(
                        f"aux {a.name}: declared as {seen.aux.dtype}[{seen.aux.ndim}] and as "
                        f"{a.dtype}[{a.ndim}] by the variant's hooks; one name is one value, so "
                        "declare it alike or rename one"
                    )
                continue
            kind = "ptr" if a.ndim else ("float" if a.dtype == "float32" else "int")
            if count[kind] == limit[kind]:
                what = {"ptr": "aux tensors", "float": "float scalars", "int": "int scalars"}[kind]
                raise ValueError(
                    f"aux {a.name}: the hooks declare more than {limit[kind]} {what}, the most "
                    "a kernel's aux block holds; pack tables into one 2-D tensor or scalars "
                    "into a 1-D tensor"
                )
            slot = Slot(a, kind, count[kind])
            count[kind] += 1
            by_name[a.name] = slot
            out.append(slot)
    return tuple(out)


def summary_slots(hooks: Sequence[Hook]) -> tuple[Slot, ...]:
    """The range summaries the variant's tile verdicts take (kind "summary"): each table a
    mask_mod reads at a range of indices (`tiles.summarized_aux`, in first-use order) on the
    next pointer slot the aux declarations (`slots`) leave free, hook_ptr<index> holding the
    summary and hook_stride<index> the table's length; tables past the last free slot get
    none (their verdicts do without). Memoized, as `slots`."""
    return _summary_slots(tuple(hooks))


@functools.lru_cache(maxsize=256)
def _summary_slots(hooks: tuple[Hook, ...]) -> tuple[Slot, ...]:
    block = slots(hooks)
    free = MAX_POINTERS - sum(s.kind == "ptr" for s in block)
    tables = [a for h in hooks if h.kind == "mask_mod" for a in summarized_aux(h)]
    used = MAX_POINTERS - free
    return tuple(Slot(a, "summary", used + i) for i, a in enumerate(tables[:free]))


def map_slot(hooks: Sequence[Hook]) -> int | None:
    """The pointer slot of the aux block that carries a block map (runtime/block_map.py: per
    query tile, bit sets of the key tiles the mask_mod keeps any / every key of) for the
    variant's tile verdicts: the block's last pointer slot when the aux declarations and the
    range summaries (`summary_slots`) leave it free and a hook is a mask_mod; None otherwise
    (the variant then evaluates its verdicts in the kernel). A NULL map means none."""
    return _map_slot(tuple(hooks))


@functools.lru_cache(maxsize=256)
def _map_slot(hooks: tuple[Hook, ...]) -> int | None:
    if not any(h.kind == "mask_mod" for h in hooks):
        return None
    used = sum(s.kind == "ptr" for s in slots(hooks)) + len(summary_slots(hooks))
    return MAX_POINTERS - 1 if used < MAX_POINTERS else None


def reads_input(hook: Hook, name: str) -> bool:
    """Whether `hook`'s expression reads the fixed input `name` ("b", "h", "q_idx", ...)."""
    return any(n.op == "input" and n.value == name for n in postorder(hook.expr))


def summary_call_args(
    hook: Hook, summaries: Sequence[Slot], slot: Callable[[str, int], str] | None = None
) -> str:
    """The C++ arguments of `hook`'s tile verdict after its aux arguments: each summarized
    table's summary pointer and length, read from its slot (`slot` spells them as
    `call_args` does)."""
    spell = slot or (lambda kind, i: f"hook_{kind}{i}")
    parts: list[str] = []
    for s in summaries:
        if s.aux in hook.aux:
            parts += [f"static_cast<const int*>({spell('ptr', s.index)})", spell("stride", s.index)]
    return "".join(f", {p}" for p in parts)


def call_args(
    hook: Hook, block: Sequence[Slot], slot: Callable[[str, int], str] | None = None
) -> str:
    """The C++ arguments for `hook`'s aux parameters, each read from its slot of the block
    (`, static_cast<const int*>(hook_ptr0), hook_f0`): empty for a hook without aux. `slot`
    spells slot (`ptr`, `stride`, `f` or `i`, index) as C; the default is the kernel's
    parameters (`hook_ptr0`); a bundle's launcher reads a struct instead."""
    spell = slot or (lambda kind, i: f"hook_{kind}{i}")
    where = {s.aux.name: s for s in block}
    parts: list[str] = []
    for a in hook.aux:
        s = where[a.name]
        if s.kind == "ptr":
            parts.append(f"static_cast<const {a.ctype}*>({spell('ptr', s.index)})")
            if a.ndim == 2:
                parts.append(spell("stride", s.index))
        else:
            parts.append(spell(s.kind[0], s.index))
    return "".join(f", {p}" for p in parts)


def grad_is_one(hook: Hook) -> bool:
    """Whether a score_mod's derivative is the constant 1 (a bias added to the score, as
    ALiBi's): the backward then multiplies dS by nothing and keeps no factor per score."""
    grad = hook.grad
    return grad.op == "const" and grad.value == 1.0


def template_context(features: Sequence[str]) -> dict[str, Any]:
    """What a template needs for a spec's hooks: `hook_source` (helpers and the inline
    functions), and `hook_score` / `hook_mask` (None, or the function's `name` and the C++
    `aux` arguments that follow its fixed inputs; a score_mod's also `dfac`: whether the
    backward multiplies dS by its derivative, False when that is the constant 1; a mask_mod's
    also `tile`, the name of its verdict on a whole tile, and `tile_aux`, its C++ arguments
    after the fixed inputs: `aux` then the range summaries of `summary_slots`; `map`, the
    kernel parameter carrying a block map (`map_slot`) or None, and `map_b` / `map_h`,
    whether the mask reads b / h, i.e. whether the map has one part per batch / head).
    `hook_tile_source`: that verdict's C++ and its helpers (hooks/tiles.py), for templates that
    skip tiles (family wgmma's).
    `hook_logit_source`: a score_mod's lowered logit function (hooks/fold.py: invariant factors
    folded, tanh on the SFU; its name is the score call's `logit`), for 16-bit-only templates
    (family wgmma's); the oracle's error terms cover it (`HookCall.lse_terms`).
    `hook_logit_grad_source`: the same logit that also returns the derivative (its name is the
    score call's `logit_grad`; hooks/fold.py `emit_logit_grad`), for family wgmma's backward
    when `dfac`."""
    hooks = hooks_of(features)
    block = slots(hooks)
    summaries = summary_slots(hooks)
    ctx: dict[str, Any] = {
        "hook_source": "",
        "hook_score": None,
        "hook_mask": None,
        "hook_tile_source": "",
        "hook_logit_source": "",
        "hook_logit_grad_source": "",
    }
    if not hooks:
        return ctx
    parts = [helpers()]
    for h in hooks:
        name = f"{h.kind}_{h.digest}"
        parts.append(emit_hook(h, name))
        call: dict[str, Any] = {"name": name, "aux": call_args(h, block)}
        if h.kind == "score_mod":
            call["dfac"] = not grad_is_one(h)
            call["logit"] = f"{name}_logit"
            ctx["hook_logit_source"] = logit_helpers() + "\n" + emit_logit(h, call["logit"])
            call["logit_grad"] = f"{name}_logit_grad"
            ctx["hook_logit_grad_source"] = emit_logit_grad(h, call["logit_grad"])
        else:
            call["tile"] = f"{name}_tile"
            call["tile_aux"] = call["aux"] + summary_call_args(h, summaries)
            where = map_slot(hooks)
            call["map"] = None if where is None else f"hook_ptr{where}"
            call["map_b"], call["map_h"] = reads_input(h, "b"), reads_input(h, "h")
            mine = tuple(s.aux for s in summaries if s.aux in h.aux)
            readers = [tile_helpers(), *([summary_helpers()] if mine else [])]
            verdict = emit_tile_class(h, call["tile"], summarized=mine)
            ctx["hook_tile_source"] = "\n".join([*readers, verdict])
        ctx["hook_score" if h.kind == "score_mod" else "hook_mask"] = call
    ctx["hook_source"] = "\n".join(parts)
    return ctx


# ---- the launcher's values ----------------------------------------------------------------------


class HookArgs:
    """One call's aux values for a hooked variant, as the launcher passes them: by aux name, a
    1-D tensor as its device pointer (int), a 2-D one as (pointer, row stride in elements), a
    scalar as a number. `summaries`: range summaries of the tables `summary_slots` names, by
    table name, as (device pointer, the table's length n): the layout of
    hooks/summary.py's `summarize` for a table of n elements; a table left out has none (its
    slot stays NULL and the tile verdicts do without: correct, slower where they skip tiles).
    `block_map`: the device pointer of a block map (runtime/block_map.py) in `map_slot`'s slot,
    or None (NULL: the kernels evaluate their verdicts themselves).
    `kernel_args()` is the aux block's values, in `HOOK_PARAMS` order."""

    __slots__ = ("_args", "hooks")

    def __init__(
        self,
        hooks: Sequence[Hook],
        values: Mapping[str, Any] | None = None,
        summaries: Mapping[str, tuple[int, int]] | None = None,
        block_map: int | None = None,
    ) -> None:
        values = dict(values or {})
        block = slots(hooks)
        names = {s.aux.name for s in block}
        unknown = sorted(set(values) - names)
        missing = sorted(names - set(values))
        if unknown or missing:
            raise ValueError(
                f"hook aux values {sorted(values)}: the hooks take {sorted(names) or 'none'}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unknown {', '.join(unknown)}" if unknown else "")
                + "; pass one value per aux declaration, by name"
            )
        ptrs = [0] * MAX_POINTERS
        strides = [0] * MAX_POINTERS
        floats = [0.0] * MAX_FLOATS
        ints = [0] * MAX_INTS
        for s in block:
            v = values[s.aux.name]
            if s.kind == "ptr":
                ptr, stride = (v if s.aux.ndim == 2 else (v, 0)) if v is not None else (0, 0)
                if not ptr or int(ptr) % 4:
                    raise ValueError(
                        f"aux {s.aux.name}={v!r}: a {s.aux.ndim}-D aux tensor is a 4-byte "
                        "aligned device pointer"
                        + (" and its row stride" if s.aux.ndim == 2 else "")
                        + "; pass the tensor's device address"
                    )
                ptrs[s.index], strides[s.index] = int(ptr), int(stride)
            elif s.kind == "float":
                floats[s.index] = float(v)
            else:
                ints[s.index] = int(v)
                if not -(2**31) <= ints[s.index] < 2**31:
                    raise ValueError(
                        f"aux {s.aux.name}={v!r}: an int32 scalar; pass a value in int32"
                    )
        summary_of = {s.aux.name: s for s in summary_slots(hooks)}
        for name, value in (summaries or {}).items():
            where = summary_of.get(name)
            if where is None:
                raise ValueError(
                    f"summaries[{name!r}]: the variant's tile verdicts summarize "
                    f"{sorted(summary_of) or 'no table'}; pass summaries of those only "
                    "(features.hook.summary_slots)"
                )
            ptr, n = value
            if not ptr or int(ptr) % 4 or not 1 <= int(n) < 2**31:
                raise ValueError(
                    f"summaries[{name!r}]={value!r}: a 4-byte aligned device pointer and the "
                    "table's length (1 <= n < 2^31); pass (summary address, len(table))"
                )
            ptrs[where.index], strides[where.index] = int(ptr), int(n)
        if block_map:
            at = map_slot(hooks)
            if at is None or int(block_map) % 8:
                raise ValueError(
                    f"block_map={block_map!r}: "
                    + ("an 8-byte aligned device pointer" if at is not None else
                       "the variant's aux block has no free slot for a block map")
                    + "; pass runtime.block_map's map for this variant, or none"
                )
            ptrs[at] = int(block_map)
        self.hooks = tuple(hooks)
        self._args: tuple[int | float, ...] = (*ptrs, *strides, *floats, *ints)

    def kernel_args(self) -> tuple[int | float, ...]:
        """The aux block's values, one per `HOOK_PARAMS` row."""
        return self._args

    def pointers(self) -> tuple[int, ...]:
        """The aux block's pointer slots (hook_ptr0..): what a launch bound to other values
        of the same layout sets per call (`launch.Bound(..., hook_ptrs=)`)."""
        return tuple(int(v) for v in self._args[:MAX_POINTERS])

    def __repr__(self) -> str:
        return f"HookArgs({', '.join(h.digest for h in self.hooks)}: {self._args})"


# ---- the oracle's value ------------------------------------------------------------------------


@dataclass(frozen=True)
class HookCall:
    """A hook with its aux values, for the float64 oracle (`reference(..., score_mod=call)`):
    `aux` by declared name, NumPy arrays (1-D, 2-D) or numbers (scalars)."""

    hook: Hook
    aux: Mapping[str, Any] = field(default_factory=dict)

    def inputs(self, rows: slice, heads: int, tq: int, tk: int) -> dict[str, Any]:
        """The hook's integer inputs for (batch * head) rows `rows` of a (Tq, Tk) problem,
        shaped to broadcast against scores (rows, Tq, Tk)."""
        bh = np.arange(rows.start, rows.stop, dtype=np.int64).reshape(-1, 1, 1)
        return {
            "b": bh // heads,
            "h": bh % heads,
            "q_idx": np.arange(tq, dtype=np.int64).reshape(1, tq, 1),
            "kv_idx": np.arange(tk, dtype=np.int64).reshape(1, 1, tk),
            "q_len": np.asarray(tq, np.int64),
            "kv_len": np.asarray(tk, np.int64),
        }

    def logits(self, s: np.ndarray, rows: slice, heads: int) -> np.ndarray:
        """score_mod: the new scores of s (rows, Tq, Tk), evaluated in float64 and returned in
        s's float type (the fp32 rounded reference rounds them, as the kernel's fp32 would)."""
        inputs = self.inputs(rows, heads, s.shape[1], s.shape[2])
        inputs["score"] = s.astype(np.float64)
        (out,) = evaluate_many((self.hook.expr,), inputs, self.aux)
        return np.broadcast_to(out, s.shape).astype(s.dtype)

    def dlogits(self, s: np.ndarray, rows: slice, heads: int) -> np.ndarray:
        """score_mod: d(new score)/d(score) at scores s (rows, Tq, Tk), the backward's factor on
        dS (`hook.grad`), evaluated in float64 and returned in s's float type."""
        inputs = self.inputs(rows, heads, s.shape[1], s.shape[2])
        inputs["score"] = s.astype(np.float64)
        (out,) = evaluate_many((self.hook.grad,), inputs, self.aux)
        return np.broadcast_to(out, s.shape).astype(s.dtype)

    def keep(self, rows: slice, heads: int, tq: int, tk: int) -> npt.NDArray[np.bool_]:
        """mask_mod: the kept keys (rows, Tq, Tk)."""
        (out,) = evaluate_many((self.hook.expr,), self.inputs(rows, heads, tq, tk), self.aux)
        return np.broadcast_to(out, (rows.stop - rows.start, tq, tk)).astype(np.bool_)

    def lse_terms(
        self, s: np.ndarray, rows: slice, heads: int, score_err: float
    ) -> tuple[float, float]:
        """(error, M') of a score_mod on scores s (rows, Tq, Tk, float64): what the kernel's
        fp32 evaluation may add to one logit's error, and the largest finite |new score|.

        A model, conservative for hooks without ill-conditioned steps (documented in
        docs/hooks.md): every fp32 operation of the hook (precise expf/logf/tanhf included)
        errs by at most 2 ulps (4 U32 relative) of a value no larger than the largest finite
        intermediate X, plus the kernel's two multiplies around it (score * scale, x log2 e):
        (ops + 2) * 4 * U32 * X, where a to_float counts twice (the 16-bit kernels' lowering,
        hooks/fold.py, may convert in two parts; 2 ulps per operation also cover its folding of
        invariant factors: a rounded constant and the operation that uses it); and the score's
        own error passes through scaled by the largest |d new / d score| G: the rounding of
        scale * ln 2 (2 * U32 * |s|) times G, and the tensor-core error `score_err`, which
        lse_bound counts once already, times G - 1. A tanh the 16-bit kernels evaluate on the
        SFU adds `fold.TANH_SFU_ERROR` (absolute, in tanh units) times how far the result moves
        per unit of that tanh (`_sfu_gain`); the precise path's tanhf is within it too."""
        expr = self.hook.expr
        floats = tuple(
            n for n in postorder(expr) if n.dtype is DType.FLOAT and n.op not in ("const",)
        )
        inputs = self.inputs(rows, heads, s.shape[1], s.shape[2])
        inputs["score"] = s
        values = evaluate_many((expr, self.hook.grad, *floats), inputs, self.aux)
        big_s = _finite_max(s)
        big_x = max([big_s, *(_finite_max(v) for v in values)])
        ops = sum(n.op not in ("input", "scalar", "load") for n in floats)
        ops += sum(n.op == "to_float" for n in floats)
        grad = _finite_max(values[1])
        new = _finite_max(values[0])
        # lse_bound counts the score error once already (a factor of 1): only the excess
        err = (ops + 2) * 4 * U32 * big_x + max(grad - 1.0, 0.0) * score_err
        err += grad * 2 * U32 * big_s
        for n in sfu_nodes(expr):
            err += TANH_SFU_ERROR * _sfu_gain(expr, n, inputs, self.aux, values[0])
        return err, new


SFU_PROBE = 2.0**-10
"""The finite step `_sfu_gain` takes (tanh units): large against float64's rounding of the
results, small against the curvature of any hook downstream of a tanh."""


def _sfu_gain(
    expr: Expr, n: Expr, inputs: Mapping[str, Any], aux: Mapping[str, Any], base: Any
) -> float:
    """max |d expr / d n| over the problem, as a finite difference of n's value by +-SFU_PROBE
    (float64), doubled for any curvature downstream: how much an error of node n (a tanh, so
    bounded values) moves the hook's result."""
    gain = 0.0
    for step in (SFU_PROBE, -SFU_PROBE):

        def shift(m: Expr, args: tuple[Expr, ...], step: float = step) -> Expr:
            kept = all(x is y for x, y in zip(args, m.args, strict=True))
            same = m if kept else node(m.op, m.dtype, args, m.value)
            return same + const(step) if m is n else same

        (moved,) = evaluate_many((rebuild(expr, shift),), inputs, aux)
        diff = np.asarray(moved, np.float64) - np.asarray(base, np.float64)
        gain = max(gain, _finite_max(diff) / SFU_PROBE)
    return 2.0 * gain


def _finite_max(a: Any) -> float:
    """max |a| over its finite elements (0 when none)."""
    arr = np.abs(np.asarray(a, np.float64))
    arr = arr[np.isfinite(arr)]
    return float(arr.max()) if arr.size else 0.0


__all__ = [
    "HOOK_PARAMS",
    "KIND_TOKENS",
    "HookArgs",
    "HookCall",
    "HookNotRegistered",
    "Slot",
    "call_args",
    "grad_is_one",
    "hook_of",
    "hook_tokens",
    "hooks_of",
    "is_hook_token",
    "map_slot",
    "reads_input",
    "register",
    "slots",
    "summary_call_args",
    "summary_slots",
    "template_context",
    "token_kind",
    "token_of",
]
