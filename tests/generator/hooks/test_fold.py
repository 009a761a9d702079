"""The lowered score_mod of 16-bit kernels (hooks/fold.py): what its C++ computes per element,
its SFU tanh's error bound against float64 (a float32 model of the formula, worst cases
included), the oracle's error term covering a softcap lowered that way, and (nvcc) the C++ on
the host against the NumPy oracle."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flashgen.generator import hooks as hk
from flashgen.generator.features.hook import HookCall, _sfu_gain
from flashgen.generator.hooks import fold
from flashgen.generator.hooks.cuda import HOST_DEVICE, helpers
from flashgen.generator.hooks.library import LIBRARY, alibi_hook, softcap_hook
from tests.generator.hooks._exprs import random_hook

F32 = np.float32
LOG2E = 1.4426950408889634


def body(hook: hk.Hook) -> str:
    """The logit function's body (after its signature)."""
    src = fold.emit_logit(hook, "lg")
    return src[src.index("{") :]


# ---- the C++ --------------------------------------------------------------------------------
def test_softcap_folds_to_the_builtin_formula():
    text = body(softcap_hook())
    # one multiply into ex2, one rcp, one FFMA out: no tanhf, no per-element division
    assert "tanhf" not in text and text.count("fg_sfu_ex2(") == 1 and text.count("fg_sfu_rcp(") == 1
    assert re.findall(r"/ ", text) == ["/ "] and "(1.0f / softcap)" in text
    assert "fg_sfu_ex2(s * ((s_scale * (1.0f / softcap)) * 2.8853900817779268f))" in text
    assert text.strip("{} \n").startswith("return fmaf(")


def test_the_logit_grad_shares_the_sfu_tanh_with_the_value():
    """The backward's value-and-derivative: softcap's tanh once (a statement both read), its
    derivative 1 - tanh^2 with c * (1 / c) cancelled; a bias's derivative the constant 1."""
    src = fold.emit_logit_grad(softcap_hook(), "lg")
    assert src.count("fg_sfu_ex2(") == 1 and src.count("fg_sfu_rcp(") == 1
    assert "float softcap, float& dscore) {" in src
    assert "dscore = 1.0f - (fmaf((-2.0f), t0, 1.0f) * fmaf((-2.0f), t0, 1.0f));" in src
    value = body(softcap_hook()).split("return ")[1].split(";")[0]
    t0 = re.search(r"const float t0 = (.*);", src)
    assert t0 is not None and f"return {value.replace(t0[1], 't0')};" in src
    assert "dscore = 1.0f;" in fold.emit_logit_grad(alibi_hook(), "lg")
    with pytest.raises(ValueError, match="only a score_mod"):
        fold.emit_logit_grad(hk.trace_mask_mod(lambda b, h, q, k: q >= k), "lg")


def test_alibi_converts_one_int_per_tile_and_adds_a_constant_per_element():
    text = body(alibi_hook())
    assert "(float)(q_base - q_len + kv_len - kv_base) + (float)(q_off - kv_off)" in text
    assert "kv_idx" not in text and "q_idx" not in text  # only the split indices
    assert text.count("fmaf(") == 1 and "s * (s_scale * 1.4426950408889634f)" in text


def test_a_sum_with_a_scaled_key_is_not_split():
    def scaled(score, b, h, q_idx, kv_idx):
        return score + hk.to_float(2 * kv_idx - q_idx)

    text = body(hk.trace_score_mod(scaled))
    assert "(float)((2 * kv_idx) - q_idx)" in text and "kv_base" not in text


def test_repeated_q_idx_stays_in_the_rest():
    def twice(score, b, h, q_idx, kv_idx):
        return score + hk.to_float(q_idx + q_idx - kv_idx)

    text = body(hk.trace_score_mod(twice))
    assert "(float)(q_idx + q_idx - kv_base)" in text and "(float)(-kv_off)" in text


def test_only_a_score_mod_has_a_logit():
    with pytest.raises(ValueError, match="only a score_mod"):
        fold.emit_logit(LIBRARY["causal"](), "lg")


def test_sfu_nodes_are_the_varying_tanhs():
    def two(score, b, h, q_idx, kv_idx, cap):
        return hk.tanh(score) + hk.tanh(cap)  # the second is computed once, precisely

    hook = hk.trace_score_mod(two, hk.Aux("cap", "float32", 0))
    assert [n.op for n in fold.sfu_nodes(hook.expr)] == ["tanh"]
    assert "tanhf(cap)" in body(hook)


# ---- the SFU tanh's error bound -------------------------------------------------------------
def _ulp_nudge(x: np.ndarray, ulps: int) -> np.ndarray:
    """x moved by `ulps` float32 ulps (up for ulps > 0, down for ulps < 0)."""
    out = x.astype(F32)
    target = F32(np.inf if ulps > 0 else -np.inf)
    for _ in range(abs(ulps)):
        out = np.nextafter(out, target)
    return out


