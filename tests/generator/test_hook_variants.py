"""Hooks compiled into mma's forward: tokens, names, spec rules, the aux block, rendering, nvcc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashgen.generator import abi
from flashgen.generator import hooks as hk
from flashgen.generator.compile import compile_kernel
from flashgen.generator.features import hook as fh
from flashgen.generator.hooks import library
from flashgen.generator.render import render
from flashgen.generator.spec import KernelSpec, SpecError

MMA = KernelSpec(family="mma", d=64, dtype="bf16", causal=True)


def _bias_score(score, b, h, q_idx, kv_idx, bias, scale2):
    # a 2-D table, a float scalar and an int expression: every aux slot kind but int scalars
    return score * scale2 + bias[h, hk.minimum(kv_idx, 15)]


BIAS_HOOK = hk.trace_score_mod(
    _bias_score, hk.Aux("bias", "float32", 2), hk.Aux("scale2", "float32", 0)
)


def hooked(*hooks: hk.Hook, **changes: object) -> KernelSpec:
    """MMA with `changes` (a family of its own: that family's defaults) and the hooks."""
    features = (*changes.pop("features", ()), *(fh.token_of(h) for h in hooks))  # type: ignore[misc]
    if "family" in changes or "direction" in changes:  # that kind's own default tile
        base = {"family": "mma", "d": 64, "dtype": "bf16", "causal": True, **changes}
        return KernelSpec(**base, features=features)  # type: ignore[arg-type]
    return MMA.replace(**changes, features=features)


# ---- tokens and names ----------------------------------------------------------------------------
def test_the_hook_digest_is_in_the_name_and_the_name_round_trips():
    cap, alibi = library.softcap_hook(), library.alibi_hook()
    a, b = hooked(cap), hooked(alibi)
    assert f"_scoremod{cap.digest}_" in a.name and f"_scoremod{alibi.digest}_" in b.name
    assert a.name != b.name != MMA.name
    for spec in (a, b, hooked(alibi, library.document_hook(), features=("window",))):
        assert KernelSpec.from_name(spec.name) == spec


def test_hook_tokens_sit_after_the_run_time_features_score_first():
    spec = hooked(library.document_hook(), library.softcap_hook(), features=("window",))
    names = spec.name.split("_")
    at = [i for i, t in enumerate(names) if t.startswith(("scoremod", "maskmod", "window"))]
    assert [names[i][:4] for i in at] == ["wind", "scor", "mask"]


def test_a_name_with_an_unregistered_hook_parses_but_does_not_render():
    spec = KernelSpec.from_name(MMA.name.replace("_w8", "_scoremod0123456789ab_w8"))
    assert spec.features == ("scoremod0123456789ab",)
    with pytest.raises(fh.HookNotRegistered, match=r"no hook with digest 0123456789ab .* register"):
        render(spec)


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"family": "simt"}, "not supported by family simt"),
        ({"direction": "decode"}, "forward and backward kernels only"),
        (
            {"family": "wgmma", "direction": "bwd", "features": ("varlen",), "br": 64, "warps": 0},
            "packed-sequence backward takes no hooks",
        ),
        ({"features": ("softcap",)}, "write the built-in score mod into the hook"),
        ({"features": ("gqapack",), "causal": False}, "gqapack with a hook"),
    ],
)
def test_spec_rules_refuse_what_the_hooked_forward_does_not_do(changes, rule):
    with pytest.raises(SpecError, match=rule):
        hooked(library.softcap_hook(), **changes)


def test_one_hook_of_each_kind():
    with pytest.raises(SpecError, match="2 scoremod hooks"):
        hooked(library.softcap_hook(), library.alibi_hook())
    hooked(library.alibi_hook(), library.causal_hook())  # one of each: fine


# ---- the aux block -------------------------------------------------------------------------------
def test_only_hooked_variants_take_the_aux_block():
    assert abi.forward(MMA.features) == abi.FWD
    assert abi.forward(hooked(library.causal_hook()).features) == (*abi.FWD, *abi.HOOK_PARAMS)
    assert abi.struct_format(abi.HOOK_PARAMS) == "PPPP" + "iiii" + "ffff" + "iiii"


def test_aux_declarations_map_onto_slots_shared_by_name():
    doc, prefix = library.document_hook(), library.prefix_lm_hook()
    got = fh.slots((BIAS_HOOK, doc, prefix, doc))
    assert [(s.aux.name, s.kind, s.index) for s in got] == [
        ("bias", "ptr", 0), ("scale2", "float", 0), ("doc_ids", "ptr", 1), ("prefix", "int", 0),
    ]  # fmt: skip
    assert fh.call_args(BIAS_HOOK, got) == (
        ", static_cast<const float*>(hook_ptr0), hook_stride0, hook_f0"
    )
    assert fh.call_args(doc, got) == ", static_cast<const int*>(hook_ptr1)"


