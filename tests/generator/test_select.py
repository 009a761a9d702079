"""Variant selection: the default preference, its fallbacks, and the errors."""

from __future__ import annotations

import pytest

from flashgen.generator.arch import ARCHS
from flashgen.generator.select import arch_major, select
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_tensor_core_dtypes_on_sm80_and_newer_get_mma_128x64_two_stages(dtype, causal):
    for arch in ("sm_80", "sm_86", "sm_100"):
        spec = select(64, dtype, causal, arch)
        assert (spec.family, spec.d, spec.dtype, spec.causal) == ("mma", 64, dtype, causal)
        assert (spec.br, spec.bc, spec.stages) == (128, 64, 2)
        assert spec in shipped("mma")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_hopper_gets_wgmma_128x128_two_stages(dtype, causal, d):
    for arch in ("sm_90", "sm_90a"):
        spec = select(d, dtype, causal, arch)
        assert (spec.family, spec.d, spec.dtype, spec.causal) == ("wgmma", d, dtype, causal)
        assert spec in shipped("wgmma")
        if d < 256:  # d=256 ships bc=64 only (registers)
            assert (spec.br, spec.bc, spec.stages) == (128, 128, 2)


def test_head_dims_nothing_ships_are_generated_at_the_family_default_tile():
    assert 96 not in {s.d for s in shipped("wgmma")}
    spec = select(96, "bf16", False, "sm_90")
    assert spec == KernelSpec(family="wgmma", d=96, dtype="bf16")  # compiled on demand
    assert spec.fam.d_pad(spec) == 128
    assert 80 not in {s.d for s in shipped("mma")}
    assert select(80, "fp16", True, "sm_80") == KernelSpec(
        family="mma", d=80, dtype="fp16", causal=True
    )
    assert select(80, "fp32", True, "sm_80") == KernelSpec(family="simt", d=80, causal=True)


def test_fp32_gets_simt_32x32():
    spec = select(64, "fp32", True, "sm_90")
    assert (spec.family, spec.br, spec.bc, spec.dtype, spec.causal) == (
        "simt",
        32,
        32,
        "fp32",
        True,
    )


def test_tensor_core_dtypes_before_sm80_get_simt():
    spec = select(64, "fp16", False, "sm_75")
    assert (spec.family, spec.br, spec.bc) == ("simt", 32, 32)


def test_features_pick_the_shipped_feature_variant_or_compile_the_plain_tile_with_them():
    spec = select(128, "bf16", True, "sm_90", features=("window",))
    assert spec.features == ("window",) and spec in shipped("wgmma")
    assert spec.replace(features=()) == select(128, "bf16", True, "sm_90")
    combo = select(64, "fp16", False, "sm_80", features=("softcap", "alibi"))
    assert combo not in shipped("mma")  # compiled on demand
    assert combo.replace(features=()) == select(64, "fp16", False, "sm_80")
    # with a fixed pool nothing is generated: only what the pool holds
    pool = [s for s in shipped("mma") if not s.features]
    with pytest.raises(ValueError, match="features=window"):
        select(64, "bf16", False, "sm_80", candidates=pool, features=("window",))


def test_inputs_too_misaligned_for_mma_get_simt():
    spec = select(64, "bf16", False, "sm_90", alignment=1)
    assert spec.family == "simt" and spec.align_elems == 1
    assert select(64, "bf16", False, "sm_80", alignment=8).family == "mma"
    assert select(64, "bf16", False, "sm_90", alignment=8).family == "wgmma"


def test_the_nearest_tile_wins_when_the_preferred_one_is_not_shipped():
    pool = [
        KernelSpec(family="mma", d=64, br=64, bc=32, dtype="bf16", warps=4, stages=1),
        KernelSpec(family="mma", d=64, br=128, bc=128, dtype="bf16", warps=8, stages=2),
        KernelSpec(family="mma", d=64, br=128, bc=64, dtype="bf16", warps=8, stages=1),
    ]
    # distances from (128, 64, stages 2): 2.5, 1.0 and 0.5
    assert select(64, "bf16", False, "sm_90", candidates=pool) == pool[2]


def test_ties_go_to_the_earlier_variant():
    pool = [
        KernelSpec(family="simt", d=64, br=64, bc=32, dtype="fp32"),
        KernelSpec(family="simt", d=64, br=32, bc=64, dtype="fp32"),
    ]
    assert select(64, "fp32", False, "sm_90", candidates=pool) == pool[0]
    assert select(64, "fp32", False, "sm_90", candidates=pool[::-1]) == pool[1]


def test_an_unshipped_head_dim_is_a_clear_error():
    with pytest.raises(
        ValueError,
        match=r"d=20, dtype=bf16, causal=False, arch=sm_90: no variant fits; "
        r"shipped head dims for bf16 are \[16, 32.*any multiple of 8",
    ):
        select(20, "bf16", False, "sm_90")


def test_an_unknown_dtype_is_a_clear_error():
    with pytest.raises(
        ValueError, match=r"dtype='fp8': unknown dtype; choose one of fp32, fp16, bf16"
    ):
        select(64, "fp8", False, "sm_90")


