"""KernelSpec: every validation rule and its message, defaults, names and JSON."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashgen.generator.arch import ARCHS
from flashgen.generator.families import FAMILIES
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError

SHIPPED = shipped()
NAME_RE = re.compile(r"[a-z0-9_]+")
SM80_SMEM = ARCHS["sm_80"].smem_per_block  # both families ship for sm_80, the tighter limit

# (fields, value, rule, fix): constructing KernelSpec(**fields) must raise a SpecError with
# exactly one problem, and that problem must name the value, state the rule and give the fix.
# One row per rule of the families (generator/families/; and the generic field checks in spec.py).
RULES: list[tuple[dict[str, Any], str, str, str]] = [
    # ---- generic field checks -------------------------------------------------------------
    ({"d": "64"}, "d='64'", "must be an integer", "e.g. d=64"),
    ({"br": 32.0}, "br=32.0", "must be an integer", "e.g. br=64"),
    ({"bc": True}, "bc=True", "must be an integer", "e.g. bc=64"),
    ({"warps": None}, "warps=None", "must be an integer", "e.g. warps=64"),
    ({"stages": "2"}, "stages='2'", "must be an integer", "e.g. stages=64"),
    ({"causal": 1}, "causal=1", "must be True or False", "True or False"),
    ({"causal": "yes"}, "causal='yes'", "must be True or False", "True or False"),
    ({"dtype": "fp8"}, "dtype='fp8'", "unknown dtype", "choose one of fp32, fp16, bf16"),
    ({"family": "wgmmx"}, "family='wgmmx'", "unknown family", "choose one of simt, mma, wgmma"),
    # ---- simt -----------------------------------------------------------------------------
    ({"d": 12}, "d=12", "must be a multiple of 8 in [8, 256] for family simt", "try 64"),
    ({"d": 0}, "d=0", "must be a multiple of 8 in [8, 256] for family simt", "try 64"),
    ({"d": -64}, "d=-64", "must be a multiple of 8 in [8, 256] for family simt", "try 64"),
    ({"d": 264}, "d=264", "must be a multiple of 8 in [8, 256] for family simt", "try 64"),
    ({"br": 12}, "br=12", "must be a multiple of 8 in [8, 128] for family simt", "try 16"),
    ({"br": 136}, "br=136", "must be a multiple of 8 in [8, 128] for family simt", "try 16"),
    ({"bc": 8}, "bc=8", "must be a multiple of 16 in [16, 128] for family simt", "try 32"),
    ({"bc": 24}, "bc=24", "must be a multiple of 16 in [16, 128] for family simt", "try 32"),
    ({"bc": 144}, "bc=144", "must be a multiple of 16 in [16, 128] for family simt", "try 32"),
    ({"br": 32, "warps": 8}, "warps=8", "derives warps from br (br*4/32 = 4)", "leave warps unset"),
    ({"stages": 2}, "stages=2", "family simt has no pipeline", "leave stages unset"),
    (
        {"d": 256, "bc": 32},
        "d=256, bc=32",
        "accumulators per thread",
        "lower bc or d",
    ),
    (
        # few registers per thread (d/4 + 2*bc/4 = 64), but the fp32 tiles outgrow sm_80
        {"d": 160, "br": 128, "bc": 48},
        "smem=",
        f"B: exceeds the {SM80_SMEM} B per block of sm_80, the tightest of the archs family simt",
        "lower bc or br",
    ),
    # ---- mma ------------------------------------------------------------------------------
    (
        {"family": "mma", "dtype": "fp32", "br": 64},
        "dtype=fp32",
        "family mma needs a tensor-core dtype",
        "use fp16 or bf16, or family simt for fp32",
    ),
    (
        {"family": "mma", "dtype": "fp16", "br": 64, "d": 20},
        "d=20",
        "must be a multiple of 8 in [8, 256] for family mma",
        "try 64",
    ),
    (
        {"family": "mma", "dtype": "fp16", "br": 64, "d": 272},
        "d=272",
        "must be a multiple of 8 in [8, 256] for family mma",
        "try 64",
    ),
    (
        {"family": "mma", "dtype": "fp16", "br": 72, "warps": 4},
        "br=72",
        "must be a multiple of 16 in [16, 256] for family mma",
        "try 128",
    ),
    (
        {"family": "mma", "dtype": "bf16", "br": 64, "bc": 40},
        "bc=40",
        "must be a multiple of 16 in [16, 256] for family mma",
        "try 64",
    ),
    (
        {"family": "mma", "dtype": "bf16", "br": 64, "bc": 512},
        "bc=512",
        "must be a multiple of 16 in [16, 256] for family mma",
        "try 64",
    ),
    (
        {"family": "mma", "dtype": "fp16", "br": 64, "warps": 3},
        "warps=3",
        "must be 1, 2, 4, 8 or 16",
        "try 4",
    ),
    (
        {"family": "mma", "dtype": "fp16", "br": 64, "warps": 8},
        "warps=8",
        "br=64 must split into 16-row tiles per warp (br % (16*warps) == 0)",
        "try warps=4",
    ),
    (
        {"family": "mma", "dtype": "fp16", "br": 128, "warps": 2},
        "warps=2",
        "each warp would own 64 rows of br=128; at most 32",
        "try warps=8",
    ),
    (
        {"family": "mma", "dtype": "fp16", "br": 64, "stages": 3},
        "stages=3",
        "K/V pipeline depth must be 1 or 2",
        "try 2",
    ),
    (
        # one warp owning 32 rows of d=256: far more live registers than a thread has
        {"family": "mma", "dtype": "fp16", "br": 32, "warps": 1, "d": 256, "bc": 64, "stages": 1},
        "d=256, bc=64, rows/warp=32",
        "would spill",
        "lower bc",
    ),
    (
        {
            "family": "mma",
            "dtype": "bf16",
            "br": 256,
            "warps": 16,
            "d": 128,
            "bc": 128,
            "stages": 2,
        },
        "smem=208896 B",
        f"exceeds the {SM80_SMEM} B per block of sm_80, the tightest of the archs family mma ships",
        "lower bc or stages",
    ),
    # ---- wgmma ----------------------------------------------------------------------------
    (
        {"family": "wgmma", "dtype": "fp32", "br": 128, "bc": 128},
        "dtype=fp32",
        "needs a tensor-core dtype",
        "fp16",
    ),
    (
        {"family": "wgmma", "dtype": "bf16", "d": 100, "br": 128, "bc": 128},
        "d=100",
        "must be a multiple of 8 in [8, 256] for family wgmma",
        "try 128",
    ),
    (
        {"family": "wgmma", "dtype": "bf16", "br": 96, "bc": 128},
        "br=96",
        "must be 64, 128 or 192 for family wgmma",
        "try 128",
    ),
    (
        {"family": "wgmma", "dtype": "bf16", "br": 128, "bc": 72},
        "bc=72",
        "multiple of 16 in [16, 256] for family wgmma",
        "try 128",
    ),
    (
        {"family": "wgmma", "dtype": "bf16", "br": 128, "bc": 128, "warps": 8},
        "warps=8",
        "derives warps from br (4 * (br/64 + 1) = 12)",
        "leave warps unset",
    ),
    (
        {"family": "wgmma", "dtype": "bf16", "br": 128, "bc": 128, "stages": 1},
        "stages=1",
        "K/V ring depth must be 2, 3 or 4",
        "try 2",
    ),
    (
        # three consumers get 160 registers each: O (64) + S (64) + P (32) + 32 is 192
        {"family": "wgmma", "dtype": "bf16", "d": 128, "br": 192, "bc": 128},
        "d=128, bc=128, br=192: ~192 registers per consumer thread",
        "exceed the 160 that 3 consumer warpgroups get",
        "lower bc or br",
    ),
    (
        {"family": "wgmma", "dtype": "bf16", "d": 256, "br": 128, "bc": 64, "stages": 4},
        "smem=",
        "B per block of sm_90a",
        "lower bc or stages",
    ),
]


@pytest.mark.parametrize(("fields", "value", "rule", "fix"), RULES)
def test_each_rule_raises_one_problem_naming_value_rule_and_fix(
    fields: dict[str, Any], value: str, rule: str, fix: str
) -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec(**fields)
    err = info.value
    assert isinstance(err, ValueError), "SpecError must stay a ValueError for callers"
    assert len(err.problems) == 1, err.problems
    problem = err.problems[0]
    assert problem.startswith(value) and ": " in problem, problem
    assert rule in problem, problem
    assert fix in problem, problem
    assert problem in str(err)


def test_rule_table_covers_every_family() -> None:
    families = {fields.get("family", "simt") for fields, *_ in RULES}
    assert families >= set(FAMILIES), f"no rule rows for {set(FAMILIES) - families}"


def test_every_broken_rule_is_reported_in_one_error() -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec(family="simt", d=12, br=12, bc=24, stages=3)
    probs = info.value.problems
    assert [p.split(":")[0] for p in probs] == ["d=12", "br=12", "bc=24", "stages=3"]
    for p in probs:
        assert p in str(info.value)


def test_mma_reports_every_broken_rule_in_one_error() -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec(family="mma", d=20, br=72, bc=40, dtype="fp32", warps=3, stages=5)
    heads = [p.split(":")[0] for p in info.value.problems]
    assert heads == ["dtype=fp32", "d=20", "br=72", "bc=40", "warps=3", "stages=5"]


def test_type_errors_and_unknown_family_are_reported_together() -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec(family="nope", d="x", causal=1, dtype="fp8")  # type: ignore[arg-type]
    heads = [p.split(":")[0] for p in info.value.problems]
    assert heads == ["d='x'", "causal=1", "dtype='fp8'", "family='nope'"]


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "family": st.one_of(
                st.sampled_from([*FAMILIES, "x"]), st.integers(), st.none(), st.lists(st.text())
            ),
            "d": st.one_of(st.integers(-300, 300), st.floats(), st.text(max_size=3)),
            "br": st.one_of(st.integers(-300, 300), st.booleans()),
            "bc": st.integers(-300, 300),
            "dtype": st.one_of(
                st.sampled_from(["fp32", "fp16", "bf16", "int8"]), st.none(), st.lists(st.text())
            ),
            "causal": st.one_of(st.booleans(), st.integers(0, 1)),
            "warps": st.integers(-2, 20),
            "stages": st.integers(-2, 4),
        },
    )
)
def test_any_field_values_give_a_valid_spec_or_a_spec_error(fields: dict[str, Any]) -> None:
    """Junk in, SpecError out: never a TypeError/KeyError from deep inside validation."""
    try:
        spec = KernelSpec(**fields)
    except SpecError as exc:
        assert exc.problems
        # every problem starts with the value(s) it is about
        assert all(re.match(r"[a-z_]+=.*: ", p) for p in exc.problems), exc.problems
        return
    assert KernelSpec.from_name(spec.name) == spec
    assert spec.warps > 0 and spec.stages > 0


# ---- defaults -----------------------------------------------------------------------------
@pytest.mark.parametrize(("br", "warps"), [(16, 2), (32, 4), (64, 8)])
def test_simt_fills_warps_from_br_and_one_stage(br: int, warps: int) -> None:
    spec = KernelSpec(family="simt", br=br)
    assert (spec.warps, spec.stages) == (warps, 1)
    assert spec.threads == 32 * warps
    assert KernelSpec(family="simt", br=br, warps=warps, stages=1) == spec


@pytest.mark.parametrize(("br", "warps"), [(64, 4), (128, 8)])
def test_mma_fills_default_warps_and_two_stages(br: int, warps: int) -> None:
    spec = KernelSpec(family="mma", d=128, br=br, bc=64, dtype="bf16")
    assert (spec.warps, spec.stages) == (warps, 2)
    assert (
        KernelSpec(family="mma", d=128, br=br, bc=64, dtype="bf16", warps=warps, stages=2) == spec
    )


def test_explicit_knobs_are_kept() -> None:
    spec = KernelSpec(family="mma", d=64, br=128, bc=64, dtype="fp16", warps=4, stages=1)
    assert (spec.warps, spec.stages) == (4, 1)


# ---- derived values ------------------------------------------------------------------------
def test_alignment_is_one_element_for_simt_and_sixteen_bytes_for_mma() -> None:
    assert KernelSpec(family="simt", dtype="bf16").align_elems == 1
    assert KernelSpec(family="mma", br=64, dtype="fp16").align_elems == 8
    assert KernelSpec(family="mma", br=64, dtype="bf16").align_elems == 8


def test_replace_validates_again() -> None:
    spec = KernelSpec(d=64)
    assert spec.replace(d=32) == KernelSpec(d=32)
    with pytest.raises(SpecError, match="d=33"):
        spec.replace(d=33)


# ---- names ---------------------------------------------------------------------------------
def test_name_has_every_field_in_fixed_order() -> None:
    assert (
        KernelSpec(family="simt", d=64, br=32, bc=32, dtype="bf16", causal=True).name
        == "flash_fwd_simt_d64_br32_bc32_bf16_causal"
    )
    assert (
        KernelSpec(family="mma", d=128, br=128, bc=64, dtype="fp16", causal=False).name
        == "flash_fwd_mma_d128_br128_bc64_fp16_noncausal_w8_s2"
    )


@given(st.sampled_from(SHIPPED))
def test_from_name_inverts_name(spec: KernelSpec) -> None:
    assert KernelSpec.from_name(spec.name) == spec
    assert NAME_RE.fullmatch(spec.name), spec.name


def test_names_round_trip_and_are_unique_over_the_whole_space() -> None:
    names = [s.name for s in SHIPPED]
    assert len(set(names)) == len(names), "two shipped variants share a name"
    for spec in SHIPPED:
        assert NAME_RE.fullmatch(spec.name), spec.name
        assert KernelSpec.from_name(spec.name) == spec, spec.name


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "flash_fwd_simt",
        "flash_fwd_simt_d64_br32_bc32_fp32",  # no mask
        "FLASH_FWD_SIMT_D64_BR32_BC32_FP32_NONCAUSAL",  # names are lower case
        "flash_fwd_simt_d64_br32_bc32_fp32_noncausal.cu",  # a file name, not a kernel name
        " flash_fwd_simt_d64_br32_bc32_fp32_noncausal",
        "flash_fwd_simt_d64_br32_bc32_fp32_noncausal\n",
        "flash_fwd_simt_d64_br32_bc32_fp32_nocausal",
        "flash_fwd_simt_d-64_br32_bc32_fp32_noncausal",
        "flash_fwd_simt_d64_br32_bc32_fp32_noncausal_",
        "flash_fwd_simt_d64_br32_bc32_fp32_noncausal__w4",
    ],
)
def test_garbage_names_are_rejected_with_the_expected_pattern(bad: str) -> None:
    with pytest.raises(SpecError, match=r"not a flashgen kernel name; expected flash_<direction>_"):
        KernelSpec.from_name(bad)


@pytest.mark.parametrize(
    ("bad", "token"),
    [
        ("flash_fwd_simt_d64_br32_bc32_fp32_noncausal_w4_s1", "'w4'"),  # simt has no knobs
        ("flash_fwd_mma_d64_br64_bc64_bf16_causal_w4_x2", "'x2'"),  # not an mma knob
        ("flash_fwd_mma_d64_br64_bc64_bf16_causal_sliding_w4_s2", "'sliding'"),  # no such feature
    ],
)
def test_unknown_name_tokens_are_named_with_the_family_knobs(bad: str, token: str) -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec.from_name(bad)
    assert f"token {token} is neither a feature" in str(info.value)
    assert "nor a knob of family" in str(info.value)


def test_direction_is_part_of_the_name_and_bwd_is_mma_only() -> None:
    assert KernelSpec().name.startswith("flash_fwd_")
    with pytest.raises(SpecError, match=r"direction='bwd': family simt has no backward kernel"):
        KernelSpec.from_name("flash_bwd_simt_d64_br32_bc32_fp32_noncausal")


@pytest.mark.parametrize(
    ("features", "problem"),
    [
        (("win",), "features: 'win' is not a feature"),
        ("win", "features='win': must be a tuple of feature tokens"),
        ((1,), "features=(1,): must be a tuple of feature tokens"),
    ],
)
def test_features_are_checked_against_the_feature_table(features: Any, problem: str) -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec(features=features)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


@pytest.mark.parametrize("family", ["mma", "wgmma"])
@pytest.mark.parametrize(
    ("features", "problems"),
    [
        (("win",), ["features: 'win' is not a feature; known features: "]),
        ([1], ["features=[1]: must be a tuple of feature tokens; e.g. features=()"]),
        (
            ("window", "window"),
            ["features=('window', 'window'): a feature is named twice; name each once"],
        ),
        (
            ("softcap", "gqapack"),
            [
                "features=('softcap', 'gqapack'): gqapack has no backward (it packs a decoding "
                "forward's query heads; the backward reads K and V once per GQA group already); "
                "drop gqapack for direction='bwd'"
            ],
        ),
    ],
)
def test_backward_features_are_named_once_each(
    family: str, features: Any, problems: list[str]
) -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec(family=family, d=64, direction="bwd", features=features)
    assert len(info.value.problems) == len(problems), info.value.problems
    for got, want in zip(info.value.problems, problems, strict=True):
        assert got.startswith(want), got


@pytest.mark.parametrize("family", ["mma", "wgmma"])
def test_a_backward_spec_takes_window_softcap_and_alibi(family: str) -> None:
    spec = KernelSpec(
        family=family, d=64, causal=True, direction="bwd", features=("alibi", "window", "softcap")
    )
    assert spec.features == ("window", "softcap", "alibi")  # canonical order
    assert "_causal_window_softcap_alibi_" in spec.name
    assert KernelSpec.from_name(spec.name) == spec


@given(st.sampled_from(SHIPPED))
def test_build_command_names_every_field_the_name_carries(spec: KernelSpec) -> None:
    cmd = spec.build_command
    for text in (f"--family {spec.family}", f"--d {spec.d}", f"--br {spec.br}", f"--bc {spec.bc}"):
        assert text in cmd
    for field, _ in spec.fam.knobs:
        assert f"--{field} {getattr(spec, field)}" in cmd


@pytest.mark.parametrize(
    ("bad", "canonical"),
    [
        (  # leading zero
            "flash_fwd_simt_d064_br32_bc32_fp32_noncausal",
            "flash_fwd_simt_d64_br32_bc32_fp32_noncausal",
        ),
        (  # mma names always carry the knobs, defaults included
            "flash_fwd_mma_d128_br128_bc64_bf16_causal",
            "flash_fwd_mma_d128_br128_bc64_bf16_causal_w8_s2",
        ),
    ],
)
def test_non_canonical_names_are_rejected_naming_the_canonical_one(
    bad: str, canonical: str
) -> None:
    with pytest.raises(SpecError, match="not canonical") as info:
        KernelSpec.from_name(bad)
    assert canonical in str(info.value)
    assert KernelSpec.from_name(canonical).name == canonical


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("flash_fwd_simt_d12_br32_bc32_fp32_noncausal", "d=12"),
        ("flash_fwd_simt_d64_br32_bc32_fp8_noncausal", "dtype='fp8'"),
        ("flash_fwd_wgmmx_d64_br32_bc32_fp16_noncausal", "family='wgmmx'"),
        ("flash_fwd_mma_d64_br64_bc64_fp32_noncausal_w4_s2", "dtype=fp32"),
    ],
)
def test_well_formed_names_of_invalid_specs_raise_the_rule(bad: str, problem: str) -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec.from_name(bad)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


@given(st.text(alphabet="flash_fwdsimtmabcrfp0123456789_ onlu", max_size=60))
def test_from_name_accepts_only_canonical_names(text: str) -> None:
    try:
        spec = KernelSpec.from_name(text)
    except SpecError:
        return
    assert spec.name == text


# ---- JSON ----------------------------------------------------------------------------------
@given(st.sampled_from(SHIPPED))
def test_to_json_round_trips_on_one_line(spec: KernelSpec) -> None:
    text = spec.to_json()
    assert "\n" not in text
    data = json.loads(text)
    assert set(data) == {
        "family", "d", "br", "bc", "dtype", "causal", "warps", "stages", "direction", "features"
    }  # fmt: skip
    assert KernelSpec(**data) == spec
    assert text == KernelSpec(**data).to_json()


def test_to_json_is_sorted_and_stable() -> None:
    assert KernelSpec(family="simt", d=64, br=32, bc=32).to_json() == (
        '{"bc": 32, "br": 32, "causal": false, "d": 64, "direction": "fwd", "dtype": "fp32", '
        '"family": "simt", "features": [], "stages": 1, "warps": 4}'
    )


def test_spec_is_frozen_and_hashable() -> None:
    spec = KernelSpec()
    with pytest.raises(AttributeError):
        spec.d = 32  # type: ignore[misc]
    assert len({spec, KernelSpec(), KernelSpec(d=32)}) == 2


# ---- family defaults -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({}, "flash_fwd_simt_d64_br32_bc32_fp32_noncausal"),
        ({"family": "mma", "d": 128}, "flash_fwd_mma_d128_br128_bc64_bf16_noncausal_w8_s2"),
        # two stages would spill at d=256: the default falls back to one
        ({"family": "mma", "d": 256}, "flash_fwd_mma_d256_br128_bc64_bf16_noncausal_w8_s1"),
        ({"family": "wgmma", "d": 128}, "flash_fwd_wgmma_d128_br128_bc128_bf16_noncausal_s2"),
        ({"family": "wgmma", "d": 256}, "flash_fwd_wgmma_d256_br128_bc64_bf16_noncausal_s2"),
        (
            {"family": "mma", "d": 64, "dtype": "fp16", "bc": 32},
            "flash_fwd_mma_d64_br128_bc32_fp16_noncausal_w8_s2",
        ),
    ],
)
def test_unset_tiles_and_dtype_take_the_familys_defaults(fields: dict[str, Any], name: str) -> None:
    spec = KernelSpec(**fields)
    assert spec.name == name
    assert KernelSpec.from_name(name) == spec


def test_an_unknown_family_is_the_one_problem_when_dtype_is_unset() -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec(family="nope")
    assert info.value.problems == ["family='nope': unknown family; choose one of simt, mma, wgmma"]


@pytest.mark.parametrize(
    "name",
    [
        "flash_fwd_mma_d64_br64_bc64_bf16_causal_window_w4_s2",
        "flash_fwd_wgmma_d80_br128_bc128_bf16_noncausal_window_softcap_alibi_s2",
        "flash_fwd_simt_d40_br32_bc32_fp32_causal_alibi",
    ],
)
def test_feature_tokens_round_trip_between_the_knobs(name: str) -> None:
    spec = KernelSpec.from_name(name)
    assert spec.name == name and spec.features
    assert "--features " + ",".join(spec.features) in spec.build_command


def test_features_are_canonically_ordered_and_named_once() -> None:
    spec = KernelSpec(family="mma", d=64, features=("alibi", "window"))
    assert spec.features == ("window", "alibi")
    with pytest.raises(
        SpecError, match="features: 'bogus' is not a feature; known features: window"
    ):
        KernelSpec(family="mma", d=64, features=("bogus",))
    with pytest.raises(SpecError, match="named twice"):
        KernelSpec(family="mma", d=64, features=("window", "window"))
    with pytest.raises(SpecError, match="not canonical"):
        KernelSpec.from_name("flash_fwd_mma_d64_br128_bc64_bf16_causal_alibi_window_w8_s2")
