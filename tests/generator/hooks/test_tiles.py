"""A mask_mod's verdict on a tile (hooks/tiles.py, and its C++ from hooks/cuda.py) against the
oracle's value of every element: never ALL or NONE unless true (random masks), exactly the truth
for the library's causal, window and prefix-LM masks, and the C++ run on the host giving the
Python verdict."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flashgen.generator import hooks as hk
from flashgen.generator.hooks.cuda import HOST_DEVICE, emit_tile_class, tile_helpers
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
from flashgen.generator.hooks.tiles import Box, TileClass, brute_force, classify, clip

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
    inputs = {
        "b": box.b,
        "h": box.h,
        "q_idx": np.arange(box.q_lo, box.q_hi + 1).reshape(-1, 1),
        "kv_idx": np.arange(box.kv_lo, box.kv_hi + 1).reshape(1, -1),
        "q_len": box.q_len,
        "kv_len": box.kv_len,
    }
    values = evaluate_many(ints, inputs, aux)
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
    docs = emit_tile_class(document_hook(), "d")
    assert "fg_ir_load(doc_ids, fg_irange{q_lo, q_hi})" in docs
    floats = emit_tile_class(hk.trace_mask_mod(lambda b, h, q, kv: hk.to_float(kv) < 0.5), "f")
    assert "return FG_EITHER;" in floats or "= FG_EITHER;" in floats


def _host_program(hooks: dict[str, hk.Hook], cases: list[tuple[Box, dict[str, Any]]]) -> str:
    """C++ that prints every hook's tile verdict on every case, one line per case (the cases
    as tables, one loop: a host compiler takes minutes over thousands of inlined calls)."""
    src = [tile_helpers(), "#include <cstdio>\n"]
    for name, hook in hooks.items():
        src.append(emit_tile_class(hook, f"tile_{name}", HOST_DEVICE))
    fields = ("b", "h", "q_lo", "q_hi", "kv_lo", "kv_hi", "q_len", "kv_len")
    scalars = ("lim", "window_left", "window_right", "prefix")
    n = len(cases)
    for f in fields:
        values = ", ".join(str(getattr(box, f)) for box, _ in cases)
        src.append(f"static const int c_{f}[{n}] = {{{values}}};")
    for f in scalars:
        src.append(f"static const int c_{f}[{n}] = {{{', '.join(str(a[f]) for _, a in cases)}}};")
    ids = ", ".join(str(int(x)) for _, a in cases for x in a["ids"])
    src.append(f"static const int c_ids[{n * IDS_SIZE}] = {{{ids}}};")
    calls = []
    for name, hook in hooks.items():
        args = [f"c_{f}[i]" for f in fields]
        for a in hook.aux:
            args.append(
                {"ids": f"c_ids + i * {IDS_SIZE}", "gain": "1.5f"}.get(a.name, f"c_{a.name}[i]")
            )
        calls.append(f'    printf(" %d", tile_{name}({", ".join(args)}));')
    body = [f"int main() {{\n  for (int i = 0; i < {n}; ++i) {{", *calls]
    body.append('    printf("\\n");\n  }\n  return 0;\n}\n')
    return "\n".join(src + body)


@pytest.mark.compile_all  # nvcc and a host run: with the compile-everything check
def test_cpp_verdicts_on_the_host_match_python(nvcc_required: Path, tmp_path: Path) -> None:
    hooks = {"causal": causal_hook(), "window": window_hook(), "prefix": prefix_lm_hook()}
    hooks.update({f"random_{s}": random_mask_hook(s) for s in range(24)})
    rng = random.Random(11)
    cases = [(random_box(rng), mask_aux(rng)) for _ in range(120)]
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
    for line, (box, aux) in zip(lines, cases, strict=True):
        got = [TileClass(int(v)) for v in line.split()]
        want = [classify(hook, box, aux) for hook in hooks.values()]
        assert got == want, (box, aux)
