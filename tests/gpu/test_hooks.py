"""Hooked mma forwards on the GPU: against the float64 oracle evaluating the same hook, and
against the built-in softcap / ALiBi / window kernels they reproduce.

Problems are small and ragged (Tq, Tk not multiples of the tiles, Tq != Tk, GQA), so the padded
rows and keys of the last tiles are exercised: they must never reach the hook (its aux reads
are unchecked; a read past doc_ids would show under compute-sanitizer).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flashgen.generator.features import FeatureArgs
from flashgen.generator.features import hook as fh
from flashgen.generator.hooks import Hook, library
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import gpu as runtime
from flashgen.verify import oracle

SCALE = 0.125
SHAPES = [(1, 4, 2, 77, 77), (2, 4, 4, 130, 301), (1, 2, 1, 200, 65)]  # B, H, H_kv, Tq, Tk


def _spec(
    hooks: tuple[Hook, ...], d: int, dtype: str, causal: bool, features: tuple[str, ...] = ()
):
    tokens = tuple(fh.token_of(h) for h in hooks)
    return KernelSpec(family="mma", d=d, dtype=dtype, causal=causal, features=(*features, *tokens))


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
    if name == "prefix_lm":
        return (library.prefix_lm_hook(),), {"prefix": min(tk, 40)}
    if name == "alibi+document":
        hooks_a, aux_a = _aux_case("alibi", spec_h, tq, tk)
        hooks_d, aux_d = _aux_case("document", spec_h, tq, tk)
        return (*hooks_a, *hooks_d), {**aux_a, **aux_d}
    raise AssertionError(name)


def _device_aux(hooks: tuple[Hook, ...], aux: dict[str, Any]) -> tuple[fh.HookArgs, list[Any]]:
    """HookArgs for host aux values: arrays copied to the device (kept alive by the list)."""
    keep: list[Any] = []
    values: dict[str, Any] = {}
    for name, value in aux.items():
        if isinstance(value, np.ndarray):
            dev = runtime.to_device(value)
            keep.append(dev)
            values[name] = int(dev.gpudata)
        else:
            values[name] = value
    return fh.HookArgs(hooks, values), keep


def _oracle_kw(hooks: tuple[Hook, ...], aux: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for h in hooks:
        mine = {a.name: aux[a.name] for a in h.aux}
        kw[h.kind] = fh.HookCall(h, mine)
    return kw


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
