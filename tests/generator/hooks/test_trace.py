"""Tracing a user's function: what it returns, and each error with its value, rule and fix."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flashgen.generator import hooks as hk
from flashgen.generator.hooks import Aux, DType, HookTypeError, HookValueError


def test_score_mod_traces_to_a_float_hook() -> None:
    def rel_bias(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any, bias: Any) -> Any:
        return score + bias[h, hk.minimum(hk.maximum(kv_idx - q_idx + 1023, 0), 2046)]

    hook = hk.trace_score_mod(rel_bias, Aux("bias", "float32", 2))
    assert hook.kind == "score_mod" and hook.name == "rel_bias"
    assert hook.expr.dtype is DType.FLOAT and hook.expr.op == "add"
    assert hook.aux == (Aux("bias", "float32", 2),)
    assert "bias[h, minimum(maximum" in repr(hook)


def test_mask_mod_traces_to_a_bool_hook_and_python_runs_around_it() -> None:
    windows = [128, 256]  # Python values and loops are fine: they unroll while tracing

    def local_global(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        keep = kv_idx < 4  # four global tokens
        for w in windows:
            keep = keep | ((q_idx - kv_idx >= 0) & (q_idx - kv_idx < w) & (h == windows.index(w)))
        return keep

    hook = hk.trace_mask_mod(local_global)
    assert hook.kind == "mask_mod" and hook.expr.dtype is DType.BOOL and hook.aux == ()


def test_constant_returns_are_lifted() -> None:
    assert hk.trace_score_mod(lambda s, b, h, q, kv: 0.0).expr.value == 0.0
    assert hk.trace_mask_mod(lambda b, h, q, kv: True).expr.value is True


def test_q_len_and_kv_len_are_readable() -> None:
    hook = hk.trace_mask_mod(lambda b, h, q, kv: kv <= q + hk.KV_LEN - hk.Q_LEN)
    assert "kv_len" in hook.canonical and "q_len" in hook.canonical


def check(exc: pytest.ExceptionInfo[BaseException], *parts: str) -> None:
    text = str(exc.value)
    for part in parts:
        assert part in text, f"{part!r} not in {text!r}"


def test_wrong_return_types() -> None:
    with pytest.raises(HookTypeError) as exc:
        hk.trace_score_mod(lambda s, b, h, q, kv: q - kv)
    check(exc, "score_mod <lambda>: returned (q_idx - kv_idx) (an int)", "a float", "to_float")
    with pytest.raises(HookTypeError) as exc:
        hk.trace_score_mod(lambda s, b, h, q, kv: kv <= q)
    check(exc, "returned (kv_idx <= q_idx) (a bool)", "a score_mod returns a float", "mask_mod")
    with pytest.raises(HookTypeError) as exc:
        hk.trace_mask_mod(lambda b, h, q, kv: q - kv)
    check(exc, "mask_mod <lambda>: returned (q_idx - kv_idx)", "returns a bool", "x != 0")

    def forgot(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> None:
        _ = score * 2

    with pytest.raises(HookTypeError) as exc:
        hk.trace_score_mod(forgot)
    check(exc, "score_mod forgot: returned None", "returns a float", "return score")
    with pytest.raises(HookTypeError) as exc:
        hk.trace_score_mod(lambda s, b, h, q, kv: "s")
    check(exc, "returned 's' (a str)", "returns a float")


def test_python_control_flow_on_an_expression() -> None:
    def branchy(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if q_idx >= kv_idx:
            return score
        return -math.inf

    with pytest.raises(HookTypeError) as exc:
        hk.trace_score_mod(branchy)
    check(exc, "score_mod branchy: bool((q_idx >= kv_idx))", "Python's if", "hk.where(c, a, b)")

    def with_and(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return kv_idx <= q_idx and kv_idx > 0

    with pytest.raises(TypeError) as exc2:  # a HookTypeError is a TypeError
        hk.trace_mask_mod(with_and)
    check(exc2, "mask_mod with_and: bool(", "and, or", "logical_and")


def test_unsupported_operations_carry_the_hook_name() -> None:
    with pytest.raises(HookTypeError) as exc:
        hk.trace_score_mod(lambda s, b, h, q, kv: s**2)
    check(exc, "score_mod <lambda>: (score) ** 2", "not in the hook expression set", "x * x")


def test_float_index_and_index_count() -> None:
    def float_index(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any, slopes: Any) -> Any:
        return score + slopes[score]

    with pytest.raises(HookTypeError) as exc:
        hk.trace_score_mod(float_index, Aux("slopes", "float32", 1))
    check(exc, "score_mod float_index: slopes[score]", "indices must be ints", "floats never")

    def one_index(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any, bias: Any) -> Any:
        return score + bias[kv_idx]

    with pytest.raises(HookTypeError) as exc:
        hk.trace_score_mod(one_index, Aux("bias", "float32", 2))
    check(exc, "bias[kv_idx]", "2-D aux tensor and takes 2 indices, got 1", "bias[h, kv_idx]")


def test_arity_names_the_expected_signature() -> None:
    def short(score: Any, b: Any, h: Any, q_idx: Any) -> Any:
        return score

    with pytest.raises(HookTypeError) as exc:
        hk.trace_score_mod(short)
    check(exc, "score_mod short(score, b, h, q_idx)", "called with 5 arguments", "def score_mod(")

    def no_aux(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return q_idx >= kv_idx

    with pytest.raises(HookTypeError) as exc:
        hk.trace_mask_mod(no_aux, Aux("doc_ids", "int32", 1))
    check(exc, "called with 5 arguments", "(1 here)", "def mask_mod(b, h, q_idx, kv_idx, doc_ids)")
    assert hk.trace_mask_mod(lambda *args: args[2] >= args[3]).kind == "mask_mod"  # *args binds


def test_aux_declarations_checked() -> None:
    with pytest.raises(HookValueError) as exc:
        hk.trace_mask_mod(
            lambda b, h, q, kv, x, y: x[q] == y[kv], Aux("ids", "int32", 1), Aux("ids", "int32", 1)
        )
    check(exc, "aux name 'ids' declared twice", "must differ", "rename one")
    with pytest.raises(HookTypeError) as exc:
        hk.trace_mask_mod(lambda b, h, q, kv, x: x[q] == 0, "doc_ids")  # type: ignore[arg-type]
    check(exc, "aux declaration 'doc_ids'", "hk.Aux(name, dtype, ndim)", "e.g. trace_mask_mod")
    with pytest.raises(HookValueError) as exc:
        hk.trace_score_mod(
            lambda s, b, h, q, kv, t, u: s + t[h, kv],
            Aux("tab", "float32", 2),
            Aux("tab_stride", "int32", 0),
        )
    check(exc, "aux name 'tab_stride'", "row stride of tab", "rename")


def test_reference_from_another_trace_is_refused() -> None:
    kept: list[Any] = []

    def first(b: Any, h: Any, q_idx: Any, kv_idx: Any, ids: Any) -> Any:
        kept.append(ids)
        return ids[q_idx] == ids[kv_idx]

    hk.trace_mask_mod(first, Aux("ids", "int32", 1))
    with pytest.raises(HookValueError) as exc:
        hk.trace_mask_mod(lambda b, h, q, kv: kept[0][q] == 0)
    check(exc, "aux tensor ids (int32[1])", "not declared in this trace", "pass its hk.Aux")
    score_kept: list[Any] = []
    hk.trace_score_mod(lambda s, b, h, q, kv: score_kept.append(s) or s)
    with pytest.raises(HookValueError) as exc:
        hk.trace_mask_mod(lambda b, h, q, kv: score_kept[0] > 0)
    check(exc, "input score", "is not an input of a mask_mod", "only the arguments")


def test_user_errors_pass_through_unchanged() -> None:
    def broken(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        hk.trace_score_mod(broken)
