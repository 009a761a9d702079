"""Hooked mma forwards and backwards on the GPU: against the float64 oracle evaluating the same
hook (the backward's dQ, dK, dV by the project's gradient rule, `oracle_bwd.check_grads`), and
against the built-in softcap / ALiBi / window kernels they reproduce.

Problems are small and ragged (Tq, Tk not multiples of the tiles, Tq != Tk, GQA), so the padded
rows and keys of the last tiles are exercised: they must never reach the hook (its aux reads
are unchecked; a read past doc_ids would show under compute-sanitizer).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flashgen.generator import hooks as hk
from flashgen.generator.compile import CompiledKernel
from flashgen.generator.features import FeatureArgs
from flashgen.generator.features import hook as fh
from flashgen.generator.hooks import Hook, library
from flashgen.generator.hooks.summary import summarize
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import backward
from flashgen.runtime import gpu as runtime
from flashgen.verify import oracle
from flashgen.verify.checks import compile_all
from flashgen.verify.oracle_bwd import GradOutcome, check_grads

SCALE = 0.125
SHAPES = [(1, 4, 2, 77, 77), (2, 4, 4, 130, 301), (1, 2, 1, 200, 65)]  # B, H, H_kv, Tq, Tk


def _spec(
    hooks: tuple[Hook, ...],
    d: int,
    dtype: str,
    causal: bool,
    features: tuple[str, ...] = (),
    family: str = "mma",
):
    tokens = tuple(fh.token_of(h) for h in hooks)
    return KernelSpec(family=family, d=d, dtype=dtype, causal=causal, features=(*features, *tokens))


def _inputs(spec: KernelSpec, shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, ...]:
    b, h, h_kv, tq, tk = shape
    rng = np.random.default_rng(seed)
    store = np.dtype(spec.dtype_info.numpy)
    q = (2 * rng.standard_normal((b, h, tq, spec.d))).astype(store)
    k = (2 * rng.standard_normal((b, h_kv, tk, spec.d))).astype(store)
    v = rng.standard_normal((b, h_kv, tk, spec.d)).astype(store)
    return q, k, v


def _run(
    spec: KernelSpec,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    features: FeatureArgs = FeatureArgs(),  # noqa: B008 (immutable)
    hooks: fh.HookArgs | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    dq, dk, dv = (runtime.to_device(x) for x in (q, k, v))
    o = runtime.empty(q.shape, spec.dtype)
    lse = runtime.empty(q.shape[:3], np.float32)
    runtime.launch(
        spec, dq, dk, dv, o, lse, SCALE, poison_outputs=True, features=features, hooks=hooks
    )
    return runtime.to_host(o).astype(np.float64), runtime.to_host(lse).astype(np.float64)


def _f64(*xs: np.ndarray) -> list[np.ndarray]:
    return [x.astype(np.float64) for x in xs]


def _aux_case(name: str, spec_h: int, tq: int, tk: int) -> tuple[tuple[Hook, ...], dict[str, Any]]:
    """A hook set and its host aux values (arrays: put on the device by `_device_aux`)."""
    if name == "softcap":
        return (library.softcap_hook(),), {"softcap": 20.0}
    if name == "alibi":
        slopes = (2.0 ** (-8.0 * (np.arange(spec_h) + 1) / spec_h)).astype(np.float32)
        return (library.alibi_hook(),), {"alibi_slopes": slopes}
    if name == "document":  # Tq == Tk: packed sequences of ragged lengths
        doc = np.repeat(np.arange(5, dtype=np.int32), -(-tk // 5))[:tk]
        return (library.document_hook(),), {"doc_ids": doc}
    if name == "document_ragged":  # sorted ids with gaps: documents of 1 to ~3 tiles
        rng = np.random.default_rng(tk)
        lengths = rng.choice([1, 2, 37, 64, 65, 128, 200, 333], size=tk)
        ids = np.repeat(np.cumsum(rng.integers(1, 4, tk)), lengths)[:tk].astype(np.int32)
        return (library.document_hook(),), {"doc_ids": ids}
    if name == "document_unsorted":  # no order, repeated values: the summaries stay sound
        rng = np.random.default_rng(tk + 1)
        ids = np.repeat(rng.integers(-3, 3, tk), rng.integers(1, 90, tk))[:tk].astype(np.int32)
        return (library.document_hook(),), {"doc_ids": ids}
    if name == "prefix_lm":
        return (library.prefix_lm_hook(),), {"prefix": min(tk, 40)}
    if name == "custom":  # every aux kind: a 2-D and a 1-D table, a float and an int scalar
        rng = np.random.default_rng(11)
        return (CUSTOM,), {
            "bias": rng.standard_normal((spec_h, 64)).astype(np.float32),
            "gain": rng.uniform(0.5, 1.5, spec_h).astype(np.float32),
            "curve": 0.75,
            "center": 32,
        }
    if name == "alibi+document":
        hooks_a, aux_a = _aux_case("alibi", spec_h, tq, tk)
        hooks_d, aux_d = _aux_case("document", spec_h, tq, tk)
        return (*hooks_a, *hooks_d), {**aux_a, **aux_d}
    if name == "softcap+document":
        hooks_s, aux_s = _aux_case("softcap", spec_h, tq, tk)
        hooks_d, aux_d = _aux_case("document", spec_h, tq, tk)
        return (*hooks_s, *hooks_d), {**aux_s, **aux_d}
    if name == "causal":
        return (library.causal_hook(),), {}
    if name == "window":  # the built-in window's sides as aux scalars (a side < 0: unbounded)
        return (library.window_hook(),), {"window_left": 33, "window_right": 5}
    raise AssertionError(name)


def _device_aux(
    hooks: tuple[Hook, ...], aux: dict[str, Any], summaries: bool = True
) -> tuple[fh.HookArgs, list[Any]]:
    """HookArgs for host aux values: arrays copied to the device (kept alive by the list), with
    the range summaries of the tables a mask reads at ranges (`fh.summary_slots`: built on the
    host, hooks/summary.py) unless `summaries` is False (NULL: element-wise tile verdicts)."""
    keep: list[Any] = []
    values: dict[str, Any] = {}
    sums: dict[str, tuple[int, int]] = {}
    for slot in fh.summary_slots(hooks) if summaries else ():
        summary = summarize(aux[slot.aux.name], slot.aux.name)
        dev = runtime.to_device(np.ascontiguousarray(summary.table))
        keep.append(dev)
        sums[slot.aux.name] = (int(dev.gpudata), summary.n)
    for name, value in aux.items():
        if isinstance(value, np.ndarray):
            dev = runtime.to_device(np.ascontiguousarray(value))
            keep.append(dev)
            # a 2-D table travels as (pointer, row stride in elements)
            ptr = int(dev.gpudata)
            values[name] = ptr if value.ndim == 1 else (ptr, value.shape[1])
        else:
            values[name] = value
    return fh.HookArgs(hooks, values, sums), keep


def _oracle_kw(hooks: tuple[Hook, ...], aux: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for h in hooks:
        mine = {a.name: aux[a.name] for a in h.aux}
        kw[h.kind] = fh.HookCall(h, mine)
    return kw


def _rel_bias(score, b, h, q_idx, kv_idx, bias, gain, curve, center):
    # a relative-position bias table per head, a per-head gain and a smooth score-dependent
    # term: d(new)/d(score) = gain[h] + 0.5 * curve * (1 - tanh^2(curve * score))
    rel = hk.minimum(hk.maximum(kv_idx - q_idx + center, 0), 63)
    return gain[h] * score + bias[h, rel] + 0.5 * hk.tanh(score * curve)


CUSTOM = hk.trace_score_mod(
    _rel_bias,
    hk.Aux("bias", "float32", 2),
    hk.Aux("gain", "float32", 1),
    hk.Aux("curve", "float32", 0),
    hk.Aux("center", "int32", 0),
)


CASES = [
    ("softcap", 64, "fp16", True, ()),
    ("softcap", 128, "bf16", False, ("window",)),
    ("alibi", 64, "bf16", False, ()),
    ("alibi", 128, "fp16", True, ()),
    ("document", 64, "bf16", False, ()),
    ("prefix_lm", 128, "bf16", False, ()),
    ("alibi+document", 64, "fp16", True, ("window",)),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("name", "d", "dtype", "causal", "features"), CASES)
def test_a_hooked_forward_passes_the_oracle_on_the_same_hook(
    name, d, dtype, causal, features, shape
):
    b, h, h_kv, tq, tk = shape
    if "document" in name and tq != tk:
        pytest.skip("document masking indexes one packed sequence: Tq == Tk")
    hooks, aux = _aux_case(name, h, tq, tk)
    spec = _spec(hooks, d, dtype, causal, features)
    q, k, v = _inputs(spec, shape, seed=len(name) * 7 + d)
    window = (33, 5) if "window" in features else None
    args, _keep = _device_aux(hooks, aux)
    o, lse = _run(spec, q, k, v, features=FeatureArgs(window=window), hooks=args)
    out = oracle.check_outputs(
        o, lse, *_f64(q, k, v), causal=causal, scale=SCALE, dtype=dtype, window=window,
        **_oracle_kw(hooks, aux),
    )  # fmt: skip
    assert out.passed, (spec.name, out)


@pytest.mark.parametrize(("builtin", "d", "dtype", "causal"), [
    ("softcap", 128, "bf16", True), ("softcap", 64, "fp16", False),
    ("alibi", 128, "bf16", True), ("alibi", 64, "fp16", False),
])  # fmt: skip
def test_the_library_hooks_match_the_built_in_kernels(builtin, d, dtype, causal):
    """The hooked kernel and the built-in feature's kernel on the same inputs: both pass the
    oracle, and they differ by no more than the oracle's bound for either."""
    shape = (2, 4, 2, 190, 257)
    hooks, aux = _aux_case(builtin, 4, 190, 257)
    hooked = _spec(hooks, d, dtype, causal)
    plain = KernelSpec(family="mma", d=d, dtype=dtype, causal=causal, features=(builtin,))
    q, k, v = _inputs(plain, shape, seed=5)
    args, _keep = _device_aux(hooks, aux)
    o_h, l_h = _run(hooked, q, k, v, hooks=args)
    if builtin == "softcap":
        feats, kw = FeatureArgs(softcap=aux["softcap"]), {"softcap": aux["softcap"]}
    else:
        slopes_dev = runtime.to_device(aux["alibi_slopes"])
        _keep.append(slopes_dev)
        feats, kw = (
            FeatureArgs(alibi=int(slopes_dev.gpudata)),
            {"alibi_slopes": aux["alibi_slopes"]},
        )
    o_b, l_b = _run(plain, q, k, v, features=feats)
    q64, k64, v64 = _f64(q, k, v)
    via_hook = oracle.check_outputs(
        o_h, l_h, q64, k64, v64, causal=causal, scale=SCALE, dtype=dtype, **_oracle_kw(hooks, aux)
    )
    built_in = oracle.check_outputs(
        o_b, l_b, q64, k64, v64, causal=causal, scale=SCALE, dtype=dtype, **kw
    )
    assert via_hook.passed and built_in.passed, (via_hook, built_in)
    assert np.abs(o_h - o_b).max() <= via_hook.o_bound + built_in.o_bound
    assert np.abs(l_h - l_b).max() <= via_hook.lse_bound + built_in.lse_bound


