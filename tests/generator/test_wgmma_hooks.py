"""Hooks compiled into family wgmma's forward (templates/wgmma.cu.j2): names, spec rules, the
ABI after the tensor maps, the hook calls in the source, unhooked renders untouched, nvcc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashgen.generator import abi
from flashgen.generator import hooks as hk
from flashgen.generator import render as rd
from flashgen.generator.compile import compile_kernel
from flashgen.generator.features import hook as fh
from flashgen.generator.hooks import library
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError

WG = KernelSpec(family="wgmma", d=128, dtype="bf16", causal=True)


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
        ((library.window_hook,), {"d": 64, "br": 192}, "a maskmod hook with br=192"),
        ((library.softcap_hook,), {"features": ("alibi",)}, "write the built-in score mod"),
        ((library.softcap_hook, library.alibi_hook), {}, "2 scoremod hooks"),
        ((library.causal_hook,), {"direction": "bwd", "br": 64}, "wgmma's backward"),
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
    with pytest.raises(SpecError) as backward:
        hooked(library.softcap_hook(), direction="bwd", br=64)
    assert "families whose backward takes scoremod hooks: mma; use --family mma" in str(
        backward.value
    )


# ---- the ABI: tensor maps, heads, batch, the forward's, then the aux block -----------------------
def test_only_hooked_wgmma_variants_take_the_aux_block_after_the_prefix():
    spec = hooked(library.document_hook())
    names = [p["decl"].split()[-1].rstrip(",") for p in rd.abi_params(spec)]
    prefix = [p.name for p in spec.fam.fwd_prefix]
    assert names[: len(prefix)] == prefix == ["tm_q", "tm_k", "tm_v", "n_heads", "n_batch"]
    assert names[len(prefix) :] == [p.name for p in (*abi.FWD, *abi.HOOK_PARAMS)]
    plain = [p["decl"] for p in rd.abi_params(WG)]
    assert len(plain) == len(prefix) + len(abi.FWD) and "hook" not in repr(plain)
    src = rd.render(spec).source
    sig = src[src.index(f" {spec.name}(") :]
    assert sig[: sig.index("{")].rstrip().endswith("const int hook_i3)")


# ---- the source ----------------------------------------------------------------------------------
def test_the_source_calls_the_hooks_in_the_softmax_on_the_natural_log_score():
    doc = library.document_hook()
    src = rd.render(hooked(BIAS_HOOK, doc, features=("window",))).source
    name = f"score_mod_{BIAS_HOOK.digest}"
    assert f"__device__ __forceinline__ float {name}(float score, int b, int h" in src
    call = re.search(rf"s_acc\[i\] = {name}\((.*)\) \* LOG2E;", src)
    assert call is not None
    assert call[1] == (
        "s_acc[i] * hook_scale, batch, head, hrow[h], hkey(x), tq, tk, "
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
    # every tile takes the hooks; the logits leave them in base 2
    assert "if constexpr (SCORE_MOD || HOOK_SCORE || HOOK_MASK || decltype(masked)::value) {" in src
    assert "const float sl = SCORE_MOD || HOOK_SCORE ? 1.0f : scale_log2;" in src
    # order inside the element loop: score_mod, mask_mod, then the built-in masks
    loop = src[src.index("if constexpr (HOOK_SCORE)") :]
    assert loop.index("HOOK_MASK") < loop.index("if constexpr (WINDOW && decltype(masked)::value)")


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
