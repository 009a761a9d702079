"""hooks/bounds.py: the aux tables a hook can index outside their shapes on a problem, found
before a launch (the kernels read aux tables unchecked)."""

from __future__ import annotations

import pytest

import flashgen.generator.hooks as hk
from flashgen.generator.hooks import library
from flashgen.generator.hooks.bounds import out_of_range


def _rel(score, b, h, q_idx, kv_idx, bias):
    return score + bias[h, hk.minimum(hk.maximum(kv_idx - q_idx + 31, 0), 63)]


REL = hk.trace_score_mod(_rel, hk.Aux("bias", "float32", 2))


def _raw(score, b, h, q_idx, kv_idx, bias):
    return score + bias[h, kv_idx - q_idx + 31]  # no clamp: reaches past both ends


RAW = hk.trace_score_mod(_raw, hk.Aux("bias", "float32", 2))


def _chained(b, h, q_idx, kv_idx, doc_ids, start):
    return kv_idx >= start[doc_ids[q_idx]]  # an index read from another table


CHAINED = hk.trace_mask_mod(_chained, hk.Aux("doc_ids", "int32", 1), hk.Aux("start", "int32", 1))


def _in_where(b, h, q_idx, kv_idx, doc_ids):
    return hk.where(kv_idx > 0, doc_ids[kv_idx - 1] == doc_ids[q_idx], kv_idx == 0)


IN_WHERE = hk.trace_mask_mod(_in_where, hk.Aux("doc_ids", "int32", 1))


def check(hook, shapes, b=2, h=4, tq=100, tk=100, scalars=None):
    return out_of_range(hook, batch=b, heads=h, q_len=tq, kv_len=tk, shapes=shapes,
                        scalars=scalars or {})  # fmt: skip


def test_a_document_table_must_cover_both_sequences():
    doc = library.document_hook()
    assert check(doc, {"doc_ids": (100,)}) is None
    msg = check(doc, {"doc_ids": (100,)}, tk=120)
    assert msg is not None
    assert "aux doc_ids: the mask_mod document_mask reads it at indices 0..119" in msg
    assert "shape (100,)" in msg and "hk.minimum(hk.maximum(i, 0), n - 1)" in msg
    assert check(doc, {"doc_ids": (99,)}, tk=99) is not None  # q_idx reaches 99


def test_per_head_tables_and_each_axis_of_a_2d_table():
    assert check(library.alibi_hook(), {"alibi_slopes": (4,)}) is None
    assert "indices 0..7" in check(library.alibi_hook(), {"alibi_slopes": (4,)}, h=8)
    assert check(REL, {"bias": (4, 64)}, tq=300, tk=300) is None  # clamped: always inside
    assert "axis 1 of it at indices 0..63" in check(REL, {"bias": (4, 32)})
    assert "axis 0 of it at indices 0..4" in check(REL, {"bias": (4, 64)}, h=5)
    assert "axis 1 of it at indices -68..130" in check(RAW, {"bias": (4, 64)})


def test_both_branches_of_a_where_count_and_unknown_indices_are_left_to_the_contract():
    # the contract (hooks/aux.py): every index in range wherever the hook is evaluated,
    # both branches of a where included: kv_idx - 1 reaches -1
    assert "indices -1..98" in check(IN_WHERE, {"doc_ids": (100,)})
    # start[doc_ids[q_idx]]: doc_ids is checked, start's index is a table's value: unknown
    assert check(CHAINED, {"doc_ids": (100,), "start": (1,)}) is None
    assert "aux doc_ids" in check(CHAINED, {"doc_ids": (50,), "start": (1,)})


@pytest.mark.parametrize("size", [0, -1])
def test_an_empty_problem_reads_nothing(size):
    assert check(library.document_hook(), {"doc_ids": (1,)}, tq=size) is None
