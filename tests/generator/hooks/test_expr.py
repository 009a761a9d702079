"""The expression set: types and promotion, interning, immutability, and what it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashgen.generator import hooks as hk
from flashgen.generator.hooks import Aux, DType, HookTypeError, HookValueError
from flashgen.generator.hooks.expr import INPUTS, const, input_node

score = input_node("score", DType.FLOAT)
q = input_node("q_idx", DType.INT)
kv = input_node("kv_idx", DType.INT)


def test_int_float_promotion() -> None:
    assert (q + kv).dtype is DType.INT
    assert (q * 2).dtype is DType.INT
    assert (q + 1.5).dtype is DType.FLOAT
    assert (score - q).dtype is DType.FLOAT
    assert (q / 2).dtype is DType.FLOAT  # true division, as in Python
    assert (q // 2).dtype is DType.INT and (q % 2).dtype is DType.INT
    assert hk.minimum(q, kv).dtype is DType.INT and hk.maximum(q, 0.5).dtype is DType.FLOAT
    assert abs(q).dtype is DType.INT and (-score).dtype is DType.FLOAT
    assert hk.exp(q).dtype is DType.FLOAT
    assert (q < score).dtype is DType.BOOL
    assert hk.where(q < kv, q, 2).dtype is DType.INT
    assert hk.where(q < kv, q, 2.0).dtype is DType.FLOAT
    assert hk.where(q < kv, q == 1, True).dtype is DType.BOOL
    # an int constant meeting a float becomes the float constant itself, not a conversion
    assert (score + 1) is (score + 1.0)
    assert (score + q).args[1].op == "to_float"


def test_nodes_are_interned_and_immutable() -> None:
    a = hk.tanh(score / 30.0) * 30.0
    b = hk.tanh(score / 30.0) * 30.0
    assert a is b
    assert (q + 1) is not (q + 1.0)  # int and float constants stay apart
    assert const(0.0) is not const(-0.0)
    assert const(1) is not const(True)
    with pytest.raises(AttributeError, match="immutable"):
        a.op = "add"  # type: ignore[misc]
    # expressions hash by identity, so they can be dict keys despite the symbolic ==
    assert {a: 1}[b] == 1


def test_logical_operators_and_functions_agree() -> None:
    c1, c2 = q < kv, kv < 3
    assert (c1 & c2) is hk.logical_and(c1, c2)
    assert (c1 | c2) is hk.logical_or(c1, c2)
    assert (~c1) is hk.logical_not(c1)
    assert (True & c1).dtype is DType.BOOL


def test_constants_out_of_range() -> None:
    with pytest.raises(HookValueError, match=r"constant 2147483648: int constants must fit int32"):
        _ = q + 2**31
    with pytest.raises(HookValueError, match=r"must fit fp32.*math.inf"):
        _ = score * 1e39
    assert (score * math.inf).args[1].value == math.inf  # inf itself is allowed


def message(exc: pytest.ExceptionInfo[BaseException]) -> str:
    return str(exc.value)


@pytest.mark.parametrize(
    ("build", "value", "rule", "fix"),
    [
        (lambda: bool(q < kv), "bool((q_idx < kv_idx))", "no Python truth value", "hk.where"),
        (lambda: 0 < q < 5, "bool(", "chained comparisons", "logical_and"),
        (lambda: min(q, kv), "bool(", "min()/max()", "hk.minimum"),
        (lambda: score**2, "(score) ** 2", "not in the hook expression set", "x * x"),
        (lambda: score // 2, "(score) // (2)", "// takes ints", "divide floats with /"),
        (lambda: q % 2.0, "(q_idx) % (2.0)", "% takes ints", "keep both operands int"),
        (lambda: (q < kv) + 1, "(q_idx < kv_idx) (a bool) in +", "not bools", "hk.where(c, 1.0"),
        (lambda: q & kv, "(q_idx) & (kv_idx)", "no bitwise ops", "compare first"),
        (lambda: ~q, "~(q_idx)", "takes a bool", "comparison"),
        (lambda: hk.where(q, 1.0, 0.0), "where(q_idx, ...)", "must be a bool", "where(x != 0"),
        (lambda: hk.where(q < 1, q < 2, 1.0), "where(", "both numbers or both bools", "hk.where"),
        (lambda: (q < kv) < (kv < 1), "<", "bools compare only with ==", "logical_and"),
        (lambda: math.exp(score), "float(score)", "no Python value", "hk.exp"),
        (lambda: [1, 2][q], "q_idx used as a Python index", "cannot be indexed", "hk.Aux"),
        (lambda: list(q), "iter(q_idx)", "not a sequence", "aux tensor"),
        (lambda: np.exp(score), "numpy.exp on a hook expression", "numpy functions", "hk.exp"),
        (lambda: score + "x", "'x' (a str)", "mix only with Python numbers", "use a number"),
        (lambda: score[0], "(score)[0]", "only aux tensors are indexed", "hk.Aux"),
    ],
)
def test_refusals_name_value_rule_and_fix(build, value: str, rule: str, fix: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(HookTypeError) as exc:
        build()
    text = message(exc)
    assert value in text and rule in text and fix in text, text


def test_aux_lookups() -> None:
    doc = Aux("doc_ids", "int32", 1).symbol()
    tab = Aux("bias", "float32", 2).symbol()
    cap = Aux("cap", "float32", 0).symbol()
    assert (doc[q] == doc[kv]).dtype is DType.BOOL
    assert tab[0, kv - q + 1023].dtype is DType.FLOAT
    assert (cap * score).dtype is DType.FLOAT  # a rank-0 aux is an expression itself
    assert doc[q] is doc[q]


@pytest.mark.parametrize(
    ("build", "value", "rule", "fix"),
    [
        (lambda d, t: d[1.5], "doc_ids[1.5]", "indices must be ints", "floats never convert"),
        (lambda d, t: t[q], "bias[q_idx]", "2-D aux tensor and takes 2 indices, got 1", "bias[h,"),
        (lambda d, t: d[q, kv], "doc_ids[q_idx, kv_idx]", "takes one index, got 2", "doc_ids[q"),
        (lambda d, t: d[1:3], "doc_ids[slice(1, 3, None)]", "no slices", "read one element"),
        (lambda d, t: d + 1, "aux tensor doc_ids (1-D) used as a value", "one element", "index"),
        (lambda d, t: score * t, "aux tensor bias (2-D) used as a value", "one element", "bias[h"),
        (lambda d, t: d == q, "aux tensor doc_ids", "one element at a time", "doc_ids[q_idx]"),
        (lambda d, t: d[score > 0], "doc_ids[(score > 0.0)]", "is a bool", "int expressions"),
    ],
)
def test_aux_misuse(build, value: str, rule: str, fix: str) -> None:  # type: ignore[no-untyped-def]
    doc = Aux("doc_ids", "int32", 1).symbol()
    tab = Aux("bias", "float32", 2).symbol()
    with pytest.raises(HookTypeError) as exc:
        build(doc, tab)
    text = message(exc)
    assert value in text and rule in text and fix in text, text


@pytest.mark.parametrize(
    ("args", "value", "fix"),
    [
        (("2d", "int32", 1), "Aux name '2d'", "e.g. Aux("),
        (("q_idx", "int32", 1), "Aux name 'q_idx'", "rename it"),
        (("t3", "int32", 1), "Aux name 't3'", "rename it"),
        (("float", "int32", 1), "Aux name 'float'", "rename it"),
        (("ids", "int64", 1), "dtype='int64'", "store ids and positions as int32"),
        (("ids", "int32", 3), "ndim=3", "flatten"),
    ],
)
def test_aux_declaration_rules(args: tuple[str, str, int], value: str, fix: str) -> None:
    with pytest.raises(HookValueError) as exc:
        Aux(*args)
    assert value in message(exc) and fix in message(exc)


def test_inputs_order_is_the_abi() -> None:
    # the generated functions take the inputs in this order: changing it breaks callers
    assert list(INPUTS) == ["score", "b", "h", "q_idx", "kv_idx", "q_len", "kv_len"]
    assert hk.Q_LEN.value == "q_len" and hk.KV_LEN.value == "kv_len"
