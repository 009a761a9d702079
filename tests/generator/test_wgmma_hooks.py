"""Hooks compiled into family wgmma's forward (templates/wgmma.cu.j2): names, spec rules, the
ABI after the tensor maps, the hook calls in the source, unhooked renders untouched, nvcc."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from flashgen.generator import abi
from flashgen.generator import hooks as hk
from flashgen.generator import render as rd
from flashgen.generator.compile import compile_kernel
from flashgen.generator.features import hook as fh
from flashgen.generator.hooks import library
from flashgen.generator.hooks.summary import summarize
from flashgen.generator.hooks.tiles import Box, TileClass, classify
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError

WG = KernelSpec(family="wgmma", d=128, dtype="bf16", causal=True)
NONE = TileClass.NONE


def _sinks(b, h, q_idx, kv_idx, left, right):
    """StreamingLLM: 4 sink keys and a window; the tiles between them are dropped whole."""
    return (kv_idx < 4) | library.window_mask(b, h, q_idx, kv_idx, left, right)


def sinks_hook() -> hk.Hook:
    return hk.trace_mask_mod(_sinks, *library.WINDOW_AUX)


def _bias_score(score, b, h, q_idx, kv_idx, bias, scale2):
    return score * scale2 + bias[h, hk.minimum(kv_idx, 15)]


BIAS_HOOK = hk.trace_score_mod(
    _bias_score, hk.Aux("bias", "float32", 2), hk.Aux("scale2", "float32", 0)
)


def hooked(*hooks: hk.Hook, **changes: object) -> KernelSpec:
    """WG with `changes` and the hooks (their tokens after any other features)."""
    features = (*changes.pop("features", ()), *(fh.token_of(h) for h in hooks))  # type: ignore[misc]
    if "br" in changes:  # warps follow br in family wgmma
        changes.setdefault("warps", 0)
    return WG.replace(**changes, features=features)


# ---- names and rules -----------------------------------------------------------------------------
def test_a_hooked_wgmma_forward_is_named_by_its_hooks_and_round_trips():
    cap, doc = library.softcap_hook(), library.document_hook()
    spec = hooked(cap, doc, features=("window",))
    assert spec.name.startswith("flash_fwd_wgmma_d128_br128_bc128_bf16_causal_window_")
    assert f"_scoremod{cap.digest}_maskmod{doc.digest}_s2" in spec.name
    assert KernelSpec.from_name(spec.name) == spec


@pytest.mark.parametrize(
    ("hooks", "changes", "rule"),
    [
        ((library.softcap_hook,), {"features": ("varlen",)}, "varlen with scoremod"),
        ((library.causal_hook,), {"features": ("varlen",)}, "packed-sequence forward takes no"),
        ((library.alibi_hook,), {"d": 64, "br": 192}, "a scoremod hook with br=192"),
        ((library.softcap_hook,), {"features": ("alibi",)}, "write the built-in score mod"),
        ((library.softcap_hook, library.alibi_hook), {}, "2 scoremod hooks"),
    ],
)
def test_spec_rules_refuse_what_the_hooked_wgmma_forward_does_not_do(hooks, changes, rule):
    with pytest.raises(SpecError, match=rule):
        hooked(*(m() for m in hooks), **changes)


def test_the_refusal_names_the_families_that_take_hooks():
    causal = fh.token_of(library.causal_hook())
    with pytest.raises(SpecError) as forward:
        KernelSpec(family="simt", d=64, dtype="fp32", features=(causal,))
    assert "families whose forward takes maskmod hooks: mma, wgmma" in str(forward.value)
    # wgmma's backward takes them too (tests/generator/test_wgmma_bwd_hooks.py)
    assert hooked(library.softcap_hook(), direction="bwd", br=64).direction == "bwd"


# ---- the ABI: tensor maps, heads, batch, the forward's, then the aux block -----------------------
def test_only_hooked_wgmma_variants_take_the_aux_block_after_the_prefix():
    spec = hooked(library.document_hook())
    names = [p["decl"].split()[-1].rstrip(",") for p in rd.abi_params(spec)]
    prefix = [p.name for p in spec.fam.fwd_prefix]
    assert names[: len(prefix)] == prefix == ["tm_q", "tm_k", "tm_v", "n_heads", "n_batch"]
    assert names[len(prefix) :] == [p.name for p in (*abi.FWD, *abi.HOOK_PARAMS)]
    plain = [p["decl"] for p in rd.abi_params(WG)]
    # a plain dense forward stores O with the TMA (O_TMA_STORE): O's map after V's
    assert len(plain) == len(prefix) + 1 + len(abi.FWD) and "hook" not in repr(plain)
    assert "tm_o" in plain[3]
    src = rd.render(spec).source
    sig = src[src.index(f" {spec.name}(") :]
    assert sig[: sig.index("{")].rstrip().endswith("const int hook_i3)")


# ---- the source ----------------------------------------------------------------------------------
def test_the_source_calls_the_hooks_in_the_softmax_on_the_natural_log_score():
    doc = library.document_hook()
    src = rd.render(hooked(BIAS_HOOK, doc, features=("window",))).source
    name = f"score_mod_{BIAS_HOOK.digest}_logit"
    assert f"__device__ __forceinline__ float {name}(float s, float s_scale, int b, int h" in src
    # the lowered logit (hooks/fold.py): raw score and scale in, base-2 logit out; the row and
    # key as clamped indices and as base + constant offset
    call = re.search(rf"s_acc\[i\] = {name}\((.*)\);", src)
    assert call is not None
    assert call[1] == (
        "s_acc[i], hook_scale, batch, head, hrow[h], hkey(x), rg, 8 * h, kb, x, tq, tk, "
        "static_cast<const float*>(hook_ptr0), hook_stride0, hook_f0"
    )
    mask = f"mask_mod_{doc.digest}"
    assert (
        f"if (!{mask}(batch, head, hrow[h], hkey(x), tq, tk, static_cast<const int*>(hook_ptr1)))"
        " s_acc[i] = -INFINITY;" in src
    )
    # the natural-log score, and indices inside the problem only (clamped, per row per tile)
    assert "const float hook_scale = scale_log2 * LN2;" in src
    assert "const int hrow[2] = {min(rg, tq - 1), min(rg + 8, tq - 1)};" in src
    assert "decltype(masked)::value ? min(kb + x, tk - 1) : kb + x;" in src
    # every tile takes the score_mod, the tiles that take a mask the mask_mod; logits in base 2
    assert "if constexpr (SCORE_MOD || HOOK_SCORE || decltype(masked)::value) {" in src
    assert "if constexpr (HOOK_MASK && decltype(masked)::value) {" in src
    assert "const float sl = SCORE_MOD || HOOK_SCORE ? 1.0f : scale_log2;" in src
    # order inside the element loop: score_mod, mask_mod, then the built-in masks
    loop = src[src.index("if constexpr (HOOK_SCORE)") :]
    assert loop.index("HOOK_MASK") < loop.index("if constexpr (WINDOW && decltype(masked)::value)")


def test_a_mask_hook_skips_the_tiles_it_drops_whole_in_producer_and_consumers():
    window = library.window_hook()
    src = rd.render(hooked(window, causal=False)).source
    verdict = f"mask_mod_{window.digest}_tile"
    assert f"__device__ __forceinline__ int {verdict}(int b, int h, int q_lo, int q_hi," in src
    assert "constexpr int FG_TILE_NONE = FG_FALSE, FG_TILE_ALL = FG_TRUE" in src
    # rows and keys clamped into the problem, the aux scalars from the block
    call = f"return {verdict}(batch, head, q0, min(q0 + BR, tq) - 1, lo * BC,"
    assert src.count(call) == 2  # the producer's walk and the consumers': the same tiles
    assert src.count("min(hi * BC + BC, tk) - 1, tq, tk, hook_i0, hook_i1);") == 2
    # producer and consumers walk the kept tiles the same way, a warp at a time: 32 verdicts
    # (one per lane) per word, as two ballots; no count pass before the item's first load
    assert "if (threadIdx.x < 32) {" in src and "const bool issuer = lane == 0;" in src
    assert src.count("if (!issuer) return;") == 2  # load_k, load_v: lane 0 issues the TMA
    assert src.count("kept_word = __ballot_sync(0xffffffffu, v != FG_TILE_NONE);") == 2
    assert src.count("whole_word = __ballot_sync(0xffffffffu, v == FG_TILE_ALL);") == 2
    assert src.count("const int first_tile = next_kept(span.end);") == 2
    assert "tile_verdict(t) != FG_TILE_NONE)" not in src  # the old count pass
    assert "kept_below" not in src and "if (tiles_verdict(lo, t) == FG_TILE_NONE) {" not in src
    assert "if (first_tile < span.first) continue;" in src
    walk = "for (int t = next_kept(first_tile); t >= span.first; t = next_kept(t), ++n_tiles) {"
    assert src.count(walk) == 1
    assert src.index(walk) < src.index("consumers =====")
    assert "const int n_tiles = span.end - span.first;" not in src
    # the producer loads the kept tiles in step order; the consumers compute the same ones,
    # each step knowing the next kept tile (the last step releases Q)
    assert "load_k(n_tiles, t);" in src and "load_v(n_tiles - 1, prev);" in src
    assert "const int kv0 = tile * BC;" in src
    assert "const int kv0 = (span.end - 1 - it) * BC;" not in src
    assert "int next = next_kept(tile);" in src and "next = next_kept(tile);" in src
    assert "if (next < span.first) release(q_empty);" in src
    assert "if (last) release(q_empty);" in src
    # a kept tile takes the element-wise mask when the hook keeps only some of its keys, asked
    # before the walk moves to the next word
    assert "|| !whole(t);" in src
    ask, move = "const bool masked = needs_mask(tile);", "next = next_kept(tile);\n"
    assert src.index(ask) < src.index(move, src.index(ask))
    assert "if (masked) step(n_tiles, Flag<true>{}, last);" in src
    assert "else step(n_tiles, Flag<false>{}, last);" in src
    assert "clear_lo" not in src


def _kept_below(verdict, first: int, t: int) -> int:
    """The template's kept_below (hook_tile_walk), transcribed: runs of w tiles at once."""
    w = 1
    t -= 1
    while t >= first:
        lo = max(t - w + 1, first)
        if verdict(lo, t) == NONE:
            t, w = lo - 1, w * 2
        elif w == 1:
            break
        else:
            w //= 2
    return t