def test_too_many_aux_tensors_or_clashing_declarations_are_refused():
    many = tuple(hk.Aux(f"t{c}", "int32", 1) for c in "abcde")
    wide = hk.trace_mask_mod(lambda b, h, q, kv, *ts: sum(t[q] for t in ts) > 0, *many)
    with pytest.raises(ValueError, match="more than 4 aux tensors"):
        fh.slots((wide,))
    other = hk.trace_mask_mod(lambda b, h, q, kv, d: d > 0, hk.Aux("doc_ids", "int32", 0))
    with pytest.raises(ValueError, match="declared as int32\\[1\\] and as int32\\[0\\]"):
        fh.slots((library.document_hook(), other))


def test_hook_args_are_the_block_values_by_name():
    args = fh.HookArgs((BIAS_HOOK,), {"bias": (0x1000, 17), "scale2": 0.5})
    assert args.kernel_args() == (0x1000, 0, 0, 0, 17, 0, 0, 0, 0.5, 0, 0, 0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="missing scale2"):
        fh.HookArgs((BIAS_HOOK,), {"bias": (0x1000, 17)})
    with pytest.raises(ValueError, match="4-byte aligned device pointer"):
        fh.HookArgs((BIAS_HOOK,), {"bias": (0x1002, 17), "scale2": 0.5})


def test_range_summaries_take_the_pointer_slots_the_aux_leave_free():
    doc, alibi = library.document_hook(), library.alibi_hook()
    got = fh.summary_slots((alibi, doc))  # the score_mod's table first, then doc_ids, then it
    assert [(s.aux.name, s.kind, s.index) for s in got] == [("doc_ids", "summary", 2)]
    assert fh.summary_call_args(doc, got) == ", static_cast<const int*>(hook_ptr2), hook_stride2"
    assert fh.summary_call_args(alibi, got) == ""
    # a mask reading no table at ranges, a score_mod's per-key table: no summary
    assert fh.summary_slots((BIAS_HOOK, library.causal_hook())) == ()
    # four tables fill the block: none is left for summaries (the verdicts do without)
    four = tuple(hk.Aux(f"t{c}", "int32", 1) for c in "abcd")
    wide = hk.trace_mask_mod(lambda b, h, q, kv, *ts: sum(t[q] for t in ts) > 0, *four)
    assert fh.summary_slots((wide,)) == ()
    three = hk.trace_mask_mod(lambda b, h, q, kv, *ts: sum(t[q] for t in ts) > 0, *four[:3])
    assert [(s.aux.name, s.index) for s in fh.summary_slots((three,))] == [("ta", 3)]


def test_hook_args_take_range_summaries_by_table_name():
    doc = library.document_hook()
    args = fh.HookArgs((doc,), {"doc_ids": 0x1000}, summaries={"doc_ids": (0x2000, 700)})
    assert args.kernel_args()[:8] == (0x1000, 0x2000, 0, 0, 0, 700, 0, 0)
    assert fh.HookArgs((doc,), {"doc_ids": 0x1000}).kernel_args()[:8] == (0x1000,) + (0,) * 7
    with pytest.raises(ValueError, match=r"summaries\['ids'\]: .* summarize \['doc_ids'\]"):
        fh.HookArgs((doc,), {"doc_ids": 0x1000}, summaries={"ids": (0x2000, 7)})
    with pytest.raises(ValueError, match="the table's length \\(1 <= n < 2\\^31\\)"):
        fh.HookArgs((doc,), {"doc_ids": 0x1000}, summaries={"doc_ids": (0x2000, 0)})


def test_only_wgmma_verdicts_read_the_summary_and_mma_renders_as_before():
    doc = library.document_hook()
    ctx = fh.template_context((fh.token_of(doc),))
    assert ctx["hook_mask"]["aux"] == ", static_cast<const int*>(hook_ptr0)"
    assert ctx["hook_mask"]["tile_aux"] == (
        ", static_cast<const int*>(hook_ptr0), static_cast<const int*>(hook_ptr1), hook_stride1"
    )
    assert "fg_ir_load_summary(doc_ids, fg_sum_doc_ids" in ctx["hook_tile_source"]
    assert "FLASHGEN_HOOK_SUMMARY_HELPERS" in ctx["hook_tile_source"]
    # a mask without summarized reads: the verdict's source as before (no summary helpers)
    window = fh.template_context((fh.token_of(library.window_hook()),))
    assert "SUMMARY" not in window["hook_tile_source"]
    assert window["hook_mask"]["tile_aux"] == window["hook_mask"]["aux"]
    src = render(hooked(doc)).source  # family mma: element-wise only, no tile verdict
    assert "static_cast<const int*>(hook_ptr1)" not in src and "fg_sum_" not in src


