"""Hooks compiled into family wgmma's backward (templates/wgmma_bwd.cu.j2): names, spec rules,
the ABI after the tensor maps (as family mma's hooked backward), the hook calls in the source,
the walk over the query tiles a mask_mod keeps, unhooked renders untouched, nvcc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashgen.generator import abi
from flashgen.generator import render as rd
from flashgen.generator.backward import kernel_names
from flashgen.generator.compile import compile_kernel
from flashgen.generator.features import hook as fh
from flashgen.generator.hooks import Hook, library
from flashgen.generator.hooks.tiles import Box, TileClass, classify
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError
from tests.generator.test_wgmma_hooks import BIAS_HOOK, sinks_hook

BWD = KernelSpec(family="wgmma", d=128, dtype="bf16", causal=True, direction="bwd")
NONE = TileClass.NONE


def hooked(*hooks: Hook, **changes: object) -> KernelSpec:
    """BWD with `changes` and the hooks (their tokens after any other features)."""
    features = (*changes.pop("features", ()), *(fh.token_of(h) for h in hooks))  # type: ignore[misc]
    return BWD.replace(**changes, features=features)


# ---- names and rules -----------------------------------------------------------------------------
def test_a_hooked_wgmma_backward_is_named_by_its_hooks_and_round_trips():
    cap, doc = library.softcap_hook(), library.document_hook()
    spec = hooked(cap, doc, features=("window",))
    assert spec.name.startswith("flash_bwd_wgmma_d128_br64_bc128_bf16_causal_window_")
    assert f"_scoremod{cap.digest}_maskmod{doc.digest}_s2" in spec.name
    assert KernelSpec.from_name(spec.name) == spec


@pytest.mark.parametrize(
    ("hooks", "changes", "rule"),
    [
        ((library.softcap_hook,), {"features": ("varlen",)}, "packed-sequence backward takes no"),
        ((library.causal_hook,), {"features": ("varlen",)}, "varlen with maskmod"),
        ((library.softcap_hook,), {"features": ("softcap",)}, "write the built-in score mod"),
        ((library.softcap_hook, library.alibi_hook), {}, "2 scoremod hooks"),
        ((library.causal_hook,), {"features": ("deterministic",)}, "deterministic"),
        ((library.causal_hook,), {"d": 64, "br": 128}, "128-row query tile is for dense kernels"),
    ],
)
def test_spec_rules_refuse_what_the_hooked_wgmma_backward_does_not_do(hooks, changes, rule):
    with pytest.raises(SpecError, match=rule):
        hooked(*(m() for m in hooks), **changes)


def test_the_backward_takes_a_mask_hook_beside_the_built_in_features():
    spec = hooked(library.document_hook(), features=("window", "softcap"), d=64, dtype="fp16")
    assert spec.fam.name == "wgmma" and spec.direction == "bwd"


# ---- the ABI: tensor maps, the backward's arguments, then the aux block --------------------------
def test_only_hooked_wgmma_backwards_take_the_aux_block_after_the_backward_abi():
    spec = hooked(library.document_hook())
    names = [p["decl"].split()[-1].rstrip(",") for p in rd.abi_params(spec)]
    prefix = [p.name for p in spec.fam.bwd_prefix]
    assert names[: len(prefix)] == prefix == ["tm_q", "tm_k", "tm_v", "tm_do"]
    # the mma hooked backward's list (runtime.backward.Prepared launches both alike)
    assert names[len(prefix) :] == [p.name for p in abi.backward(spec.features)]
    assert names[-len(abi.HOOK_PARAMS) :] == [p.name for p in abi.HOOK_PARAMS]
    plain = [p["decl"] for p in rd.abi_params(BWD)]
    assert len(plain) == len(prefix) + len(abi.BWD) and "hook" not in repr(plain)
    src = rd.render(spec).source
    # all three kernels take the block (one argument list)
    for kernel in kernel_names(spec):
        sig = src[src.index(f" {kernel}(") :]
        assert sig[: sig.index("{")].rstrip().endswith("const int hook_i3)"), kernel


# ---- the source ----------------------------------------------------------------------------------
def _element_loop(src: str) -> str:
    start = src.index("auto probabilities = [&](auto mask) {")
    return src[start : src.index("probabilities(Flag<true>{})", start)]


def test_a_score_hook_recomputes_p_with_the_forwards_logit_and_its_derivative():
    cap = library.softcap_hook()
    src = rd.render(hooked(cap, causal=False)).source
    grad = f"score_mod_{cap.digest}_logit_grad"
    assert f"__device__ __forceinline__ float {grad}(float s, float s_scale, int b, int h" in src
    assert "float softcap, float& dscore) {" in src
    loop = _element_loop(src)
    call = re.search(rf"x = fast_exp2\({grad}\((.*?)\) - l2\[2 \* nt \+ e\]\);", loop, re.S)
    assert call is not None
    assert re.sub(r"\s+", " ", call[1]) == (
        "x, hook_scale, batch, head, hq, hk, q0 + 2 * t, 8 * nt + e, kc0 + r0, 8 * h, tq, tk, "
        "hook_f0, f"
    )
    # P^T packed per n-tile as dV's A fragments; s_acc keeps P o f (dS's weight), after the
    # masks, which zero f with P (dS exactly 0 there)
    assert "pv[2 * h + e] = x;\n              x *= f;" in loop
    assert loop.index("decltype(mask)::value") < loop.index("pv[2 * h + e] = x;")
    assert loop.count("f = 0.0f;") == 1  # the built-in mask's (no mask hook here)
    assert "p_frag[nt / 2][(nt % 2) * 2 + 1] = pack2(pv[2], pv[3]);" in loop
    assert "pack_frag(s_acc, p_frag);" not in src
    # dS^T = (P o f) o (dP^T - D) after dP^T lands, as the plain kernel's (no wait for dP^T
    # before P, unlike the built-in softcap's); D read after P, not held through the hook
    assert "dp_acc[i] = s_acc[i] * (dp_acc[i] - dd[2 * nt + e]);" in src
    fence = src.index("fence_regs(s_acc);")
    assert "HOOK_DFAC" not in src[fence - 300 : fence]
    assert "if constexpr (!SOFTCAP) columns(ld, dd);" in src
    assert "constexpr bool HOOK_DFAC = true;" in src
    assert "const float hook_scale = scale_log2 * LN2;" in src
    # the built-in score mod's code is not rendered beside the hook
    assert "bwd_logit(sm, x" not in loop
    # no mask hook: every step is walked
    assert "kept_from" not in src and "FG_TILE" not in src
    assert "for (int step = 0; step < n_steps; ++step) {" in src


def test_a_bias_score_hook_keeps_no_derivative():
    alibi = library.alibi_hook()
    src = rd.render(hooked(alibi)).source
    assert "constexpr bool HOOK_DFAC = false;" in src and "_logit_grad(" not in src
    loop = _element_loop(src)
    assert f"x = fast_exp2(score_mod_{alibi.digest}_logit(x, hook_scale" in loop
    assert "static_cast<const float*>(hook_ptr0)) - l2[2 * nt + e]);" in loop
    assert ", f)" not in loop and "dp_acc" not in loop  # dS^T after dP^T lands, as the plain


def test_the_logit_grad_returns_the_forwards_logit():
    """P must be the forward's: the value the backward's function returns is the text of the
    forward's lowered logit (hooks/fold.py), whatever it shares with the derivative."""
    for hook in (library.softcap_hook(), BIAS_HOOK):
        fwd = fh.template_context((fh.token_of(hook),))["hook_logit_source"]
        bwd = fh.template_context((fh.token_of(hook),))["hook_logit_grad_source"]
        value = re.findall(r"return (.*);", fwd)[-1]  # the logit's (the helpers' come first)
        # the backward names a shared subexpression (t0); substitute it back
        for name, text in re.findall(r"const float (t\d+) = (.*);", bwd):
            value = value.replace(text, name)
        assert f"return {value};" in bwd


