"""Range summaries of int32 tables (hooks/summary.py): the layout, and a lookup over any index
range against the table's own min and max over the chunks the range touches."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashgen.generator.hooks.summary import CHUNK, chunks, levels, lookup, summarize


@st.composite
def table_and_range(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    """A table (sorted or not, few or many distinct values) and an index range around it (it
    may stick out of the table on either side)."""
    n = draw(st.integers(1, 20 * CHUNK))
    spread = draw(st.sampled_from([2, 50, 2**31 - 1]))
    seed = draw(st.integers(0, 2**32 - 1))
    t = np.random.default_rng(seed).integers(-spread, spread, n, endpoint=False).astype(np.int32)
    if draw(st.booleans()):
        t.sort()
    lo = draw(st.integers(-100, n + 100))
    hi = draw(st.integers(lo, n + 200))
    return t, lo, hi


@given(table_and_range())
def test_a_lookup_is_the_min_and_max_over_the_chunks_the_clipped_range_touches(
    case: tuple[np.ndarray, int, int],
) -> None:
    t, lo, hi = case
    got = lookup(summarize(t), lo, hi)
    a, b = max(lo, 0), min(hi, t.size - 1)
    if a > b:
        assert got is None
        return
    hull = t[(a // CHUNK) * CHUNK : (b // CHUNK + 1) * CHUNK]
    assert got == (int(hull.min()), int(hull.max()))
    inside = t[a : b + 1]  # sound: every element the range reads lies within the bounds
    assert got[0] <= inside.min() and inside.max() <= got[1]


def test_the_layout_is_levels_by_min_max_by_chunks() -> None:
    t = np.arange(5 * CHUNK + 3, dtype=np.int32)[::-1].copy()  # 6 chunks, the last short
    s = summarize(t)
    assert chunks(t.size) == 6 and levels(t.size) == 3 and s.n == t.size
    assert s.table.shape == (3, 2, 6) and s.table.dtype == np.int32
    # level 0: chunk 5 holds the last 3 elements only (0, 1, 2 reversed)
    assert list(s.table[0, 0]) == [t[c * CHUNK : (c + 1) * CHUNK].min() for c in range(6)]
    assert s.table[0, :, 5].tolist() == [0, 2]
    # level 2 at chunk 3: chunks 3..5 (the run is cut at the end)
    assert s.table[2, :, 3].tolist() == [0, int(t[3 * CHUNK])]


def test_a_one_element_table_and_bad_tables() -> None:
    s = summarize(np.asarray([7], np.int32))
    assert s.table.shape == (1, 2, 1) and lookup(s, -5, 5) == (7, 7)
    with pytest.raises(ValueError, match="aux doc_ids: int64 of shape \\(4,\\); .* pass doc_ids"):
        summarize(np.zeros(4, np.int64), "doc_ids")
    with pytest.raises(ValueError, match="non-empty 1-D int32"):
        summarize(np.zeros(0, np.int32))
    with pytest.raises(ValueError, match="non-empty 1-D int32"):
        summarize(np.zeros((2, 2), np.int32))
