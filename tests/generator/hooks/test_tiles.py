"""A mask_mod's verdict on a tile (hooks/tiles.py, and its C++ from hooks/cuda.py) against the
oracle's value of every element: never ALL or NONE unless true (random masks; masks reading
tables at ranges of indices through their range summaries, sorted or not), exactly the truth
for the library's causal, window and prefix-LM masks and for document masks on sorted ids, and
the C++ run on the host giving the Python verdict."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashgen.generator import hooks as hk
from flashgen.generator.hooks.cuda import (
    HOST_DEVICE,
    emit_tile_class,
    summary_helpers,
    tile_helpers,
)
from flashgen.generator.hooks.expr import INT32_MAX, INT32_MIN
from flashgen.generator.hooks.library import (
    WINDOW_AUX,
    causal_hook,
    document_hook,
    prefix_lm_hook,
    softcap_hook,
    window_hook,
    window_mask,
)
from flashgen.generator.hooks.summary import CHUNK, RangeSummary, summarize
from flashgen.generator.hooks.tiles import (
    Box,
    TileClass,
    box_inputs,
    brute_force,
    classify,
    clip,
    summarized_aux,
)

from ._exprs import IDS_SIZE, random_mask_hook

SOME, ALL, NONE = TileClass.SOME, TileClass.ALL, TileClass.NONE


def random_box(rng: random.Random, max_len: int = 64) -> Box:
    """A box inside a random problem: rows and keys in range, b and h below 4."""
    tq, tk = rng.randint(1, max_len), rng.randint(1, max_len)
    q = sorted(rng.randrange(tq) for _ in range(2))
    k = sorted(rng.randrange(tk) for _ in range(2))
    return Box(q[0], q[1], k[0], k[1], rng.randrange(4), rng.randrange(4), tq, tk)


def mask_aux(rng: random.Random) -> dict[str, Any]:
    """Values for the random masks' aux (ids, lim, gain) and the library's (sides, prefix)."""
    return {
        "ids": np.asarray([rng.randint(-10, 40) for _ in range(IDS_SIZE)], np.int32),
        "lim": rng.randint(-5, 40),
        "gain": 1.5,
        "window_left": rng.choice([-1, 0, rng.randint(0, 40)]),
        "window_right": rng.choice([-1, 0, rng.randint(0, 40)]),
        "prefix": rng.randint(-3, 70),
    }


# ---- the library's masks: exactly the truth ------------------------------------------------------
@pytest.mark.parametrize("make", [causal_hook, window_hook, prefix_lm_hook])
def test_the_library_masks_are_classified_exactly(make: Any) -> None:
    hook, rng = make(), random.Random(make.__name__)
    seen = set()
    for _ in range(1500):
        box, aux = random_box(rng), mask_aux(rng)
        want = brute_force(hook, box, aux)
        assert classify(hook, box, aux) == want, (box, aux)
        seen.add(want)
    assert seen == {SOME, ALL, NONE}  # every verdict was asked for


def test_causal_tiles_match_the_built_in_span() -> None:
    """Rows [q0, q0 + br) and key tiles of bc, clamped into the problem as the kernel does:
    NONE exactly past the built-in span's end (tile_span: keys < min(tk, p_last + 1)), ALL
    exactly on the tiles the built-in causal kernel takes without a mask (all keys <= p_first)."""
    hook, br, bc = causal_hook(), 16, 8
    for tq, tk in [(64, 64), (40, 100), (100, 40), (5, 77)]:
        for q0 in range(0, tq, br):
            p_first, p_last = q0 + tk - tq, min(q0 + br, tq) - 1 + tk - tq
            end = (max(min(tk, p_last + 1), 0) + bc - 1) // bc
            for t in range(-(-tk // bc)):
                box = Box(q0, min(q0 + br, tq) - 1, t * bc, min(t * bc + bc, tk) - 1, 0, 0, tq, tk)
                got = classify(hook, box)
                assert (got == NONE) == (t >= end), (tq, tk, q0, t)
                assert (got == ALL) == (min(t * bc + bc, tk) - 1 <= p_first), (tq, tk, q0, t)


def test_sinks_and_a_window_skip_the_middle_tiles() -> None:
    """StreamingLLM's mask: 4 sink keys and a window of 16 behind the query. The tiles between
    the sinks and the window are NONE, though the span runs from key 0 to the diagonal."""

    def sinks(b: Any, h: Any, q: Any, kv: Any, left: Any, right: Any) -> Any:
        return (kv < 4) | window_mask(b, h, q, kv, left, right)

    hook = hk.trace_mask_mod(sinks, *WINDOW_AUX)
    aux = {"window_left": 16, "window_right": 0}
    rows = (96, 111)  # 16 rows of a 128 x 128 problem
    verdicts = [
        classify(hook, Box(*rows, 16 * t, 16 * t + 15, 0, 0, 128, 128), aux) for t in range(8)
    ]
    assert verdicts == [SOME, NONE, NONE, NONE, NONE, SOME, SOME, NONE]  # 7: past the diagonal
    for t, v in enumerate(verdicts):
        assert brute_force(hook, Box(*rows, 16 * t, 16 * t + 15, 0, 0, 128, 128), aux) == v


# ---- random masks: sound -------------------------------------------------------------------------
def _within_int32(hook: hk.Hook, box: Box, aux: dict[str, Any]) -> bool:
    """Whether every int of the mask stays in int32 over the box (the hooks' contract)."""
    from flashgen.generator.hooks.expr import DType, postorder
    from flashgen.generator.hooks.numpy_eval import evaluate_many

    ints = tuple(n for n in postorder(hook.expr) if n.dtype is DType.INT)
    values = evaluate_many(ints, box_inputs(box), aux)
    return all(v.min() >= INT32_MIN and v.max() <= INT32_MAX for v in values if v.size)


def test_random_masks_are_never_classified_all_or_none_wrongly() -> None:
    counts = {v: 0 for v in TileClass}
    for seed in range(300):
        hook, rng = random_mask_hook(seed), random.Random(seed)
        aux = mask_aux(rng)
        for _ in range(20):
            box = random_box(rng)
            if not _within_int32(hook, box, aux):
                continue
            got, want = classify(hook, box, aux), brute_force(hook, box, aux)
            assert got in (want, SOME), (seed, hook.expr, box, aux["lim"])
            counts[got] += 1
    # the check has teeth: many definite verdicts were made (and checked)
    assert counts[ALL] > 500 and counts[NONE] > 500, counts


def test_what_cannot_be_bounded_is_some() -> None:
    docs = document_hook()
    ids = np.zeros(8, np.int32)  # every key in one document: all kept, but unknown per tile
    assert classify(docs, Box(0, 3, 0, 3, 0, 0, 8, 8), {"doc_ids": ids}) == SOME
    # one row and one key: both lookups are one index over the tile, so it reads them
    assert classify(docs, Box(2, 2, 5, 5, 0, 0, 8, 8), {"doc_ids": ids}) == ALL
    floats = hk.trace_mask_mod(lambda b, h, q, kv: hk.to_float(kv) < 100.5)
    assert classify(floats, Box(0, 3, 0, 3, 0, 0, 8, 8)) == SOME
    div = hk.trace_mask_mod(lambda b, h, q, kv: q // (kv + 1) >= 0)
    assert classify(div, Box(0, 3, 0, 3, 0, 0, 8, 8)) == SOME


@pytest.mark.parametrize(
    ("mask", "box", "want"),
    [
        # Python floor semantics of // and % by a constant, negative operands included
        (lambda b, h, q, kv: (q - 10) // 4 == -3, Box(0, 1, 0, 0, 0, 0, 8, 8), ALL),
        (lambda b, h, q, kv: (q - 10) // 4 == -3, Box(0, 3, 0, 0, 0, 0, 8, 8), SOME),
        (lambda b, h, q, kv: (q - 10) % 4 >= 2, Box(0, 1, 0, 0, 0, 0, 8, 8), ALL),
        (lambda b, h, q, kv: (q - 10) % 4 >= 2, Box(2, 5, 0, 0, 0, 0, 8, 8), SOME),
        (lambda b, h, q, kv: q % -3 > 0, Box(0, 7, 0, 0, 0, 0, 8, 8), NONE),
        (lambda b, h, q, kv: q // (-kv - 1) <= 0, Box(0, 7, 0, 0, 0, 0, 8, 8), ALL),
        # block-diagonal masks: tiles of one block are ALL, tiles of two blocks NONE
        (lambda b, h, q, kv: q // 4 == kv // 4, Box(4, 7, 4, 7, 0, 0, 8, 8), ALL),
        (lambda b, h, q, kv: q // 4 == kv // 4, Box(0, 3, 4, 7, 0, 0, 8, 8), NONE),
        (lambda b, h, q, kv: abs(q - 3) <= 4, Box(0, 7, 0, 0, 0, 0, 8, 8), ALL),
    ],
)
def test_rules(mask: Any, box: Box, want: TileClass) -> None:
    hook = hk.trace_mask_mod(mask)
    assert classify(hook, box) == want
    if want != SOME:
        assert brute_force(hook, box) == want


def test_bounds_are_clamped_into_int32_one_by_one() -> None:
    assert clip((-(2**40), 5)) == (INT32_MIN, 5)
    assert clip((2**40, 2**41)) == (INT32_MAX, INT32_MAX)  # not FULL: clip stays monotone


def test_a_verdict_on_a_larger_box_is_never_sharper() -> None:
    """Monotone: NONE (ALL) on a box holds for every box inside it. The kernel's walk relies on
    it: it crosses runs of dropped tiles with one verdict on several tiles at once, and its
    consumers count the kept tiles one by one; both must find the same tiles."""
    for seed in range(150):
        hook, rng = random_mask_hook(seed), random.Random(seed)
        aux = mask_aux(rng)
        for _ in range(10):
            outer = random_box(rng)
            q = sorted(rng.randint(outer.q_lo, outer.q_hi) for _ in range(2))
            k = sorted(rng.randint(outer.kv_lo, outer.kv_hi) for _ in range(2))
            inner = Box(q[0], q[1], k[0], k[1], outer.b, outer.h, outer.q_len, outer.kv_len)
            big = classify(hook, outer, aux)
            if big != SOME:
                assert classify(hook, inner, aux) == big, (seed, hook.expr, outer, inner)


def test_classify_refuses_empty_boxes_and_score_mods() -> None:
    with pytest.raises(ValueError, match="empty box"):
        classify(causal_hook(), Box(3, 2, 0, 0, 0, 0, 8, 8))
    with pytest.raises(ValueError, match="takes a mask"):
        classify(softcap_hook(), Box(0, 0, 0, 0, 0, 0, 8, 8))
    with pytest.raises(ValueError, match="only a mask_mod"):
        emit_tile_class(softcap_hook())


# ---- the C++ -------------------------------------------------------------------------------------
def test_the_cpp_verdict_reads_as_the_rules() -> None:
    text = emit_tile_class(causal_hook(), "causal_tile")
    assert (
        "__device__ __forceinline__ int causal_tile(int b, int h, int q_lo, int q_hi, int kv_lo, "
        "int kv_hi, int q_len, int kv_len) {" in text
    )
    assert "fg_ir_le(fg_irange{kv_lo, kv_hi}, t1);  // (kv_idx <= ((q_idx - q_len) + kv_len))" in (
        text
    )
    window = emit_tile_class(window_hook(), "w")
    assert window.count("fg_or(") == 2 and "fg_and(t6, t9)" in window
    assert "int window_left, int window_right) {" in window
    # a table read at a range of indices: bounded by its range summary (pointer, length)
    docs = emit_tile_class(document_hook(), "d")
    assert "int d(int b, int h, int q_lo, int q_hi, int kv_lo, int kv_hi, int q_len, int " in docs
    assert (
        "const int* __restrict__ doc_ids, const int* __restrict__ fg_sum_doc_ids, "
        "int fg_n_doc_ids) {" in docs
    )
    assert (
        "fg_ir_load_summary(doc_ids, fg_sum_doc_ids, fg_n_doc_ids, fg_irange{q_lo, q_hi})" in docs
    )
    bare = emit_tile_class(document_hook(), "d", summarized=())  # without: unknown, as before
    assert "fg_ir_load(doc_ids, fg_irange{q_lo, q_hi})" in bare and "fg_sum_" not in bare
    with pytest.raises(ValueError, match="summaries are only of those"):
        emit_tile_class(window_hook(), "w", summarized=document_hook().aux)
    floats = emit_tile_class(hk.trace_mask_mod(lambda b, h, q, kv: hk.to_float(kv) < 0.5), "f")
    assert "return FG_EITHER;" in floats or "= FG_EITHER;" in floats


def _host_program(hooks: dict[str, hk.Hook], cases: list[tuple[Box, dict[str, Any]]]) -> str:
    """C++ that prints every hook's tile verdict on every case, one line per case (the cases
    as tables, one loop: a host compiler takes minutes over thousands of inlined calls). A
    case's tables (`ids`, `doc_ids`) travel flattened with their offsets and lengths, and with
    their range summaries unless the case says `no_summary` (then NULL: none)."""
    src = [tile_helpers(), summary_helpers(), "#include <cstdio>\n"]
    for name, hook in hooks.items():
        src.append(emit_tile_class(hook, f"tile_{name}", HOST_DEVICE))
    fields = ("b", "h", "q_lo", "q_hi", "kv_lo", "kv_hi", "q_len", "kv_len")
    scalars = ("lim", "window_left", "window_right", "prefix")
    n = len(cases)

    def array(name: str, values: list[int]) -> None:
        text = ", ".join(map(str, values)) or "0"
        src.append(f"static const int {name}[{max(len(values), 1)}] = {{{text}}};")

    for f in fields:
        array(f"c_{f}", [getattr(box, f) for box, _ in cases])
    for f in scalars:
        array(f"c_{f}", [a[f] for _, a in cases])
    array("c_null", [int(a.get("no_summary", False)) for _, a in cases])
    for table in ("ids", "doc_ids"):
        flat: list[int] = []
        sums: list[int] = []
        offs: list[int] = []
        sum_offs: list[int] = []
        for _, a in cases:
            offs.append(len(flat))
            sum_offs.append(len(sums))
            flat += [int(x) for x in a[table]]
            sums += [int(x) for x in summarize(a[table]).table.ravel()]
        array(f"c_{table}", flat)
        array(f"c_{table}_off", offs)
        array(f"c_{table}_n", [len(a[table]) for _, a in cases])
        array(f"c_sum_{table}", sums)
        array(f"c_sum_{table}_off", sum_offs)
    calls = []
    for name, hook in hooks.items():
        args = [f"c_{f}[i]" for f in fields]
        for a in hook.aux:
            if a.name in ("ids", "doc_ids"):
                args.append(f"c_{a.name} + c_{a.name}_off[i]")
            else:
                args.append({"gain": "1.5f"}.get(a.name, f"c_{a.name}[i]"))
        for a in summarized_aux(hook):
            args.append(f"(c_null[i] ? nullptr : c_sum_{a.name} + c_sum_{a.name}_off[i])")
            args.append(f"c_{a.name}_n[i]")
        calls.append(f'    printf(" %d", tile_{name}({", ".join(args)}));')
    body = [f"int main() {{\n  for (int i = 0; i < {n}; ++i) {{", *calls]
    body.append('    printf("\\n");\n  }\n  return 0;\n}\n')
    return "\n".join(src + body)


def _summaries(hook: hk.Hook, aux: dict[str, Any]) -> dict[str, RangeSummary] | None:
    """The summaries the C++ verdict of `hook` takes for a case (None: the case passes NULL)."""
    if aux.get("no_summary"):
        return None
    return {a.name: summarize(aux[a.name]) for a in summarized_aux(hook)}


def _host_cases(rng: random.Random) -> list[tuple[Box, dict[str, Any]]]:
    """Small random boxes (the random masks' 64 ids) and long ones over document tables,
    sorted or not; one in five passes no summaries."""
    cases = []
    for i in range(240):
        box = random_box(rng, 64 if i < 120 else 700)
        aux = mask_aux(rng)
        n = max(box.q_len, box.kv_len, TABLE_MIN) + rng.randint(0, 80)
        aux["doc_ids"] = (
            _sorted_docs(rng, n)
            if rng.random() < 0.6
            else np.asarray([rng.randint(-3, 3) for _ in range(n)], np.int32)
        )
        aux["no_summary"] = i % 5 == 4
        cases.append((box, aux))
    return cases


@pytest.mark.compile_all  # nvcc and a host run: with the compile-everything check
def test_cpp_verdicts_on_the_host_match_python(nvcc_required: Path, tmp_path: Path) -> None:
    hooks = {"causal": causal_hook(), "window": window_hook(), "prefix": prefix_lm_hook()}
    hooks.update({f"random_{s}": random_mask_hook(s) for s in range(24)})
    hooks.update({f"table_{i}": m for i, m in enumerate(TABLE_MASKS)})
    cases = _host_cases(random.Random(11))
    cu = tmp_path / "tiles.cu"
    cu.write_text(_host_program(hooks, cases))
    exe = tmp_path / "tiles"
    proc = subprocess.run(
        [str(nvcc_required), "-arch=sm_90", str(cu), "-o", str(exe)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert len(lines) == len(cases)
    definite = 0
    for line, (box, aux) in zip(lines, cases, strict=True):
        got = [TileClass(int(v)) for v in line.split()]
        want = [classify(hook, box, aux, _summaries(hook, aux)) for hook in hooks.values()]
        assert got == want, (box, aux)
        definite += sum(
            w != SOME for w, h in zip(want, hooks, strict=True) if h.startswith("table_")
        )
    assert definite > 200, definite  # the summarized reads made many definite verdicts


# ---- tables read at a range of indices: range summaries ------------------------------------------
DOCS = hk.Aux("doc_ids", "int32", 1)
LIM = hk.Aux("lim", "int32", 0)
TABLE_MIN = 64  # the tables below have at least this many entries (the masks clamp into it)


def _table_masks() -> list[hk.Hook]:
    """Masks that read doc_ids at ranges of indices: the document mask, with causality, an
    order between ids, an index mixing rows and keys, a table read at a table's value, and a
    where whose branches read it differently. Indices stay inside the table (the contract)."""

    def clamp(i: Any) -> Any:
        return hk.minimum(hk.maximum(i, 0), TABLE_MIN - 1)

    def causal_docs(b: Any, h: Any, q: Any, kv: Any, d: Any, lim: Any) -> Any:
        return (d[q] == d[kv]) & (kv <= q)

    def ordered(b: Any, h: Any, q: Any, kv: Any, d: Any, lim: Any) -> Any:
        return d[kv] <= d[q] + lim

    def mixed(b: Any, h: Any, q: Any, kv: Any, d: Any, lim: Any) -> Any:
        return d[clamp(q - kv + 3)] > lim

    def nested(b: Any, h: Any, q: Any, kv: Any, d: Any, lim: Any) -> Any:
        return d[clamp(d[kv])] != d[q]

    def branches(b: Any, h: Any, q: Any, kv: Any, d: Any, lim: Any) -> Any:
        return hk.where(kv < lim, d[q] != d[kv], d[kv] >= d[clamp(h)])

    made = [
        hk.trace_mask_mod(f, DOCS, LIM) for f in (causal_docs, ordered, mixed, nested, branches)
    ]
    return [document_hook(), *made]


TABLE_MASKS = _table_masks()


@st.composite
def table_case(draw: st.DrawFn) -> tuple[np.ndarray, Box, int]:
    """A table (sorted document ids of ragged lengths, or unsorted, or with few values), a box
    inside a problem no longer than the table, and lim."""
    n = draw(st.integers(TABLE_MIN, 12 * CHUNK))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["sorted", "unsorted", "few"]))
    if kind == "sorted":
        t = np.sort(rng.integers(0, draw(st.integers(1, 40)), n)).astype(np.int32)
    elif kind == "unsorted":
        t = rng.integers(-(2**31), 2**31 - 1, n).astype(np.int32)
    else:
        t = rng.integers(0, 3, n).astype(np.int32)
    tq, tk = draw(st.integers(1, n)), draw(st.integers(1, n))
    q = sorted(draw(st.lists(st.integers(0, tq - 1), min_size=2, max_size=2)))
    k = sorted(draw(st.lists(st.integers(0, tk - 1), min_size=2, max_size=2)))
    box = Box(q[0], q[1], k[0], k[1], 0, draw(st.integers(0, 3)), tq, tk)
    return t, box, draw(st.integers(-5, 40))


def test_the_masks_reading_a_table_at_ranges_are_the_summarized_ones() -> None:
    assert [a.name for a in summarized_aux(document_hook())] == ["doc_ids"]
    assert all(summarized_aux(m) == (DOCS,) for m in TABLE_MASKS)

    # one index per tile (h), a 2-D table, a float table, a score path: no summary
    def per_head(b: Any, h: Any, q: Any, kv: Any, w: Any) -> Any:
        return kv <= q + w[h]

    assert summarized_aux(hk.trace_mask_mod(per_head, hk.Aux("w", "int32", 1))) == ()
    assert summarized_aux(window_hook()) == () and summarized_aux(causal_hook()) == ()


@given(table_case())
def test_masks_reading_tables_at_ranges_are_sound_with_summaries(
    case: tuple[np.ndarray, Box, int],
) -> None:
    t, box, lim = case
    aux = {"doc_ids": t, "lim": lim}
    summaries = {"doc_ids": summarize(t)}
    for hook in TABLE_MASKS:
        got, want = classify(hook, box, aux, summaries), brute_force(hook, box, aux)
        assert got in (want, SOME), (hook.name, box, lim)
        assert classify(hook, box, aux) in (want, SOME)  # without a summary too


def _sorted_docs(rng: random.Random, n: int) -> np.ndarray:
    """Sorted document ids of ragged lengths (1 to 300 tokens each), ids with gaps."""
    ids: list[int] = []
    doc = 0
    while len(ids) < n:
        doc += rng.randint(1, 3)
        ids += [doc] * rng.randint(1, 300)
    return np.asarray(ids[:n], np.int32)


def test_document_tiles_on_sorted_ids_are_exact() -> None:
    """Boxes whose sides are whole chunks (tile-aligned tiles: 64, 128, 192 rows or keys): on
    sorted ids every box the mask keeps whole (one document on both sides) is ALL and every
    box it drops whole (two disjoint documents) is NONE."""
    hook, rng, seen = document_hook(), random.Random(3), set()
    for _ in range(400):
        n = rng.randint(CHUNK, 40 * CHUNK)
        t = _sorted_docs(rng, n)
        nc = -(-n // CHUNK)
        sides = []
        for _side in range(2):
            a = rng.randrange(nc)
            b = min(a + rng.choice([0, 0, 1, 2, 5]), nc - 1)
            sides.append((a * CHUNK, min(b * CHUNK + CHUNK, n) - 1))
        box = Box(*sides[0], *sides[1], 0, 0, n, n)
        aux = {"doc_ids": t}
        want = brute_force(hook, box, aux)
        got = classify(hook, box, aux, {"doc_ids": summarize(t)})
        assert got == want, (box, t[box.q_lo : box.q_hi + 1], t[box.kv_lo : box.kv_hi + 1])
        seen.add(want)
    assert seen == {SOME, ALL, NONE}


def test_a_box_in_one_document_is_all_and_in_two_is_none() -> None:
    t = np.repeat(np.asarray([4, 9, 11], np.int32), [300, 200, 90])  # ragged, not chunk-aligned
    hook, s = document_hook(), {"doc_ids": summarize(t)}
    aux = {"doc_ids": t}
    n = t.size
    # rows and keys of document 4 (chunks 0..3, all of it): kept whole
    assert classify(hook, Box(0, 255, 64, 191, 0, 0, n, n), aux, s) == ALL
    # rows of document 9 (chunks 5..6), keys of document 4 (chunks 0..3): dropped whole
    assert classify(hook, Box(320, 447, 0, 255, 0, 0, n, n), aux, s) == NONE
    # the last, short chunk (document 11 only) against all of document 9's whole chunks
    assert classify(hook, Box(576, 589, 320, 447, 0, 0, n, n), aux, s) == NONE
    # a chunk straddling documents 4 and 9 (256..319): unknown, though the box sits in 4
    assert classify(hook, Box(256, 299, 0, 63, 0, 0, n, n), aux, s) == SOME
    assert brute_force(hook, Box(256, 299, 0, 63, 0, 0, n, n), aux) == ALL


def test_summaries_must_be_of_tables_the_mask_reads() -> None:
    t = np.zeros(64, np.int32)
    with pytest.raises(ValueError, match=r"summaries of \['ids'\]: the mask reads no rank-1"):
        classify(document_hook(), Box(0, 1, 0, 1, 0, 0, 8, 8), {"doc_ids": t},
                 {"ids": summarize(t)})  # fmt: skip


def test_a_verdict_with_summaries_on_a_larger_box_is_never_sharper() -> None:
    rng = random.Random(5)
    for _ in range(300):
        hook = rng.choice(TABLE_MASKS)
        n = rng.randint(TABLE_MIN, 900)
        t = (
            _sorted_docs(rng, n)
            if rng.random() < 0.7
            else np.asarray([rng.randint(0, 5) for _ in range(n)], np.int32)
        )
        aux, s = {"doc_ids": t, "lim": rng.randint(0, 9)}, {"doc_ids": summarize(t)}
        q, k = (
            sorted(rng.randrange(n) for _ in range(2)),
            sorted(rng.randrange(n) for _ in range(2)),
        )
        outer = Box(q[0], q[1], k[0], k[1], 0, 0, n, n)
        qi = sorted(rng.randint(q[0], q[1]) for _ in range(2))
        ki = sorted(rng.randint(k[0], k[1]) for _ in range(2))
        inner = Box(qi[0], qi[1], ki[0], ki[1], 0, 0, n, n)
        big = classify(hook, outer, aux, s)
        if big != SOME:
            assert classify(hook, inner, aux, s) == big, (hook.name, outer, inner)