def sfu_softcap(s: np.ndarray, s_scale: float, cap: float, ex2_ulps: int, rcp_ulps: int):
    """A float32 model of the lowered softcap (its C++, fold.py), each SFU result pushed by the
    given ulps (their documented worst cases: ex2 2, rcp 1), in base-2 logit units."""
    c = F32(cap)
    k1 = F32(F32(F32(s_scale) * F32(F32(1.0) / c)) * F32(2 * LOG2E))
    k2 = F32(F32(F32(-2.0) * c) * F32(LOG2E))
    post = F32(c * F32(LOG2E))
    with np.errstate(over="ignore"):
        e = np.exp2(F32(s.astype(F32) * k1)).astype(F32)
    e = _ulp_nudge(e, ex2_ulps)
    r = _ulp_nudge((F32(1.0) / F32(e + F32(1.0))).astype(F32), rcp_ulps)
    y = (k2.astype(np.float64) * r + post).astype(F32)  # one FFMA: one rounding
    return y


def _grid() -> np.ndarray:
    """Scores covering tanh's whole range densely, the worst-case points and extremes."""
    u = np.concatenate([
        np.linspace(-12, 12, 200_001),
        [0.0, 1e-30, -1e-30, 0.7717, -0.7717, 0.5493, 20.0, -20.0, 60.0, -60.0, 1e30, -1e30],
    ])  # fmt: skip
    return u


@pytest.mark.parametrize("cap", [0.5, 1.0, 30.0, 50.0, 100.0])
@pytest.mark.parametrize("ulps", [(2, 1), (-2, -1), (2, -1), (-2, 1), (0, 0)])
def test_the_sfu_softcap_stays_within_its_error_bound(cap, ulps):
    scale = 1 / math.sqrt(128)
    s = (_grid() * cap / scale).astype(F32)  # raw scores: u = s * scale / cap over the grid
    got = sfu_softcap(s, scale, cap, *ulps).astype(np.float64) / LOG2E
    want = cap * np.tanh(s.astype(np.float64) * scale / cap)
    err = float(np.max(np.abs(got - want)))
    # the tanh's own bound times the cap, and the model's folded constants (3 roundings of
    # values up to 2 cap: the ops count of HookCall.lse_terms covers them)
    assert err <= fold.TANH_SFU_ERROR * cap + 6 * fold.U32 * cap, (err, cap)


def test_the_tanh_bound_is_tight_to_a_small_factor():
    s = (_grid() * 30.0 * math.sqrt(128)).astype(F32)
    worst = max(
        float(np.max(np.abs(sfu_softcap(s, 1 / math.sqrt(128), 30.0, *u) / LOG2E
                            - 30.0 * np.tanh(s.astype(np.float64) / math.sqrt(128) / 30.0))))
        for u in [(2, 1), (-2, -1)]
    )  # fmt: skip
    assert worst > fold.TANH_SFU_ERROR * 30.0 / 8  # the bound is no fiction of slack


def test_the_oracle_term_covers_the_lowered_softcap():
    """HookCall.lse_terms (what lse_bound adds for the hook) >= the lowered softcap's largest
    deviation from float64 over the scores, worst SFU errors included."""
    cap = 30.0
    scale = 1 / math.sqrt(128)
    s = (np.linspace(-12, 12, 4001) * cap / scale).astype(F32)
    call = HookCall(softcap_hook(), {"softcap": cap})
    s3 = (s.astype(np.float64) * scale).reshape(1, 1, -1)
    term, _ = call.lse_terms(s3, slice(0, 1), 1, score_err=0.0)
    want = cap * np.tanh(s3.reshape(-1) / cap)
    for ulps in [(2, 1), (-2, -1), (2, -1), (-2, 1)]:
        got = sfu_softcap(s, scale, cap, *ulps).astype(np.float64) / LOG2E
        assert float(np.max(np.abs(got - want))) <= term


def test_the_sfu_term_scales_with_how_far_the_result_moves_per_tanh():
    """The gain of a tanh node is |d result / d tanh| (doubled): the cap for a softcap, and 0
    where a where() never selects it."""
    cap = 30.0
    hook = softcap_hook()
    call = HookCall(hook, {"softcap": cap})
    s3 = np.linspace(-200, 200, 801).reshape(1, 1, -1)
    inputs = call.inputs(slice(0, 1), 1, 1, s3.shape[2]) | {"score": s3}
    (tanh,) = fold.sfu_nodes(hook.expr)
    base = hk.evaluate(hook.expr, inputs, call.aux)
    assert _sfu_gain(hook.expr, tanh, inputs, call.aux, base) == pytest.approx(2 * cap, rel=1e-6)

    def unused(score, b, h, q_idx, kv_idx):
        return hk.where(kv_idx < 0, hk.tanh(score), score)

    other = hk.trace_score_mod(unused)
    (tanh,) = fold.sfu_nodes(other.expr)
    base = hk.evaluate(other.expr, inputs, {})
    assert _sfu_gain(other.expr, tanh, inputs, {}, base) == 0.0