def test_a_mask_hook_skips_the_query_tiles_it_drops_whole_in_producer_and_consumers():
    window = library.window_hook()
    src = rd.render(hooked(window, causal=False)).source
    verdict = f"mask_mod_{window.digest}_tile"
    assert f"__device__ __forceinline__ int {verdict}(int b, int h, int q_lo, int q_hi," in src
    # rows of the query tiles, keys of the block, clamped into the problem
    assert (
        f"return {verdict}(batch, head, ql * BR, min(qh * BR + BR, tq) - 1, kl, min(kh, tk - 1), "
        "tq,\n        tk, hook_i0, hook_i1);" in src
    )
    # producer and consumers walk the same kept steps, each a whole warp a 32-step verdict word
    # at a time (one step per lane; the producer's lane 0 issues the loads); the ring counts
    # only those steps
    assert "kept_from" not in src
    assert "if (threadIdx.x < 32) {" in src and "const bool issuer = lane == 0;" in src
    assert (
        "for (int it = 0, step = next_kept(0); step < n_steps; ++it, step = next_kept(step + 1)) {"
        in src
    )
    assert src.index("step = next_kept(step + 1)) {") < src.index("consumers =====")
    assert "int next = next_kept(0);" in src and "next = next_kept(step + 1);" in src
    assert src.count("v = verdict(hd, j, j, kv0, kv0 + BC - 1);") == 2
    assert src.count("kept_word = __ballot_sync(0xffffffffu, v != FG_TILE_NONE);") == 2
    assert src.count("whole_word = __ballot_sync(0xffffffffu, w == FG_TILE_ALL);") == 1
    assert "for (int step = 0; step < n_steps; ++step) {" not in src
    assert src.count("const int s = it % STAGES, phase = ((it / STAGES) & 1) ^ 1;") == 1
    assert src.count("const int s = it % STAGES, phase = (it / STAGES) & 1;") == 1
    assert "elem_t* dst = ds_wg + (it & 1) * 64 * BR;" in src
    assert "(kk / 4) * 2 + (it & 1)) * 64 * BR" in src
    assert "const bool my_dq = DQ_SPLIT || it % CONSUMERS == c;" in src
    # the next kept step's D and LSE rows are prefetched
    assert "if (next < n_steps && lane < 4) {" in src
    assert "const int nh = kv_head * kv_group + next / per_head;" in src
    # a consumer whose keys the hook keeps whole takes no element-wise hook mask
    assert "if (v != FG_TILE_NONE) w = verdict(hd, j, j, min(kc0, tk - 1), kc0 + 63);" in src
    assert "whole_word = __ballot_sync(0xffffffffu, w == FG_TILE_ALL);" in src
    assert "const bool hook_some = !step_whole;" in src
    assert "if (masked || hook_some) probabilities(Flag<true>{}); else" in src
    loop = _element_loop(src)
    drop = f"if (!mask_mod_{window.digest}(batch, head, hq, hk, tq, tk, hook_i0, hook_i1)) x = 0.0f"
    assert loop.count(drop) == 2  # both built-in score paths (SCORE_MOD or not), inside the mask
    assert "const int hq = min(qi, tq - 1), hk = min(kj, tk - 1);" in loop