# ---- the backward ------------------------------------------------------------------------------
# (hook set, d, dtype, causal, features); each in the fast mode (dQ by atomics) and the
# deterministic one (dQ by its own kernel, which evaluates the hooks once more)
BWD_CASES = [
    ("softcap", 64, "fp16", True, ()),
    ("softcap", 128, "bf16", False, ("window",)),
    ("alibi", 64, "bf16", False, ()),
    ("alibi", 128, "fp16", True, ()),
    ("document", 64, "bf16", False, ()),
    ("document", 128, "fp16", True, ()),
    ("prefix_lm", 64, "bf16", True, ()),
    ("prefix_lm", 128, "bf16", False, ()),
    ("custom", 64, "fp16", False, ()),
    ("custom", 128, "bf16", True, ()),
    ("alibi+document", 64, "fp16", True, ("window",)),
]
# (B, H, H_kv, Tq, Tk): ragged one-tile, GQA with many tiles (Tq == Tk: document masks), Tq < Tk
# ragged, Tq > Tk (causal rows with no key)
BWD_SHAPES = [(1, 4, 2, 77, 77), (2, 4, 2, 321, 321), (2, 4, 4, 130, 301), (1, 2, 1, 200, 65)]
BWD_MODES = [(), ("deterministic",)]


def _bwd_pair(
    name: str, d: int, dtype: str, causal: bool, features: tuple[str, ...], mode: tuple[str, ...],
    family: str = "mma",
) -> tuple[KernelSpec, KernelSpec]:  # fmt: skip
    """(forward, backward) variants of `family` with the case's hooks (the token registers
    them)."""
    hooks, _ = _aux_case(name, 4, 1, 1)
    tokens = tuple(fh.token_of(h) for h in hooks)
    fwd = KernelSpec(family=family, d=d, dtype=dtype, causal=causal, features=(*features, *tokens))
    bwd = KernelSpec(
        family=family, d=d, dtype=dtype, causal=causal, direction="bwd",
        features=(*features, *mode, *tokens),
    )  # fmt: skip
    return fwd, bwd