def test_arch_names_parse_to_their_major():
    assert [arch_major(a) for a in ("sm_75", "sm_80", "sm_90a", "sm_100", "sm_120")] == [
        7,
        8,
        9,
        10,
        12,
    ]
    with pytest.raises(ValueError, match=r"arch='90': not an sm_XY name"):
        arch_major("90")


def test_a_tuning_table_entry_wins_when_the_gpu_is_named(monkeypatch):
    tuned = KernelSpec(family="mma", d=64, br=64, bc=64, dtype="bf16", warps=4, stages=1)
    seen = []

    def lookup(
        gpu: str, d: int, dtype: str, causal: bool, arch: str | None = None
    ) -> KernelSpec | None:
        seen.append((gpu, d, dtype, causal, arch))
        return tuned

    monkeypatch.setattr("flashgen.generator.select.lookup", lookup)
    assert select(64, "bf16", True, "sm_90", gpu_name="NVIDIA H200") == tuned
    assert seen == [("NVIDIA H200", 64, "bf16", True, "sm_90")]
    assert select(64, "bf16", True, "sm_90") != tuned  # no GPU name: no table
    assert select(64, "bf16", True, "sm_90", gpu_name="NVIDIA H200", alignment=1).family == "simt"


def test_a_gpu_without_a_table_reads_the_table_of_its_architecture() -> None:
    """An H100 (no table of its own) gets the tiles the H200's table chose (same SM: d 64 at
    192 x 128, as FA3/FA4 tile it on Hopper); an sm_80 GPU finds no sm_8x table and gets the
    families' default; the bundle's `--gpu` lookup (no arch) still wants the GPU's own table."""
    from flashgen.generator.select import lookup
    from flashgen.generator.tables import arch_table, load_table

    h200 = load_table("NVIDIA H200")
    assert arch_table(9) == ("nvidia-h200", h200) and arch_table(8) == ("", {})
    for d, dtype, causal in ((64, "bf16", False), (64, "fp16", True), (128, "bf16", True)):
        own = select(d, dtype, causal, "sm_90", gpu_name="NVIDIA H200")
        assert select(d, dtype, causal, "sm_90", gpu_name="NVIDIA H100 80GB HBM3") == own
        assert own.name == h200[f"d{d}_{dtype}_{'causal' if causal else 'noncausal'}"]["variant"]
    assert select(64, "bf16", False, "sm_90", gpu_name="NVIDIA H100 80GB HBM3").br == 192
    assert lookup("NVIDIA H100 80GB HBM3", 64, "bf16", False) is None
    a100 = select(64, "bf16", False, "sm_80", gpu_name="NVIDIA A100-SXM4-80GB")
    assert a100 == select(64, "bf16", False, "sm_80")


def test_no_tuning_table_falls_back_to_the_default(monkeypatch):
    monkeypatch.setattr("flashgen.generator.select.lookup", lambda *a: None)
    spec = select(64, "bf16", False, "sm_90", gpu_name="Some GPU")
    assert (spec.family, spec.br, spec.bc, spec.stages) == ("wgmma", 128, 128, 2)


# ---- every arch's shared memory (issue 30: sm_86/89/120 give a block 99 KiB) -------------------
SELECT_FEATURE_SETS = ((), ("window",), ("window", "softcap"), ("alibi",))


@pytest.mark.parametrize("arch", [*ARCHS, "sm_101", "sm_121"])
def test_selection_fits_every_archs_shared_memory(arch: str) -> None:
    """Every shipped (d, dtype, causal), plain and with features, selects a variant whose block
    fits the arch's shared memory (the mma d=128 bf16 br128/bc64/s2 tile needs 104,448 B where
    sm_89 gives 101,376 B) and whose family runs there."""
    from flashgen.generator.arch import smem_per_block
    from flashgen.generator.families import family_of

    keys = sorted({(s.d, s.dtype, s.causal) for s in shipped()})
    room = smem_per_block(arch)
    for d, dtype, causal in keys:
        for feats in SELECT_FEATURE_SETS:
            spec = select(d, dtype, causal, arch, features=feats)
            assert spec.smem_bytes <= room, (arch, spec.name, spec.smem_bytes, room)
            pref = family_of(spec.family).preference
            assert pref.min_major <= int(arch[3:].rstrip("a")) // 10 <= pref.max_major


def test_an_unknown_arch_takes_its_generations_limit_or_the_smallest() -> None:
    from flashgen.generator.arch import smem_per_block

    assert smem_per_block("sm_121") == ARCHS["sm_120"].smem_per_block
    assert smem_per_block("sm_101") == ARCHS["sm_100"].smem_per_block
    assert smem_per_block("sm_75") == min(a.smem_per_block for a in ARCHS.values())


def test_fp32_head_dims_past_simts_registers_say_why() -> None:
    assert select(200, "fp32", False, "sm_80").d == 200  # a shipped tile retried at d = 200
    with pytest.raises(ValueError, match=r"exceed 64 and would spill.*fp16 or bf16 run every d"):
        select(256, "fp32", True, "sm_86")