# ---- rendering -----------------------------------------------------------------------------------
def test_the_source_shows_the_hook_inline_and_calls_it_on_the_natural_log_score():
    spec = hooked(BIAS_HOOK, library.document_hook(), features=("window",))
    src = render(spec).source
    name = f"score_mod_{BIAS_HOOK.digest}"
    assert f"__device__ __forceinline__ float {name}(float score, int b, int h" in src
    assert (
        "return (score * scale2) + bias[(long long)h * bias_stride + fg_imin(kv_idx, 15)];" in src
    )
    call = re.search(rf"\? {name}\((.*)\) \* LOG2E", src)
    assert call is not None
    assert call[1] == (
        "s[mt][nt][e] * hook_scale, batch, head, row, key, tq, tk, "
        "static_cast<const float*>(hook_ptr0), hook_stride0, hook_f0"
    )
    assert "row < tq && key < tk" in src  # padded rows and keys never reach the hook
    mask = f"mask_mod_{library.document_hook().digest}"
    assert f"!{mask}(batch, head, row, key, tq, tk, static_cast<const int*>(hook_ptr1))" in src
    assert "const float hook_scale = scale_log2 * LN2;" in src
    assert src.count("hook_i3") == 1  # in the signature, after the features


# ---- the backward -------------------------------------------------------------------------------
BWD = KernelSpec(family="mma", d=64, dtype="bf16", causal=True, direction="bwd")


def test_a_hooked_backward_is_named_by_its_hooks_and_round_trips():
    for det in ((), ("deterministic",)):
        spec = hooked(BIAS_HOOK, library.document_hook(), direction="bwd", features=det)
        assert spec.name.startswith("flash_bwd_mma_") and f"scoremod{BIAS_HOOK.digest}" in spec.name
        assert KernelSpec.from_name(spec.name) == spec
    with pytest.raises(SpecError, match="write the built-in score mod into the hook"):
        hooked(library.softcap_hook(), direction="bwd", features=("softcap",))


def test_only_hooked_backwards_take_the_aux_block_in_all_three_kernels():
    from flashgen.generator.backward import kernel_names

    assert abi.backward(BWD.features) == abi.BWD
    spec = hooked(library.causal_hook(), direction="bwd")
    assert abi.backward(spec.features) == (*abi.BWD, *abi.HOOK_PARAMS)
    src = render(spec).source
    for symbol in kernel_names(spec):  # one argument list: the block ends every signature
        sig = src[src.index(f" {symbol}(") :]
        assert "const int hook_i3)" in sig[: sig.index("{")], symbol


def _calls(src: str, name: str) -> list[str]:
    return re.findall(rf"{name}\(([^;]*?)\)(?: \* LOG2E|\)\))", src)


@pytest.mark.parametrize("deterministic", [False, True])
def test_the_backward_recomputes_the_forwards_logit_and_takes_the_hooks_derivative(deterministic):
    det = ("deterministic",) if deterministic else ()
    spec = hooked(BIAS_HOOK, library.document_hook(), direction="bwd", features=det)
    src = render(spec).source
    name = f"score_mod_{BIAS_HOOK.digest}"
    # value and derivative at once, on the natural-log score (scale * q.k), times log2(e) as
    # the forward: once in the main kernel and once in the deterministic dQ kernel
    calls = re.findall(rf"{name}_value_grad\((\w+\[nt\]\[e\]) \* scale, batch, head, row, key, "
                       r"tq, tk, (.*?), f\) \* LOG2E", src)  # fmt: skip
    assert [c[0] for c in calls] == ["pt[nt][e]", "p[nt][e]"][: 1 + deterministic]
    assert {c[1] for c in calls} == {"static_cast<const float*>(hook_ptr0), hook_stride0, hook_f0"}
    assert src.count("const bool inside = row < tq && key < tk;") == 1 + deterministic
    mask = f"mask_mod_{library.document_hook().digest}"
    assert src.count(f"if (!inside || !{mask}(batch, head, row, key, tq, tk, ") == 1 + deterministic
    # dS's weight is P o f, zero wherever P is
    assert "pt[nt][e] = p == 0.0f ? 0.0f : p * f;" in src
    assert ("p[nt][e] = x == 0.0f ? 0.0f : x * f;" in src) == deterministic
    assert "constexpr bool HOOK_DFAC = true;" in src


