"""The C++ of a hook: its text (CPU), and with nvcc (compile_all) that it compiles for the
device and, run on the host, computes what the NumPy oracle computes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flashgen.generator import hooks as hk
from flashgen.generator.hooks import Aux
from flashgen.generator.hooks.cuda import HOST_DEVICE, default_name, emit_hook, parameters
from flashgen.generator.hooks.library import LIBRARY, softcap_hook, window_hook

from ._exprs import random_hook


def test_signature_and_parameters() -> None:
    hook = hk.trace_score_mod(
        lambda s, b, h, q, kv, ids, tab, cap: s + tab[h, ids[kv]] * cap,
        Aux("ids", "int32", 1),
        Aux("tab", "float32", 2),
        Aux("cap", "float32", 0),
    )
    assert parameters(hook)[-5:] == [
        ("int", "kv_len"),
        ("const int* __restrict__", "ids"),
        ("const float* __restrict__", "tab"),
        ("int", "tab_stride"),
        ("float", "cap"),
    ]
    text = emit_hook(hook, "my_mod")
    head = (
        "__device__ __forceinline__ float my_mod(float score, int b, int h, int q_idx, int kv_idx, "
        "int q_len, int kv_len, const int* __restrict__ ids, const float* __restrict__ tab, "
        "int tab_stride, float cap) {"
    )
    assert head in text
    assert "tab[(long long)h * tab_stride + ids[kv_idx]]" in text
    assert "float my_mod_grad(" in text and "float& dscore) {" in text
    mask = emit_hook(window_hook(), "win")
    assert "__device__ __forceinline__ bool win(int b, int h, int q_idx, int kv_idx, " in mask
    assert default_name(window_hook()) == f"mask_mod_{window_hook().digest}"


def test_shared_subexpressions_get_one_statement_each() -> None:
    text = emit_hook(softcap_hook(), "sc")
    grad = text[text.index("float sc_grad(") :]
    grad = grad[: grad.index("}")]
    # tanh(score / softcap) is used twice in 1 - t * t: computed once
    assert grad.count("tanhf(") == 1 and "const float t0 = tanhf(score / softcap);" in grad
    value = text[text.index("float sc(") :]
    assert "return softcap * tanhf(score / softcap);" in value[: value.index("}")]


def test_int_semantics_and_literals() -> None:
    hook = hk.trace_score_mod(
        lambda s, b, h, q, kv: (
            hk.where(
                (q - kv) // 3 + (q - kv) % -4 + abs(q) + hk.minimum(q, -2147483648) > 0, -0.5, 1e-6
            )
            + hk.maximum(s, -hk.exp(s))
        )
    )
    text = emit_hook(hook, "ints")
    first = text[text.index("float ints(") :]
    first = first[: first.index("}")]
    # q_idx - kv_idx is used twice: one statement
    assert "const int t0 = q_idx - kv_idx;" in first and first.count("q_idx - kv_idx") == 1
    for part in ["fg_floordiv(t0, 3)", "fg_mod(t0, -4)", "fg_iabs(q_idx)"]:
        assert part in text
    assert "fg_imin(q_idx, -2147483647 - 1)" in text and "fmaxf(score, -expf(score))" in text
    assert "(-0.5f)" in text and "1e-06f" in text
    assert "__expf" not in text
    fast = emit_hook(hook, "ints", math="fast")
    assert "fg_fast_exp(score)" in fast and "expf(" not in fast.replace("fg_fast_exp(", "")


def test_emitted_functions_take_the_same_parameters_for_every_hook() -> None:
    # a template calls any hook alike: the fixed inputs first, in INPUTS order, then the aux
    fixed = ["b", "h", "q_idx", "kv_idx", "q_len", "kv_len"]
    for make in LIBRARY.values():
        hook = make()
        names = [n for _, n in parameters(hook)]
        lead = ["score", *fixed] if hook.kind == "score_mod" else fixed
        assert names[: len(lead)] == lead
        assert names[len(lead) :][:1] == [a.name for a in hook.aux][:1]


# ---- with nvcc ------------------------------------------------------------------------------

HOOKS = {
    **{name: make for name, make in LIBRARY.items()},
    **{f"random_{seed}": (lambda seed=seed: random_hook(seed)) for seed in range(6)},
}
H, TQ, TK = 3, 5, 16


def _int_hook() -> hk.Hook:
    def int_ops(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        d = q - kv
        v = d // 3 * 100 + d % 5 + d // -2 * 10000 + (d % -3) * 1000000 + abs(d - 2)
        return hk.to_float(hk.minimum(v, 7777777) + hk.maximum(-v, 3) - b * h)

    return hk.trace_score_mod(int_ops)


def _c_array(name: str, ctype: str, values: np.ndarray) -> str:
    if ctype == "float":
        items = ", ".join(f"{float(x).hex()}f" for x in values.reshape(-1))
    else:
        items = ", ".join(str(int(x)) for x in values.reshape(-1))
    return f"static const {ctype} {name}[{max(values.size, 1)}] = {{{items}}};\n"


def _aux_values(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "table": rng.standard_normal((4, TK)).astype(np.float32),
        "ids": rng.integers(-3, 4, TK).astype(np.int32),
        "gain": np.float32(1.25),
        "softcap": np.float32(7.5),
        "alibi_slopes": np.float32([0.5, 0.25, 0.125]),
        "window_left": 3,
        "window_right": 1,
        "doc_ids": np.sort(rng.integers(0, 3, TK)).astype(np.int32),
        "prefix": 4,
    }


def _call_args(hook: hk.Hook) -> str:
    args = []
    for ctype, name in parameters(hook):
        if name in ("score", "b", "h", "q_idx", "kv_idx", "q_len", "kv_len"):
            args.append(
                {"score": "s", "q_idx": "i", "kv_idx": "j", "q_len": "TQ", "kv_len": "TK"}.get(
                    name, name
                )
            )
        elif name.endswith("_stride"):
            args.append(str(TK))
        elif ctype.startswith("const"):
            args.append(f"aux_{name}")
        else:
            args.append(f"aux_{name}[0]")
    return ", ".join(args)


@pytest.mark.compile_all  # nvcc: runs with the compile-everything check
def test_hooks_compile_for_the_device(nvcc_required: Path, tmp_path: Path) -> None:
    hooks = [make() for make in HOOKS.values()] + [_int_hook()]
    calls = []
    for hook in hooks:
        args = _call_args(hook).replace("aux_", "p_")
        name = default_name(hook)
        if hook.kind == "score_mod":
            calls.append(f"  acc += {name}({args}) + {name}_grad({args});")
            calls.append(f"  acc += {name}_value_grad({args}, g) + g;")
        else:
            calls.append(f"  acc += {name}({args}) ? 1.0f : 0.0f;")
    params = (
        "const float* p_table, const int* p_ids, const float* p_alibi_slopes, const int* p_doc_ids"
    )
    scalars = "".join(
        f"  const {t} p_{n}[1] = {{{v}}};\n"
        for t, n, v in [
            ("float", "gain", "1.25f"),
            ("float", "softcap", "7.5f"),
            ("int", "window_left", "3"),
            ("int", "window_right", "1"),
            ("int", "prefix", "4"),
        ]
    )
    for math in ("precise", "fast"):
        src = hk.emit_source(*hooks, math=math) + (
            f"\n__global__ void run(float* out, {params}, int b, int h) {{\n"
            f"  const int i = threadIdx.x % {TQ}, j = threadIdx.x / {TQ}, TQ = {TQ}, TK = {TK};\n"
            f"  const float s = out[threadIdx.x];\n  float acc = 0.0f, g = 0.0f;\n{scalars}"
            + "\n".join(calls)
            + "\n  out[threadIdx.x] = acc;\n}\n"
        )
        cu = tmp_path / f"hooks_{math}.cu"
        cu.write_text(src)
        proc = subprocess.run(
            [str(nvcc_required), "-arch=sm_90", "-c", str(cu), "-o", str(tmp_path / "h.o")],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.compile_all  # nvcc and a host run: with the compile-everything check
def test_cpp_on_the_host_matches_the_numpy_oracle(nvcc_required: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    aux = _aux_values(rng)
    scores = (rng.standard_normal((H, TQ, TK)) * 4.0).astype(np.float32)
    hooks = {name: make() for name, make in HOOKS.items()}
    hooks["ints"] = _int_hook()
    src = [hk.helpers()]
    for name, hook in hooks.items():
        src.append(emit_hook(hook, f"hook_{name}", HOST_DEVICE))
    src.append("#include <cstdio>\n")
    src.append(_c_array("scores", "float", scores))
    for key, value in aux.items():
        arr = np.asarray(value)
        ctype = "float" if arr.dtype.kind == "f" else "int"
        src.append(_c_array(f"aux_{key}", ctype, arr))
    body = [f"  const int TQ = {TQ}, TK = {TK}, b = 1;", "  float g;"]
    body.append(f"  for (int h = 0; h < {H}; ++h) for (int i = 0; i < TQ; ++i)")
    body.append("  for (int j = 0; j < TK; ++j) {")
    body.append("    const float s = scores[(h * TQ + i) * TK + j];")
    for name, hook in hooks.items():
        args = _call_args(hook)
        if hook.kind == "score_mod":
            body.append(f"    const float v_{name} = hook_{name}_value_grad({args}, g);")
            body.append(f'    printf("%a %a ", (double)v_{name}, (double)g);')
            body.append(f'    printf("%a ", (double)hook_{name}({args}));')
            body.append(f'    printf("%a\\n", (double)hook_{name}_grad({args}));')
        else:
            body.append(f'    printf("%d\\n", (int)hook_{name}({args}));')
    body.append("  }\n  return 0;")
    src.append("int main() {\n" + "\n".join(body) + "\n}\n")
    cu = tmp_path / "host.cu"
    cu.write_text("\n".join(src))
    exe = tmp_path / "host"
    proc = subprocess.run(
        [str(nvcc_required), "-arch=sm_90", str(cu), "-o", str(exe)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = subprocess.run(
        [str(exe)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(lines) == H * TQ * TK * len(hooks)
    rows = np.array(lines, dtype=object).reshape(H, TQ, TK, len(hooks))
    s64 = scores.astype(np.float64)
    for k, (name, hook) in enumerate(hooks.items()):
        got = rows[..., k]
        kw: dict[str, Any] = {"heads": range(H), "tq": TQ, "tk": TK, "b": 1, "aux": aux}
        if hook.kind == "mask_mod":
            want = hk.evaluate_hook(hook, **kw)
            assert np.array_equal(np.vectorize(lambda x: x == "1")(got), want), name
            continue
        parts = np.vectorize(lambda x: tuple(float.fromhex(v) for v in x.split()), otypes=[object])(
            got
        )
        value, grad, value2, grad2 = (np.vectorize(lambda p, n=n: p[n])(parts) for n in range(4))
        assert np.array_equal(value, value2) and np.array_equal(grad, grad2), name
        want = hk.evaluate_hook(hook, score=s64, **kw)
        want_grad = hk.evaluate_hook(hook, score=s64, grad=True, **kw)
        if name == "ints":
            assert np.array_equal(value, want), name  # int semantics: exact
        # fp32 against float64: a few ulp of each intermediate, relative to its magnitude
        np.testing.assert_allclose(value, want, rtol=2e-5, atol=2e-5, err_msg=name)
        np.testing.assert_allclose(grad, want_grad, rtol=2e-5, atol=2e-5, err_msg=name)
