"""The oracle's evaluation: integer semantics, aux handling, and its errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flashgen.generator import hooks as hk
from flashgen.generator.hooks import Aux


def ints_hook() -> hk.Hook:
    def int_ops(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        d = q - kv
        return hk.to_float(d // 3 * 100 + d % 5 + d // -2 * 10000 + (d % -3) * 1000000)

    return hk.trace_score_mod(int_ops)


def test_floor_division_and_modulo_are_pythons() -> None:
    tq, tk = 9, 11
    got = hk.evaluate_hook(ints_hook(), heads=[0], tq=tq, tk=tk, score=np.zeros((1, tq, tk)))
    want = [
        [float((i - j) // 3 * 100 + (i - j) % 5 + (i - j) // -2 * 10000 + (i - j) % -3 * 1000000)]
        for i in range(tq)
        for j in range(tk)
    ]
    assert np.array_equal(got.reshape(-1), np.asarray(want).reshape(-1))
    assert (got < 0).any() and (got > 0).any()  # both signs were exercised


def test_grid_shapes_and_broadcast() -> None:
    g = hk.grid([1, 3], tq=4, tk=6, b=2)
    assert g["h"].shape == (2, 1, 1) and g["q_idx"].shape == (1, 4, 1)
    assert g["kv_idx"].shape == (1, 1, 6) and int(g["kv_len"]) == 6 and int(g["b"]) == 2
    hook = hk.trace_mask_mod(lambda b, h, q, kv: (h == 3) & (b == 2))
    out = hk.evaluate_hook(hook, heads=[1, 3], tq=4, tk=6, b=2)
    assert out.shape == (2, 4, 6) and not out[0].any() and out[1].all()


def test_aux_values_are_what_the_kernel_reads() -> None:
    hook = hk.trace_score_mod(lambda s, b, h, q, kv, t: s + t[h], Aux("t", "float32", 1))
    tab = np.array([0.1, 0.2])  # float64 in, fp32 read: the oracle rounds it the same way
    zero = np.zeros((2, 1, 1))
    out = hk.evaluate_hook(hook, heads=[0, 1], tq=1, tk=1, score=zero, aux={"t": tab})
    assert np.array_equal(out.reshape(-1), tab.astype(np.float32).astype(np.float64))


def test_float_min_max_ignore_nan_as_fminf() -> None:
    hook = hk.trace_score_mod(lambda s, b, h, q, kv: hk.minimum(s, 1.0) + hk.maximum(s, -1.0))
    s = np.array([[[np.nan, 0.5]]])
    out = hk.evaluate_hook(hook, heads=[0], tq=1, tk=2, score=s)
    assert np.array_equal(out, [[[0.0, 1.0]]])  # nan ignored: 1 + -1; then 0.5 + 0.5


def test_out_of_range_index_is_an_error_even_in_an_untaken_branch() -> None:
    def shifted(b: Any, h: Any, q: Any, kv: Any, ids: Any) -> Any:
        return hk.where(kv > 0, ids[kv - 1] == ids[q], True)

    hook = hk.trace_mask_mod(shifted, Aux("ids", "int32", 1))
    with pytest.raises(IndexError) as exc:
        hk.evaluate_hook(hook, heads=[0], tq=4, tk=4, aux={"ids": np.arange(4, dtype=np.int32)})
    text = str(exc.value)
    assert "ids[(kv_idx - 1)]: index (kv_idx - 1) reaches -1, outside [0, 4)" in text
    assert "both branches of a where included" in text and "hk.minimum(hk.maximum(i, 0)" in text
    clamped = hk.trace_mask_mod(
        lambda b, h, q, kv, ids: hk.where(kv > 0, ids[hk.maximum(kv - 1, 0)] == ids[q], True),
        Aux("ids", "int32", 1),
    )
    out = hk.evaluate_hook(clamped, heads=[0], tq=4, tk=4, aux={"ids": np.arange(4)})
    assert out[0, 2, 3] and not out[0, 1, 3]


def test_zero_int_divisor_and_missing_values() -> None:
    hook = hk.trace_score_mod(lambda s, b, h, q, kv: s + hk.to_float(q // kv))
    with pytest.raises(ZeroDivisionError, match=r"\(q_idx // kv_idx\): integer division by zero"):
        hk.evaluate_hook(hook, heads=[0], tq=2, tk=2, score=np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match=r"score_mod <lambda>: pass score"):
        hk.evaluate_hook(hook, heads=[0], tq=2, tk=2)
    aux_hook = hk.trace_mask_mod(lambda b, h, q, kv, ids: ids[q] == 0, Aux("ids", "int32", 1))
    with pytest.raises(ValueError, match=r"aux tensor ids: .* pass aux\['ids'\]"):
        hk.evaluate_hook(aux_hook, heads=[0], tq=2, tk=2)
    with pytest.raises(ValueError, match=r"ids: dtype float64 for an int32 tensor"):
        hk.evaluate_hook(aux_hook, heads=[0], tq=2, tk=2, aux={"ids": np.zeros(2)})
    with pytest.raises(ValueError, match=r"ids: shape \(2, 2\) has 2 dimensions"):
        hk.evaluate_hook(aux_hook, heads=[0], tq=2, tk=2, aux={"ids": np.zeros((2, 2), np.int32)})
    with pytest.raises(ValueError, match="values outside int32"):
        hk.evaluate_hook(aux_hook, heads=[0], tq=2, tk=2, aux={"ids": np.array([0, 2**31])})