# ---- the C++ on the host (nvcc) ----------------------------------------------------------------
H, TQ, TK, QB, KB = 3, 7, 40, 0, 16  # rows 0..6 as row group 0 + 0..6; keys 16 + 0..23 and more

HOOKS: dict[str, Any] = {
    "softcap": softcap_hook,
    "alibi": alibi_hook,
    **{f"random_{seed}": (lambda seed=seed: random_hook(seed)) for seed in range(8)},
}


def _split_hook() -> hk.Hook:
    def split(score, b, h, q_idx, kv_idx):
        d = hk.to_float(hk.minimum(abs(q_idx - kv_idx + 3), kv_idx - q_len_like(q_idx)))
        return score * 0.5 - d / 4.0 + hk.tanh(score / 3.0) * hk.to_float(-(kv_idx - 7))

    def q_len_like(q):
        return q - hk.Q_LEN

    return hk.trace_score_mod(split)


def _c_array(name: str, ctype: str, values: np.ndarray) -> str:
    if ctype == "float":
        items = ", ".join(f"{float(x).hex()}f" for x in values.reshape(-1))
    else:
        items = ", ".join(str(int(x)) for x in values.reshape(-1))
    return f"static const {ctype} {name}[{max(values.size, 1)}] = {{{items}}};\n"


@pytest.mark.compile_all  # nvcc and a host run: with the compile-everything check
def test_the_logit_on_the_host_matches_the_numpy_oracle(nvcc_required: Path, tmp_path: Path):
    """With the precise host fallbacks for the SFU, the folded, split C++ computes the hook's
    value times log2(e) at every (row, key) of the problem, keys written as base + offset."""
    rng = np.random.default_rng(11)
    aux = {
        "table": rng.standard_normal((4, TK)).astype(np.float32),
        "ids": rng.integers(-3, 4, TK).astype(np.int32),
        "gain": np.float32(1.25),
        "softcap": np.float32(7.5),
        "alibi_slopes": np.float32([0.5, 0.25, 0.125]),
    }
    s_scale = 0.3
    raw = (rng.standard_normal((H, TQ, TK)) * 8.0).astype(np.float32)
    hooks = {name: make() for name, make in HOOKS.items()}
    hooks["split"] = _split_hook()
    src = [helpers(), fold.logit_helpers(), "#include <cstdio>\n", _c_array("raw", "float", raw)]
    for key, value in aux.items():
        arr = np.asarray(value)
        src.append(_c_array(f"aux_{key}", "float" if arr.dtype.kind == "f" else "int", arr))
    body_lines = [f"  for (int h = 0; h < {H}; ++h) for (int i = 0; i < {TQ}; ++i)"]
    body_lines.append(f"  for (int j = 0; j < {TK}; ++j) {{")
    body_lines.append(f"    const float s = raw[(h * {TQ} + i) * {TK} + j];")
    body_lines.append(f"    const int qb = {QB}, kb = j < {KB} ? 0 : {KB};")
    for name, hook in hooks.items():
        src.append(fold.emit_logit(hook, f"lg_{name}", HOST_DEVICE))
        args = ["s", f"{s_scale}f", "1", "h", "i", "j", "qb", "i - qb", "kb", "j - kb", str(TQ)]
        args.append(str(TK))
        for a in hook.aux:
            if a.ndim == 0:
                args.append(f"aux_{a.name}[0]")
            else:
                args += [f"aux_{a.name}"] + ([str(TK)] if a.ndim == 2 else [])
        body_lines.append(f'    printf("%a\\n", (double)lg_{name}({", ".join(args)}));')
    body_lines.append("  }")
    src.append("int main() {\n" + "\n".join(body_lines) + "\n  return 0;\n}\n")
    cu = tmp_path / "logit.cu"
    cu.write_text("\n".join(src))
    exe = tmp_path / "logit"
    proc = subprocess.run(
        [str(nvcc_required), "-arch=sm_90", str(cu), "-o", str(exe)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    got = np.array([float.fromhex(x) for x in out]).reshape(H, TQ, TK, len(hooks))
    score = raw.astype(np.float64) * F32(s_scale)
    kw: dict[str, Any] = {"heads": range(H), "tq": TQ, "tk": TK, "b": 1, "aux": aux}
    for k, (name, hook) in enumerate(hooks.items()):
        want = hk.evaluate_hook(hook, score=score, **kw) * LOG2E
        np.testing.assert_allclose(got[..., k], want, rtol=2e-5, atol=2e-5, err_msg=name)