def test_a_bias_hook_keeps_no_derivative():
    """ALiBi as a hook: d(new)/d(score) is the constant 1, so the backward calls the plain
    function and multiplies dS by nothing."""
    alibi = library.alibi_hook()
    assert fh.grad_is_one(alibi) and not fh.grad_is_one(library.softcap_hook())
    src = render(hooked(alibi, direction="bwd")).source
    assert "constexpr bool HOOK_DFAC = false;" in src
    assert f"score_mod_{alibi.digest}(pt[nt][e] * scale, batch, head" in src
    assert f"score_mod_{alibi.digest}_value_grad(pt" not in src
    assert "p * f" not in src


def test_an_unhooked_backward_renders_no_hook_code():
    for feats in ((), ("deterministic",), ("window", "softcap", "alibi")):
        assert "hook" not in render(BWD.replace(features=feats)).source.lower()


def test_an_unhooked_mma_variant_renders_no_hook_code():
    src = render(MMA.replace(features=("window", "softcap"))).source
    assert "hook" not in src.lower()


# ---- nvcc ---------------------------------------------------------------------------------------
def _no_spills(spec: KernelSpec, arch: str) -> None:
    report = compile_kernel(spec, arch).report
    assert report.spill_bytes == 0, f"{spec.name} [{arch}]: spills {report.spill_bytes} B"


def test_a_hooked_variant_compiles_without_spills(nvcc_required: Path):
    _no_spills(hooked(BIAS_HOOK, library.document_hook(), features=("window",)), "sm_90")


def _bwd_spills(spec: KernelSpec, arch: str) -> list[str]:
    """All three kernels of a backward variant (compile_kernel's report has the main one)."""
    from flashgen.generator.backward import kernel_names
    from flashgen.generator.compile import BASE_FLAGS, run_nvcc
    from flashgen.generator.report import parse_ptxas

    _, log = run_nvcc([*BASE_FLAGS, "-cubin", f"-arch={arch}"], render(spec).source)
    reports = [parse_ptxas(log, symbol, arch) for symbol in kernel_names(spec)]
    return [f"{spec.name} [{arch}]: {r}" for r in reports if r.spill_bytes or r.registers <= 0]


# d 64, the backward's tile: every library hook, a custom one with every aux kind, both modes.
# (d 128: ptxas 13.0 spills 8-116 B in some hooked backwards, as it does 48 B for the built-in
# softcap's backward at d 128; bench/NOTES.md has the numbers.)
BWD_VARIANTS = [
    (library.softcap_hook, (), True, "bf16"),
    (library.alibi_hook, (), False, "fp16"),
    (library.document_hook, (), True, "bf16"),
    (library.prefix_lm_hook, (), False, "bf16"),
    (lambda: BIAS_HOOK, ("window",), True, "fp16"),
]


@pytest.mark.compile_all
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize(("make", "features", "causal", "dtype"), BWD_VARIANTS)
def test_hooked_backwards_compile_without_spills(
    make, features, causal, dtype, deterministic, arch, nvcc_required
):
    det = ("deterministic",) if deterministic else ()
    spec = hooked(
        make(), d=64, causal=causal, dtype=dtype, direction="bwd", features=(*features, *det)
    )
    assert not _bwd_spills(spec, arch)


LIBRARY_VARIANTS = [
    (library.softcap_hook, (), 128, True, "fp16"),
    (library.softcap_hook, ("window",), 128, True, "bf16"),
    (library.alibi_hook, (), 128, False, "bf16"),
    (library.alibi_hook, (), 64, True, "fp16"),
    (library.document_hook, (), 128, True, "bf16"),
    (library.prefix_lm_hook, (), 64, False, "bf16"),
]


@pytest.mark.compile_all
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize(("make", "features", "d", "causal", "dtype"), LIBRARY_VARIANTS)
def test_library_hooks_compile_without_spills(
    make, features, d, causal, dtype, arch, nvcc_required
):
    spec = hooked(make(), d=d, causal=causal, dtype=dtype, features=features)
    _no_spills(spec, arch)
    for stages in (1, 2):  # both K/V pipelines of the default tile, where the rules allow
        try:
            other = spec.replace(stages=stages)
        except SpecError:
            continue
        _no_spills(other, arch)