BWD_PARAMS = [
    pytest.param(case, mode, shape, id=f"{case[0]}-d{case[1]}-{case[2]}-"
                 f"{'causal' if case[3] else 'noncausal'}{'-window' if case[4] else ''}-"
                 f"{'det' if mode else 'fast'}-{'x'.join(map(str, shape))}")
    for case in BWD_CASES
    for mode in BWD_MODES
    for shape in BWD_SHAPES
    # document masks index one packed sequence (Tq == Tk); the deterministic mode on two shapes
    if ("document" not in case[0] or shape[3] == shape[4]) and (not mode or shape[1] == 4)
]  # fmt: skip


@pytest.fixture(scope="module")
def hooked_backwards() -> dict[KernelSpec, CompiledKernel | Exception]:
    """Every hooked forward and backward the backward tests run, compiled in parallel."""
    specs = list(dict.fromkeys(
        s for case in BWD_CASES for mode in BWD_MODES for s in _bwd_pair(*case, mode)
    ))  # fmt: skip
    return compile_all(specs)


def _built(compiled: dict[KernelSpec, CompiledKernel | Exception], spec: KernelSpec) -> None:
    got = compiled[spec]
    if isinstance(got, Exception):
        pytest.fail(f"{spec.name} did not compile: {got}", pytrace=False)