@pytest.mark.parametrize("make", [library.causal_hook, library.window_hook, sinks_hook])
def test_the_walk_visits_exactly_the_tiles_whose_own_verdict_keeps_a_key(make):
    """Producer (the walk) and consumers (a count of single-tile verdicts) agree, and the walk
    crosses a run of dropped tiles in a few verdicts."""
    hook, br, bc = make(), 128, 128
    aux = {"window_left": 1000, "window_right": 0}
    for tq, tk in [(8192, 8192), (1000, 9000), (9000, 1000), (3000, 3000)]:
        for q0 in range(0, tq, br * 7):
            box = lambda lo, hi, q0=q0, tq=tq, tk=tk: Box(  # noqa: E731
                q0, min(q0 + br, tq) - 1, lo * bc, min(hi * bc + bc, tk) - 1, 0, 0, tq, tk
            )
            calls = [0]

            def verdict(lo, hi, box=box, calls=calls):
                calls[0] += 1
                return classify(hook, box(lo, hi), aux)

            n = -(-tk // bc)
            kept = [t for t in reversed(range(n)) if classify(hook, box(t, t), aux) != NONE]
            walked, t = [], _kept_below(verdict, 0, n)
            while t >= 0:
                walked.append(t)
                t = _kept_below(verdict, 0, t)
            assert walked == kept
            runs = sum(1 for i, t in enumerate(kept) if i == 0 or kept[i - 1] != t + 1) + 1
            assert calls[0] <= len(kept) + 2 * runs * (n.bit_length() + 1)


def test_the_walk_skips_other_documents_tiles_with_range_summaries():
    """16 packed documents of random lengths at T = 8192 (rows and keys one sequence): with the
    doc_ids summary the walk visits exactly the tiles whose own verdict keeps a key, those are
    the tiles that share a document with the rows (no more), and it crosses the others in a
    few verdicts; without the summary every tile is kept (the element-wise path)."""
    hook, br, bc, t = library.document_hook(), 128, 128, 8192
    rng = np.random.default_rng(4)
    cuts = np.sort(rng.choice(np.arange(1, t), 15, replace=False))
    ids = np.repeat(np.arange(16, dtype=np.int32), np.diff([0, *cuts, t]))
    aux, summaries = {"doc_ids": ids}, {"doc_ids": summarize(ids)}
    n = t // bc
    total_kept = 0
    for q0 in range(0, t, br):
        box = lambda lo, hi, q0=q0: Box(  # noqa: E731
            q0, min(q0 + br, t) - 1, lo * bc, min(hi * bc + bc, t) - 1, 0, 0, t, t
        )
        calls = [0]

        def verdict(lo, hi, box=box, calls=calls):
            calls[0] += 1
            return classify(hook, box(lo, hi), aux, summaries)

        rows = set(ids[q0 : q0 + br].tolist())
        shares = [u for u in reversed(range(n)) if rows & set(ids[u * bc : u * bc + bc].tolist())]
        kept = [u for u in reversed(range(n)) if verdict(u, u) != NONE]
        assert kept == shares, q0
        calls[0] = 0
        walked, u = [], _kept_below(verdict, 0, n)
        while u >= 0:
            walked.append(u)
            u = _kept_below(verdict, 0, u)
        assert walked == kept
        runs = sum(1 for i, u in enumerate(kept) if i == 0 or kept[i - 1] != u + 1) + 1
        assert calls[0] <= len(kept) + 2 * runs * (n.bit_length() + 1)
        total_kept += len(kept)
        assert classify(hook, box(0, n - 1), aux) != NONE  # no summary: nothing dropped
    assert total_kept < n * n // 4  # most tiles are another document's: skipped


def test_a_score_only_variant_walks_every_tile_of_the_span():
    src = rd.render(hooked(library.softcap_hook())).source
    assert "kept_below" not in src and "FG_TILE" not in src
    assert "const int n_tiles = span.end - span.first;" in src
    assert "const int kv0 = (span.end - 1 - it) * BC;" in src and "clear_lo" in src


def test_a_mask_only_variant_keeps_the_plain_scale():
    src = rd.render(hooked(library.causal_hook(), causal=False)).source
    assert "constexpr bool HOOK_SCORE = false;" in src and "hook_scale" not in src
    assert "const float sl = SCORE_MOD || HOOK_SCORE ? 1.0f : scale_log2;" in src


def test_unhooked_wgmma_forwards_render_no_hook_code():
    """Every shipped wgmma forward, and the varlen ones: the hook code is Jinja-guarded, so an
    unhooked render is the template's output before hooks (scripts/dev/render_identity.py
    compares the bytes across trees)."""
    specs = [s for s in shipped("wgmma")] + [WG.replace(features=("varlen", "window", "softcap"))]
    for spec in specs:
        src = rd.render(spec).source
        assert "hook" not in src.lower(), spec.name


# ---- nvcc ----------------------------------------------------------------------------------------
SETS = {
    "softcap": (library.softcap_hook,),
    "alibi": (library.alibi_hook,),
    "causal": (library.causal_hook,),
    "window": (library.window_hook,),
    "document": (library.document_hook,),
    "prefix_lm": (library.prefix_lm_hook,),
    "softcap+document": (library.softcap_hook, library.document_hook),
}


@pytest.mark.compile_all
def test_a_custom_aux_table_hook_compiles_without_spills(nvcc_required: Path):
    """A 2-D aux table and a float scalar. (Beside document_hook() it spills with ptxas 13.0:
    28 B at d 64 fp16, 72 B at d 128 bf16 causal: two per-key aux loads per score, which ptxas
    issues ahead for the whole unrolled tile, next to O, S and P.)"""
    spec = hooked(BIAS_HOOK, d=64, dtype="fp16", causal=False)
    assert compile_kernel(spec, "sm_90a").report.spill_bytes == 0


@pytest.mark.compile_all
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("name", list(SETS))
def test_library_hooks_compile_without_spills_in_wgmma(name, d, dtype, causal, nvcc_required):
    spec = hooked(*(m() for m in SETS[name]), d=d, br=128, bc=128, dtype=dtype, causal=causal)
    report = compile_kernel(spec, "sm_90a").report
    assert report.spill_bytes == 0, f"{spec.name}: spills {report.spill_bytes} B"