class _Walk:
    """The template's step_walk, transcribed: a word of 32 steps' verdicts (one per lane) at a
    time; `words` counts the words evaluated (each one round of the warp's verdicts)."""

    def __init__(self, verdict, per_head: int, n_steps: int) -> None:
        self.verdict, self.per_head, self.n_steps = verdict, per_head, n_steps
        self.base, self.kept, self.words = -64, 0, 0

    def next_kept(self, step: int) -> int:
        while step < self.n_steps:
            base = step & ~31
            if base != self.base:
                self.kept, self.base = 0, base
                self.words += 1
                for lane in range(32):
                    mine = base + lane
                    if mine < self.n_steps:
                        j = mine % self.per_head
                        if self.verdict(mine // self.per_head, j, j) != NONE:
                            self.kept |= 1 << lane
            rest = self.kept & ((0xFFFFFFFF << (step - base)) & 0xFFFFFFFF)
            if rest:
                return base + (rest & -rest).bit_length() - 1
            step = base + 32
        return self.n_steps


@pytest.mark.parametrize("make", [library.causal_hook, library.window_hook, sinks_hook])
def test_the_walk_visits_exactly_the_steps_whose_own_verdict_keeps_a_key(make):
    """Over (head, query tile) steps of a key block: the walk's steps are those whose own
    verdict is not NONE, in order, and each word of 32 steps is evaluated once."""
    hook, br, bc, group = make(), 64, 128, 2
    aux = {"window_left": 700, "window_right": 0}
    for tq, tk in [(4096, 4096), (1000, 5000), (5000, 1000), (1500, 1500)]:
        n_q = -(-tq // br)
        for kv0 in range(0, tk, bc * 5):
            def verdict(head, ql, qh, kv0=kv0, tq=tq, tk=tk):
                box = Box(ql * br, min(qh * br + br, tq) - 1, kv0, min(kv0 + bc, tk) - 1, 0, head,
                          tq, tk)  # fmt: skip
                return classify(hook, box, aux)

            n_steps = group * n_q
            kept = [s for s in range(n_steps) if verdict(s // n_q, s % n_q, s % n_q) != NONE]
            walk = _Walk(verdict, n_q, n_steps)
            walked, s = [], walk.next_kept(0)
            while s < n_steps:
                walked.append(s)
                s = walk.next_kept(s + 1)
            assert walked == kept, (tq, tk, kv0)
            assert walk.words <= -(-n_steps // 32)


def test_a_mask_hook_beside_a_built_in_score_mod_keeps_it():
    causal = library.causal_hook()
    src = rd.render(hooked(causal, features=("softcap",), causal=False)).source
    loop = _element_loop(src)
    assert "x = fast_exp2(bwd_logit(sm, x, qi, kj, tq, tk, f) - l2[2 * nt + e]);" in loop
    assert "constexpr bool HOOK_SCORE = false;" in src and "hook_scale" not in src


def test_hooked_backwards_read_d_and_lse_from_global_memory():
    """The hooked kernels keep the global loads (their consumers sit at the register limit):
    no D/LSE rows in the ring, nor their shared memory."""
    spec = hooked(library.document_hook(), stages=3)
    src = rd.render(spec).source
    assert "bulk_load(" not in src and "LD_BYTES" not in src
    assert "prefetch.global.L1" in src
    assert spec.smem_bytes == BWD.replace(stages=3).smem_bytes - 4 * 2 * 3 * 64


def test_unhooked_wgmma_backwards_render_no_hook_code():
    """Every shipped wgmma backward, and a varlen one: the hook code is Jinja-guarded
    (scripts/dev/render_identity.py compares the bytes across trees)."""
    specs = [s for s in shipped("wgmma", direction="bwd")]
    specs.append(BWD.replace(features=("varlen", "window", "softcap")))
    assert specs
    for spec in specs:
        src = rd.render(spec).source
        assert "hook" not in src.lower(), spec.name
        assert "for (int step = 0; step < n_steps; ++step) {" in src


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
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("d", "dtype"), [(64, "fp16"), (128, "bf16")])
@pytest.mark.parametrize("name", sorted(SETS))
def test_the_hooked_wgmma_backward_compiles_without_spills(name, d, dtype, causal, nvcc_required):
    """Zero spills at both head dims (ptxas 13.0, sm_90a), but for softcap + document at d 128
    without causal: 28 B each way (a per-row and a per-key aux load per score beside the
    derivative, as the forward's two per-key tables; the causal variant fits)."""
    spec = hooked(*(m() for m in SETS[name]), d=d, dtype=dtype, causal=causal)
    spilled = compile_kernel(spec, "sm_90a").report.spill_bytes
    known = name == "softcap+document" and d == 128 and not causal
    assert spilled <= 56 if known else spilled == 0, (spec.name, spilled)


@pytest.mark.compile_all
def test_a_custom_aux_table_backward_compiles_without_spills(nvcc_required: Path):
    spec = hooked(BIAS_HOOK, d=128, dtype="bf16", causal=False)
    assert compile_kernel(spec, "sm_90a").report.spill_bytes == 0