def test_a_hooked_kernel_s_banner_names_a_way_to_rebuild_it_that_works():
    from flashgen.generator.features import hook as fh
    from flashgen.generator.hooks import library
    from flashgen.generator.spec import KernelSpec

    token = fh.token_of(library.softcap_hook())
    s = KernelSpec(family="mma", d=64, dtype="bf16", causal=False, features=(token,))
    assert s.build_command.startswith(f"flashgen build --name {s.name} --score-mod FILE:NAME")
    assert library.softcap_hook().digest in s.build_command


# ---- block maps (runtime/block_map.py) -----------------------------------------------------------
def test_a_block_map_takes_the_last_pointer_slot_when_it_is_free():
    doc, alibi, causal = library.document_hook(), library.alibi_hook(), library.causal_hook()
    assert fh.map_slot((doc,)) == 3 and fh.map_slot((causal,)) == 3
    assert fh.map_slot((alibi,)) is None  # no mask_mod: no verdicts to map
    three = hk.trace_mask_mod(
        lambda b, h, q, kv, x, y, z: x[q] + y[q] + z[kv] > 0,
        *(hk.Aux(n, "int32", 1) for n in "xyz"),
    )  # three tables and a summary fill the block
    assert fh.map_slot((three,)) is None
    ctx = fh.template_context((fh.token_of(doc),))["hook_mask"]
    assert (ctx["map"], ctx["map_b"], ctx["map_h"]) == ("hook_ptr3", False, False)
    head = hk.trace_mask_mod(lambda b, h, q, kv: kv <= q + h)
    assert fh.template_context((fh.token_of(head),))["hook_mask"]["map_h"] is True
    assert fh.HookArgs((doc,), {"doc_ids": 0x1000}, block_map=0x3000).pointers() == (
        0x1000, 0, 0, 0x3000,
    )  # fmt: skip
    with pytest.raises(ValueError, match="block_map=4100: an 8-byte aligned device pointer"):
        fh.HookArgs((doc,), {"doc_ids": 0x1000}, block_map=0x1004)
    with pytest.raises(ValueError, match="no free slot for a block map"):
        fh.HookArgs((alibi,), {"alibi_slopes": 0x1000}, block_map=0x3000)


def test_wgmma_reads_a_block_map_and_its_builder_compiles():
    from flashgen.runtime import block_map

    doc = library.document_hook()
    spec = hooked(doc, family="wgmma", d=64, causal=False)
    src = render(spec).source
    assert "const uint2* map_row = nullptr;" in src and "if (hook_ptr3 != nullptr)" in src
    plain = render(hooked(library.alibi_hook(), family="wgmma", d=64, causal=False)).source
    assert "map_row" not in plain  # no mask_mod: no map
    tokens = (fh.token_of(doc),)
    lay = block_map.layout(tokens, 2, 8, 1000, 1500, 128, 176)
    assert (lay.rows, lay.words, lay.parts, lay.size) == (8, 1, 1, 16)
    assert lay.grid == (8, 1, 1)
    with pytest.raises(ValueError, match="needs a mask_mod"):
        block_map.layout((fh.token_of(library.alibi_hook()),), 1, 1, 8, 8, 128, 128)
    text = block_map.source(tokens)
    assert f"mask_mod_{doc.digest}_tile(batch, head, q0, q_hi" in text


@pytest.mark.compile_all  # a wgmma kernel through nvcc: the compile-everything check's
def test_the_block_map_builder_and_its_reader_compile(nvcc_required: Path):
    from flashgen.runtime import block_map

    doc = library.document_hook()
    assert block_map.cubin((fh.token_of(doc),), "sm_90")[:4] == b"\x7fELF"
    _no_spills(hooked(doc, family="wgmma", d=128, causal=True), "sm_90a")


def test_wgmma_backward_reads_a_block_map_per_part():
    doc = library.document_hook()
    src = render(hooked(doc, family="wgmma", direction="bwd", d=64, causal=False)).source
    assert "constexpr int MAP_PLANES = 1 + BC / 64;" in src
    assert "map_block = static_cast<const unsigned*>(hook_ptr3) + (long long)(kv0 / BC)" in src
    assert "map_block + (j >> 5) * MAP_PLANES" in src  # the document mask reads neither b nor h
    parted = hk.trace_mask_mod(
        lambda b, h, q, kv, ids: (ids[q] == ids[kv]) & (kv <= q + h + b), hk.Aux("ids", "int32", 1)
    )
    src = render(hooked(parted, family="wgmma", direction="bwd", d=64, causal=False)).source
    assert "(long long)batch * n_heads * map_part + " in src
    assert "map_block + hd * map_part + (j >> 5) * MAP_PLANES" in src