def _poisoned_like(x: np.ndarray, dtype: str) -> Any:
    buf = runtime.empty(x.shape, dtype)
    runtime.poison(int(buf.gpudata), x.size, dtype)  # an unwritten gradient element shows
    return buf


def _run_bwd(
    fwd: KernelSpec,
    bwd: KernelSpec,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    features: dict[str, Any],
    hooks: fh.HookArgs | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hooked forward writes O and LSE; the hooked backward, with the same hook values,
    computes (dQ, dK, dV) into NaN-poisoned arrays."""
    qd, kd, vd, dod = (runtime.to_device(x) for x in (q, k, v, do))
    o = runtime.empty(q.shape, fwd.dtype)
    lse = runtime.empty(q.shape[:3], np.float32)
    runtime.launch(
        fwd, qd, kd, vd, o, lse, SCALE, poison_outputs=True,
        features=FeatureArgs(window=features.get("window")), hooks=hooks,
    )  # fmt: skip
    dq, dk, dv = (_poisoned_like(x, bwd.dtype) for x in (q, k, v))
    kw = {"window": features["window"]} if features.get("window") else {}
    backward.launch_backward(bwd, qd, kd, vd, o, lse, dod, dq, dk, dv, SCALE, hooks=hooks, **kw)
    return tuple(runtime.to_host(g).astype(np.float64) for g in (dq, dk, dv))  # type: ignore[return-value]


def _bad(outcomes: list[GradOutcome]) -> list[str]:
    return [
        f"{g.name}: err {g.err:.3g} > bound {g.bound:.3g} (ref err {g.ref_err:.3g}, eps "
        f"{g.eps:.3g}){' NaN' if g.has_nan else ''}"
        for g in outcomes
        if not g.passed
    ]


def _bwd_inputs(spec: KernelSpec, shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, ...]:
    q, k, v = _inputs(spec, shape, seed)
    rng = np.random.default_rng(seed + 1)
    store = np.dtype(spec.dtype_info.numpy)
    do = rng.standard_normal((*q.shape[:3], spec.d)).astype(store)
    return q, k, v, do


@pytest.mark.parametrize(("case", "mode", "shape"), BWD_PARAMS)
def test_a_hooked_backward_passes_the_oracle_on_the_same_hook(case, mode, shape, hooked_backwards):
    name, d, dtype, causal, features = case
    b, h, h_kv, tq, tk = shape
    fwd, bwd = _bwd_pair(*case, mode)
    _built(hooked_backwards, fwd)
    _built(hooked_backwards, bwd)
    hooks, aux = _aux_case(name, h, tq, tk)
    q, k, v, do = _bwd_inputs(bwd, shape, seed=len(name) * 13 + d + tq)
    feats = {"window": (33, 5)} if "window" in features else {}
    args, _keep = _device_aux(hooks, aux)
    got = _run_bwd(fwd, bwd, q, k, v, do, features=feats, hooks=args)
    outcomes = check_grads(
        got, *_f64(q, k, v, do), dtype=dtype, scale=SCALE, causal=causal, **feats,
        **_oracle_kw(hooks, aux),
    )  # fmt: skip
    bad = _bad(outcomes)
    assert not bad, f"{bwd.name} {shape}: " + "; ".join(bad)
    if mode:  # the deterministic mode: bit-identical on a second run
        again = _run_bwd(fwd, bwd, q, k, v, do, features=feats, hooks=args)
        for g_name, a, c in zip(("dq", "dk", "dv"), got, again, strict=True):
            assert np.array_equal(a, c), f"{g_name} differs run to run"


@pytest.mark.parametrize(("builtin", "d", "dtype", "causal"), [
    ("softcap", 128, "bf16", True), ("softcap", 64, "fp16", False),
    ("alibi", 128, "bf16", True), ("alibi", 64, "fp16", False),
])  # fmt: skip
def test_the_library_hooks_backward_matches_the_built_in_backward(builtin, d, dtype, causal):
    """The hooked and the built-in backward on the same inputs: both pass the gradient rule,
    and their gradients differ by no more than the rule's bounds for either."""
    shape = (2, 4, 2, 190, 257)
    hooks, aux = _aux_case(builtin, 4, 190, 257)
    fwd_h, bwd_h = _bwd_pair(builtin, d, dtype, causal, (), ())
    fwd_b = KernelSpec(family="mma", d=d, dtype=dtype, causal=causal, features=(builtin,))
    bwd_b = KernelSpec(
        family="mma", d=d, dtype=dtype, causal=causal, direction="bwd", features=(builtin,)
    )
    q, k, v, do = _bwd_inputs(bwd_b, shape, seed=9)
    args, keep = _device_aux(hooks, aux)
    got_h = _run_bwd(fwd_h, bwd_h, q, k, v, do, features={}, hooks=args)
    # the built-in kernels take the same values as features
    if builtin == "softcap":
        fwd_feats, bwd_kw, ora = (
            FeatureArgs(softcap=aux["softcap"]), {"softcap": aux["softcap"]},
            {"softcap": aux["softcap"]},
        )  # fmt: skip
    else:
        slopes = runtime.to_device(aux["alibi_slopes"])
        keep.append(slopes)
        fwd_feats, bwd_kw, ora = (
            FeatureArgs(alibi=int(slopes.gpudata)), {"alibi_slopes": slopes},
            {"alibi_slopes": aux["alibi_slopes"]},
        )  # fmt: skip
    qd, kd, vd, dod = (runtime.to_device(x) for x in (q, k, v, do))
    o = runtime.empty(q.shape, dtype)
    lse = runtime.empty(q.shape[:3], np.float32)
    runtime.launch(fwd_b, qd, kd, vd, o, lse, SCALE, features=fwd_feats)
    dq, dk, dv = (_poisoned_like(x, dtype) for x in (q, k, v))
    backward.launch_backward(bwd_b, qd, kd, vd, o, lse, dod, dq, dk, dv, SCALE, **bwd_kw)
    got_b = tuple(runtime.to_host(g).astype(np.float64) for g in (dq, dk, dv))
    f64 = _f64(q, k, v, do)
    via_hook = check_grads(got_h, *f64, dtype=dtype, scale=SCALE, causal=causal,
                           **_oracle_kw(hooks, aux))  # fmt: skip
    built_in = check_grads(got_b, *f64, dtype=dtype, scale=SCALE, causal=causal, **ora)
    assert not _bad(via_hook) and not _bad(built_in), (_bad(via_hook), _bad(built_in))
    for a, c, x, y in zip(got_h, got_b, via_hook, built_in, strict=True):
        assert np.abs(a - c).max() <= x.bound + y.bound, x.name


# ---- family wgmma's forward (sm_90 only) ---------------------------------------------------------
def _need_sm90() -> None:
    """Skip on a GPU that is not sm_90 (the wgmma kernels are sm_90a code); without any usable
    GPU the tier's conftest skips already."""
    if runtime.gpu_status() is None and not runtime.device_arch().startswith("sm_90"):
        pytest.skip("family wgmma runs on sm_90 GPUs only")


# (hook set, d, dtype, causal, features): every library hook, a pair, and the custom one with
# every aux kind; the masks on causal and non-causal kernels (a mask_mod beside the built-in;
# on a non-causal kernel, a mask_mod whose verdicts skip tiles). Forward and backward.
WG_HOOK_CASES = [
    ("softcap", 64, "fp16", True, ()),
    ("softcap", 128, "bf16", False, ("window",)),
    ("alibi", 64, "bf16", False, ()),
    ("alibi", 128, "fp16", True, ()),
    ("causal", 128, "bf16", False, ()),
    ("causal", 64, "fp16", True, ()),
    ("window", 128, "bf16", True, ()),
    ("window", 64, "bf16", False, ()),
    ("document", 64, "bf16", False, ()),
    ("document", 128, "fp16", True, ()),
    ("prefix_lm", 128, "bf16", False, ()),
    ("prefix_lm", 64, "fp16", True, ()),
    ("softcap+document", 128, "bf16", True, ()),
    ("softcap+document", 64, "fp16", False, ("window",)),
    ("custom", 64, "fp16", False, ()),
    ("custom", 128, "bf16", True, ("window",)),
]
WG_CASES = [
    *WG_HOOK_CASES,
    # doc_ids through its range summary (tiles of other documents skipped, of one taken whole)
    ("document_ragged", 128, "bf16", False, ()),
    ("document_ragged", 64, "fp16", True, ()),
    ("document_unsorted", 128, "bf16", False, ()),
    ("document_unsorted", 64, "bf16", True, ("window",)),
]
# ragged one-tile, GQA Tq < Tk, Tq > Tk (causal rows with no key), several query and key tiles
# with Tq == Tk (document masks; tiles wholly inside the causal span), B > 1
WG_SHAPES = [(1, 4, 2, 77, 77), (2, 4, 4, 130, 301), (1, 2, 1, 200, 65), (2, 4, 2, 700, 700)]


WG_BUILTINS = [
    ("softcap", 128, "bf16", True), ("softcap", 64, "fp16", False),
    ("alibi", 128, "bf16", True), ("alibi", 64, "fp16", False),
    ("causal", 128, "bf16", False), ("window", 128, "bf16", True), ("window", 64, "fp16", False),
]  # fmt: skip


def _wg_pair(builtin: str, d: int, dtype: str, causal: bool) -> tuple[KernelSpec, KernelSpec]:
    """(hooked, built-in) wgmma variants: the library hook and the feature it reproduces
    (causal as a mask_mod on a non-causal kernel against the causal kernel)."""
    hooks, _ = _aux_case(builtin, 4, 1, 1)
    plain_causal = causal or builtin == "causal"
    feats = () if builtin == "causal" else (builtin,)
    return (
        _spec(hooks, d, dtype, causal, family="wgmma"),
        KernelSpec(family="wgmma", d=d, dtype=dtype, causal=plain_causal, features=feats),
    )


@pytest.fixture(scope="module")
def wgmma_hooked() -> dict[KernelSpec, CompiledKernel | Exception]:
    """Every wgmma variant the tests below run, compiled in parallel once (sm_90 only)."""
    _need_sm90()
    specs = [_spec(_aux_case(c[0], 4, 1, 1)[0], *c[1:], family="wgmma") for c in WG_CASES]
    specs += [s for case in WG_BUILTINS for s in _wg_pair(*case)]
    return compile_all(list(dict.fromkeys(specs)))


@pytest.mark.parametrize("shape", WG_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("name", "d", "dtype", "causal", "features"), WG_CASES)
def test_a_hooked_wgmma_forward_passes_the_oracle_on_the_same_hook(
    name, d, dtype, causal, features, shape, wgmma_hooked
):
    b, h, h_kv, tq, tk = shape
    if "document" in name and tq != tk:
        pytest.skip("document masking indexes one packed sequence: Tq == Tk")
    hooks, aux = _aux_case(name, h, tq, tk)
    spec = _spec(hooks, d, dtype, causal, features, family="wgmma")
    _built(wgmma_hooked, spec)
    q, k, v = _inputs(spec, shape, seed=len(name) * 7 + d + tq)
    window = (33, 5) if "window" in features else None
    args, _keep = _device_aux(hooks, aux)
    o, lse = _run(spec, q, k, v, features=FeatureArgs(window=window), hooks=args)
    out = oracle.check_outputs(
        o, lse, *_f64(q, k, v), causal=causal, scale=SCALE, dtype=dtype, window=window,
        **_oracle_kw(hooks, aux),
    )  # fmt: skip
    assert out.passed, (spec.name, shape, out)


@pytest.mark.parametrize(("builtin", "d", "dtype", "causal"), WG_BUILTINS)
def test_the_library_hooks_match_the_built_in_wgmma_kernels(
    builtin, d, dtype, causal, wgmma_hooked
):
    """The hooked wgmma kernel and the built-in feature's on the same inputs (causal and window
    as mask_mods against the built-in causal / window kernels): both pass the oracle, and they
    differ by no more than the oracle's bound for either."""
    shape = (2, 4, 2, 390, 457)
    hooks, aux = _aux_case(builtin, 4, 390, 457)
    hooked, plain = _wg_pair(builtin, d, dtype, causal)
    _built(wgmma_hooked, hooked)
    _built(wgmma_hooked, plain)
    keep: list[Any] = []
    feats, kw = FeatureArgs(), {}
    if builtin == "softcap":
        feats, kw = FeatureArgs(softcap=aux["softcap"]), {"softcap": aux["softcap"]}
    elif builtin == "alibi":
        slopes_dev = runtime.to_device(aux["alibi_slopes"])
        keep.append(slopes_dev)
        feats = FeatureArgs(alibi=int(slopes_dev.gpudata))
        kw = {"alibi_slopes": aux["alibi_slopes"]}
    elif builtin == "causal":
        kw = {"causal": True}
    else:
        sides = (aux["window_left"], aux["window_right"])
        feats, kw = FeatureArgs(window=sides), {"window": sides}
    q, k, v = _inputs(plain, shape, seed=5)
    args, _keep = _device_aux(hooks, aux)
    o_h, l_h = _run(hooked, q, k, v, hooks=args)
    o_b, l_b = _run(plain, q, k, v, features=feats)
    q64, k64, v64 = _f64(q, k, v)
    via_hook = oracle.check_outputs(
        o_h, l_h, q64, k64, v64, causal=causal, scale=SCALE, dtype=dtype, **_oracle_kw(hooks, aux)
    )
    built_in = oracle.check_outputs(
        o_b, l_b, q64, k64, v64, scale=SCALE, dtype=dtype, **{"causal": causal, **kw}
    )
    assert via_hook.passed and built_in.passed, (via_hook, built_in)
    assert np.abs(o_h - o_b).max() <= via_hook.o_bound + built_in.o_bound
    fin = np.isfinite(l_b)
    assert np.array_equal(fin, np.isfinite(l_h))  # the same rows see no key
    assert np.abs(l_h[fin] - l_b[fin]).max() <= via_hook.lse_bound + built_in.lse_bound


# Tq == Tk, several documents per row tile and tiles of one document: many NONE and ALL tiles
WG_DOC_SHAPE = (2, 4, 2, 1900, 1900)
WG_DOC_CASES = [
    ("document_ragged", 128, "bf16", False, ()),
    ("document_ragged", 64, "fp16", True, ()),
    ("document_unsorted", 128, "bf16", False, ()),
    ("softcap+document", 128, "bf16", True, ()),
]


@pytest.mark.parametrize(("name", "d", "dtype", "causal", "features"), WG_DOC_CASES)
def test_range_summaries_skip_tiles_without_changing_a_bit(
    name, d, dtype, causal, features, wgmma_hooked
):
    """The document mask through doc_ids' range summary (tiles of other documents skipped,
    tiles of one document without the element-wise mask) passes the oracle, and gives exactly
    the bits of the same kernel without the summary (NULL: every tile evaluated per element):
    a skipped tile adds exp2(-inf) = 0 to every sum (alpha stays 1, O += 0 * V), and a tile
    kept whole computes the same scores with or without the mask."""
    b, h, h_kv, tq, tk = WG_DOC_SHAPE
    hooks, aux = _aux_case(name, h, tq, tk)
    spec = _spec(hooks, d, dtype, causal, features, family="wgmma")
    _built(wgmma_hooked, spec)
    q, k, v = _inputs(spec, WG_DOC_SHAPE, seed=d + 3)
    with_summary, _keep = _device_aux(hooks, aux)
    without, _keep2 = _device_aux(hooks, aux, summaries=False)
    assert with_summary.kernel_args() != without.kernel_args()  # the summary is passed
    o, lse = _run(spec, q, k, v, hooks=with_summary)
    o_bare, lse_bare = _run(spec, q, k, v, hooks=without)
    out = oracle.check_outputs(
        o, lse, *_f64(q, k, v), causal=causal, scale=SCALE, dtype=dtype, **_oracle_kw(hooks, aux)
    )
    assert out.passed, (spec.name, out)
    assert np.array_equal(o, o_bare) and np.array_equal(lse, lse_bare), spec.name


# ---- family wgmma's backward (sm_90 only) --------------------------------------------------------
# The forward's hook cases (WG_HOOK_CASES). No deterministic mode (the wgmma backward has
# none). Select with -k wgmma_bwd.
WG_BWD_CASES = WG_HOOK_CASES
# ragged one-tile, GQA Tq < Tk, Tq > Tk (causal rows with no key), many query tiles per key
# block with Tq == Tk (document masks; the causal / window hooks' skipped tiles), B > 1
WG_BWD_SHAPES = [(1, 4, 2, 77, 77), (2, 4, 4, 130, 301), (1, 2, 1, 200, 65), (2, 4, 2, 700, 700)]
WG_BWD_PARAMS = [
    pytest.param(case, shape, id=f"{case[0]}-d{case[1]}-{case[2]}-"
                 f"{'causal' if case[3] else 'noncausal'}{'-window' if case[4] else ''}-"
                 f"{'x'.join(map(str, shape))}")
    for case in WG_BWD_CASES
    for shape in WG_BWD_SHAPES
    if "document" not in case[0] or shape[3] == shape[4]  # one packed sequence: Tq == Tk
]  # fmt: skip
# (hook, d, dtype, causal): the library hook against the built-in feature it reproduces (causal
# and window as mask_mods against the built-in causal / window kernels)
WG_BWD_BUILTINS = [
    ("softcap", 128, "bf16", True), ("softcap", 64, "fp16", False),
    ("alibi", 128, "bf16", True), ("alibi", 64, "fp16", False),
    ("causal", 128, "bf16", False), ("window", 128, "bf16", True), ("window", 64, "fp16", False),
]  # fmt: skip


def _wg_bwd_builtin(builtin: str, d: int, dtype: str, causal: bool) -> tuple[KernelSpec, ...]:
    """(forward, backward) of the built-in wgmma kernels a library hook reproduces."""
    plain_causal = causal or builtin == "causal"
    feats = () if builtin == "causal" else (builtin,)
    return tuple(
        KernelSpec(family="wgmma", d=d, dtype=dtype, causal=plain_causal, features=feats, **kw)
        for kw in ({}, {"direction": "bwd"})
    )


@pytest.fixture(scope="module")
def wgmma_hooked_backwards() -> dict[KernelSpec, CompiledKernel | Exception]:
    """Every wgmma forward and backward the tests below run, compiled in parallel once."""
    _need_sm90()
    specs = [s for case in WG_BWD_CASES for s in _bwd_pair(*case, (), family="wgmma")]
    for case in WG_BWD_BUILTINS:
        specs += [*_bwd_pair(case[0], *case[1:], (), (), family="wgmma"), *_wg_bwd_builtin(*case)]
    return compile_all(list(dict.fromkeys(specs)))


@pytest.mark.parametrize(("case", "shape"), WG_BWD_PARAMS)
def test_a_hooked_wgmma_bwd_passes_the_oracle_on_the_same_hook(case, shape, wgmma_hooked_backwards):
    """The hooked wgmma forward writes O and LSE, the hooked wgmma backward dQ, dK, dV: all
    three by the gradient rule against the float64 oracle evaluating the same hook."""
    name, d, dtype, causal, features = case
    b, h, h_kv, tq, tk = shape
    fwd, bwd = _bwd_pair(*case, (), family="wgmma")
    _built(wgmma_hooked_backwards, fwd)
    _built(wgmma_hooked_backwards, bwd)
    hooks, aux = _aux_case(name, h, tq, tk)
    q, k, v, do = _bwd_inputs(bwd, shape, seed=len(name) * 17 + d + tq)
    feats = {"window": (33, 5)} if "window" in features else {}
    args, _keep = _device_aux(hooks, aux)
    got = _run_bwd(fwd, bwd, q, k, v, do, features=feats, hooks=args)
    outcomes = check_grads(
        got, *_f64(q, k, v, do), dtype=dtype, scale=SCALE, causal=causal, **feats,
        **_oracle_kw(hooks, aux),
    )  # fmt: skip
    bad = _bad(outcomes)
    assert not bad, f"{bwd.name} {shape}: " + "; ".join(bad)


@pytest.mark.parametrize(("builtin", "d", "dtype", "causal"), WG_BWD_BUILTINS)
def test_the_library_hooks_wgmma_bwd_matches_the_built_in_wgmma_bwd(
    builtin, d, dtype, causal, wgmma_hooked_backwards
):
    """The hooked and the built-in wgmma backward on the same inputs (causal and window as
    mask_mods on a kernel without them): both pass the gradient rule, and their gradients
    differ by no more than the rule's bounds for either."""
    shape = (2, 4, 2, 390, 457)
    hooks, aux = _aux_case(builtin, 4, 390, 457)
    fwd_h, bwd_h = _bwd_pair(builtin, d, dtype, causal, (), (), family="wgmma")
    fwd_b, bwd_b = _wg_bwd_builtin(builtin, d, dtype, causal)
    for spec in (fwd_h, bwd_h, fwd_b, bwd_b):
        _built(wgmma_hooked_backwards, spec)
    q, k, v, do = _bwd_inputs(bwd_b, shape, seed=13)
    args, keep = _device_aux(hooks, aux)
    got_h = _run_bwd(fwd_h, bwd_h, q, k, v, do, features={}, hooks=args)
    # the built-in kernels take the same values as features
    fwd_feats, bwd_kw, ora = FeatureArgs(), {}, {"causal": causal}
    if builtin == "softcap":
        fwd_feats, bwd_kw = FeatureArgs(softcap=aux["softcap"]), {"softcap": aux["softcap"]}
        ora["softcap"] = aux["softcap"]
    elif builtin == "alibi":
        slopes = runtime.to_device(aux["alibi_slopes"])
        keep.append(slopes)
        fwd_feats, bwd_kw = FeatureArgs(alibi=int(slopes.gpudata)), {"alibi_slopes": slopes}
        ora["alibi_slopes"] = aux["alibi_slopes"]
    elif builtin == "causal":
        ora["causal"] = True
    else:
        sides = (aux["window_left"], aux["window_right"])
        fwd_feats, bwd_kw, ora["window"] = FeatureArgs(window=sides), {"window": sides}, sides
    qd, kd, vd, dod = (runtime.to_device(x) for x in (q, k, v, do))
    o = runtime.empty(q.shape, dtype)
    lse = runtime.empty(q.shape[:3], np.float32)
    runtime.launch(fwd_b, qd, kd, vd, o, lse, SCALE, features=fwd_feats)
    dq, dk, dv = (_poisoned_like(x, dtype) for x in (q, k, v))
    backward.launch_backward(bwd_b, qd, kd, vd, o, lse, dod, dq, dk, dv, SCALE, **bwd_kw)
    got_b = tuple(runtime.to_host(g).astype(np.float64) for g in (dq, dk, dv))
    f64 = _f64(q, k, v, do)
    via_hook = check_grads(got_h, *f64, dtype=dtype, scale=SCALE, causal=causal,
                           **_oracle_kw(hooks, aux))  # fmt: skip
    built_in = check_grads(got_b, *f64, dtype=dtype, scale=SCALE, **ora)
    assert not _bad(via_hook) and not _bad(built_in), (_bad(via_hook), _bad(built_in))
    for a, c, x, y in zip(got_h, got_b, via_hook, built_in, strict=True):
        assert np.abs(a - c).max() <= x.bound + y.bound, x.name
