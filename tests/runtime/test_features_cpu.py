"""Features (window, softcap, ALiBi) on the host side: validation, the values a launch passes,
the variant a call gets, the property suite's draws and the oracle's bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flashgen
from flashgen.generator.features import (
    FeatureArgs,
    alibi_host,
    check_fits,
    check_softcap,
    check_window,
)
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec
from flashgen.runtime import feature_values, validate
from flashgen.runtime.validate import MAX_LENGTH
from flashgen.verify import oracle, strategies

MMA = KernelSpec(family="mma", d=64, dtype="fp16", causal=True)


def test_window_values_are_checked_and_unbounded_on_both_sides_is_no_window():
    assert check_window(None) is None and check_window((-1, -1)) is None
    assert check_window((4096, 0)) == (4096, 0) and check_window([3, -1]) == (3, -1)
    for bad, rule in [
        ((1,), "must be a pair"), ((1.5, 0), "must be a pair"), ((True, 0), "must be a pair"),
        ((-2, 0), "each side must be >= 0 keys, or -1"), ("4096", "must be a pair"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"window=.*{rule}"):
            check_window(bad)


def test_softcap_zero_is_off_and_the_value_must_be_positive_and_finite():
    assert check_softcap(None) is None and check_softcap(0.0) is None
    assert check_softcap(30) == 30.0
    for bad in (-1.0, float("inf"), float("nan"), 1e9, "x"):
        with pytest.raises(ValueError, match="softcap="):
            check_softcap(bad)


def test_kernel_args_pass_minus_one_for_a_side_that_reaches_every_key():
    assert FeatureArgs().kernel_args(10, 20) == (-1, -1, 0.0, 0)
    assert FeatureArgs(window=(5, 0)).kernel_args(10, 20) == (5, 0, 0.0, 0)
    # left: positions p < Tk = 20, so left >= 20 reaches key 0; right: p >= Tk - Tq = 10, so
    # right >= Tq = 10 reaches key Tk - 1
    assert FeatureArgs(window=(19, 9)).kernel_args(10, 20) == (19, 9, 0.0, 0)
    assert FeatureArgs(window=(20, 10)).kernel_args(10, 20) == (-1, -1, 0.0, 0)
    assert FeatureArgs(window=(30, 29)).kernel_args(10, 20) == (-1, -1, 0.0, 0)
    assert FeatureArgs(softcap=30.0, alibi=0x1000).kernel_args(1, 1) == (-1, -1, 30.0, 0x1000)


def test_kernel_args_fit_the_kernels_int_arguments_whatever_the_lengths():
    """Tq + Tk may pass 2^31 (a broadcast K/V of 2^31 - 1024 keys): a side between 2^31 and
    Tq + Tk used to be passed as is, wrapping to a negative int (or unbounded) in the kernel."""
    tk = MAX_LENGTH
    for tq, window in [(10, (10, 1500)), (2**30, (2**31 - 2, 2**30 + 5)), (5, (2**32, 2**31))]:
        left, right, _, _ = FeatureArgs(window=window).kernel_args(tq, tk)
        assert -1 <= left < 2**31 and -1 <= right < 2**31, (tq, window)
        assert left == (window[0] if window[0] < tk else -1)
        assert right == (window[1] if window[1] < tq else -1)
    assert FeatureArgs(window=(10, 1500)).kernel_args(10, tk)[:2] == (10, -1)
    assert FeatureArgs(window=(1, 0), softcap=2.0, alibi=8).tokens == ("window", "softcap", "alibi")


def test_a_variant_without_a_used_feature_is_refused_with_the_one_to_use():
    check_fits(MMA, FeatureArgs())
    check_fits(MMA.replace(features=("window",)), FeatureArgs())  # off: the variant serves it
    with pytest.raises(ValueError, match=r"uses window .* use flash_fwd_mma_d64_.*_window_"):
        check_fits(MMA, FeatureArgs(window=(8, 0)))


def test_the_variant_to_use_is_one_that_takes_the_feature():
    """d 64's default wgmma backward tile (128 x 128) refuses softcap: the suggestion is the
    tile the family gives softcap, not a spec that cannot be built."""
    wide = KernelSpec(family="wgmma", d=64, direction="bwd", causal=True)
    assert wide.br == 128
    want = "flash_bwd_wgmma_d64_br64_bc128_bf16_causal_softcap_s3"
    with pytest.raises(ValueError, match=f"use {want}"):
        check_fits(wide, FeatureArgs(softcap=30.0))


def test_alibi_slopes_must_be_one_float32_per_query_head():
    assert alibi_host(None, 4) is None
    assert alibi_host(np.ones(4, np.float32), 4).dtype == np.float32
    with pytest.raises(ValueError, match=r"alibi_slopes.shape=\(3,\): must be \(4,\)"):
        alibi_host(np.ones(3, np.float32), 4)
    with pytest.raises(ValueError, match="alibi_slopes.dtype=float64: must be float32"):
        alibi_host(np.ones(4), 4)


# ---- through flashgen.attention on a fake GPU ------------------------------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    from _fakecuda import install_libcuda, install_pycuda

    from flashgen import api

    install_pycuda(monkeypatch, cc=(8, 0))
    cuda = install_libcuda(monkeypatch)
    monkeypatch.setattr(api, "_entries", {})
    return cuda


def gpuarrays(h=4, h_kv=2, d=64):
    from _fakecuda import FakeGPUArray

    shapes = ((1, h, 50, d), (1, h_kv, 70, d), (1, h_kv, 70, d))
    return tuple(
        FakeGPUArray(s, np.float16, gpudata=0x1000_0000 * (i + 1)) for i, s in enumerate(shapes)
    )


def test_a_window_call_runs_the_window_variant_with_its_sizes(fake_gpu):
    from _fakecuda import FakeGPUArray

    from flashgen import api

    flashgen.attention(*gpuarrays(), causal=True, window=(16, 0))
    slopes = FakeGPUArray((4,), np.float32, gpudata=0x9000_0000)
    flashgen.attention(*gpuarrays(), softcap=30.0, alibi_slopes=slopes)
    flashgen.attention(*gpuarrays(), causal=True)
    first, second, plain = fake_gpu.launches
    assert (first.window, first.softcap, first.alibi) == ((16, 0), 0.0, 0)
    assert (second.window, second.softcap, second.alibi) == ((-1, -1), 30.0, 0x9000_0000)
    assert (plain.window, plain.softcap, plain.alibi) == ((-1, -1), 0.0, 0)
    names = [e.spec.name for e in api._entries.values()]
    assert any(n.endswith("_causal_window_w4_s2") for n in names)
    assert any("_noncausal_softcap_alibi_" in n for n in names)
    assert any(n.endswith("_causal_w4_s2") for n in names)


def test_feature_values_are_validated_before_anything_runs(fake_gpu):
    with pytest.raises(ValueError, match="window="):
        flashgen.attention(*gpuarrays(), window=(-5, 0))
    with pytest.raises(ValueError, match="softcap="):
        flashgen.attention(*gpuarrays(), softcap=-1.0)
    with pytest.raises(ValueError, match=r"alibi_slopes.shape=\(2,\): must be \(4,\)"):
        from _fakecuda import FakeGPUArray

        flashgen.attention(*gpuarrays(), alibi_slopes=FakeGPUArray((2,), np.float32, gpudata=64))
    with pytest.raises(ValueError, match="uses window but the variant is not compiled with it"):
        flashgen.attention(
            *gpuarrays(), window=(4, 4), spec=KernelSpec(family="mma", d=64, dtype="fp16")
        )
    assert fake_gpu.launches == []


def test_a_slopes_view_at_a_remembered_pointer_is_validated_again(fake_gpu):
    """The signature cache keyed the slopes by pointer alone: after one valid call, s[::2],
    s[:1] or float64 memory at that pointer ran unvalidated (H floats read from memory laid
    out otherwise, or past the end of a 1-element array)."""
    from _fakecuda import FakeGPUArray

    at = 0x9000_0000
    flashgen.attention(*gpuarrays(), alibi_slopes=FakeGPUArray((4,), np.float32, gpudata=at))
    flashgen.attention(*gpuarrays(), alibi_slopes=FakeGPUArray((4,), np.float32, gpudata=at))
    views = [
        (FakeGPUArray((4,), np.float32, gpudata=at, strides=(8,)), "must be contiguous"),
        (FakeGPUArray((1,), np.float32, gpudata=at), r"alibi_slopes.shape=\(1,\): must be \(4,\)"),
        (FakeGPUArray((4,), np.float64, gpudata=at), "alibi_slopes.dtype=float64: must be float32"),
    ]  # fmt: skip
    for view, message in views:
        with pytest.raises(ValueError, match=message):
            flashgen.attention(*gpuarrays(), alibi_slopes=view)
    assert len(fake_gpu.launches) == 2  # the two valid calls only


def test_slopes_must_be_4_byte_aligned_as_the_bundle_requires(fake_gpu):
    from _fakecuda import FakeGPUArray

    with pytest.raises(ValueError, match=r"alibi_slopes pointer 0x90000002: must be 4-byte"):
        flashgen.attention(
            *gpuarrays(), alibi_slopes=FakeGPUArray((4,), np.float32, gpudata=0x9000_0002)
        )
    assert fake_gpu.launches == []


def test_a_bound_launch_refuses_misaligned_slopes_whatever_the_host():
    from flashgen.runtime import launch

    plan = launch.LaunchPlan(MMA.replace(features=("alibi",)), "sm_80", 0, 1, 2, 3, (128, 1, 1), 0)
    problem = validate.check_layout(*(np.zeros((1, 4, 8, 64), np.float16),) * 3)
    with pytest.raises(ValueError, match=r"alibi_slopes pointer 0x6: must be 4-byte aligned"):
        plan.bind(problem, 1.0, FeatureArgs(alibi=6))


def test_any_head_dim_that_is_a_multiple_of_8_is_generated(fake_gpu):
    from flashgen import api

    flashgen.attention(*gpuarrays(d=80))
    (entry,) = api._entries.values()
    assert entry.spec.d == 80 and entry.spec not in shipped()


# ---- the property suite ------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_feature_variants_draw_their_values_and_plain_ones_none(data):
    plain = data.draw(strategies.cases(MMA))
    assert not plain.has_features
    spec = MMA.replace(features=("window", "softcap", "alibi"))
    case = data.draw(strategies.cases(spec))
    assert [token for token, _ in case.features] == ["window", "softcap", "alibi"]
    left, right = case.feature("window")
    assert -1 <= left <= case.tq + case.tk + 2 and -1 <= right <= case.tq + case.tk + 2
    assert case.feature_kwargs()["alibi_slopes"].shape == (case.h,)


def test_feature_variants_pin_windows_that_skip_tiles_and_empty_rows():
    spec = MMA.replace(features=("window",))
    windows = [c.feature("window") for c in strategies.pinned_cases(spec)]
    assert (0, 0) in windows and (spec.bc, 0) in windows
    assert not [c for c in strategies.pinned_cases(MMA) if c.has_features]


def test_the_lse_bound_grows_with_the_softcap_and_alibi_terms():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 1, 9, 16))
    base = oracle.lse_bound(q, k, scale=0.25)
    assert oracle.lse_bound(q, k, scale=0.25, softcap=50.0) > base
    assert oracle.lse_bound(q, k, scale=0.25, alibi_slopes=np.array([1.0])) > base


# ---- a value head dim of its own -----------------------------------------------------------------
def test_dv_is_in_the_name_only_when_it_differs_and_round_trips():
    spec = KernelSpec(family="wgmma", d=192, dv=128, causal=True)
    assert spec.name == "flash_fwd_wgmma_d192_dv128_br128_bc64_bf16_causal_s2"
    assert KernelSpec.from_name(spec.name) == spec and "--dv 128" in spec.build_command
    assert KernelSpec(family="mma", d=64).dv == 64 and "_dv" not in KernelSpec(family="mma").name
    with pytest.raises(ValueError, match="not canonical"):
        KernelSpec.from_name("flash_fwd_mma_d64_dv64_br128_bc64_bf16_causal_w8_s2")
    with pytest.raises(ValueError, match=r"dv=12: must be a multiple of 8"):
        KernelSpec(family="mma", d=64, dv=12)
    wide = KernelSpec(family="wgmma", d=64, dv=128)  # O lives in registers, not Q's slabs
    assert wide.name == "flash_fwd_wgmma_d64_dv128_br128_bc128_bf16_noncausal_s2"


def test_select_gives_dv_the_tile_of_d_or_the_next_family():
    from flashgen.generator.select import select

    mla = select(192, "bf16", True, "sm_90", dv=128, gpu_name="NVIDIA H200")
    assert (mla.family, mla.d, mla.dv) == ("wgmma", 192, 128)
    wide = select(64, "bf16", True, "sm_90", dv=128, gpu_name="NVIDIA H200")
    assert (wide.family, wide.dv) == ("wgmma", 128)
    assert (wide.br, wide.bc) == (128, 128)  # d = 64's br = 192 has no registers for dv = 128


def test_a_call_with_v_of_its_own_head_dim_runs_a_dv_variant(fake_gpu):
    from _fakecuda import FakeGPUArray

    from flashgen import api

    q = FakeGPUArray((1, 4, 50, 192), np.float16, gpudata=0x1000_0000)
    k = FakeGPUArray((1, 2, 70, 192), np.float16, gpudata=0x2000_0000)
    v = FakeGPUArray((1, 2, 70, 128), np.float16, gpudata=0x3000_0000)
    o = flashgen.attention(q, k, v, causal=True)
    assert o.shape == (1, 4, 50, 128)
    (entry,) = api._entries.values()
    assert (entry.spec.d, entry.spec.dv) == (192, 128)
    # o's strides (B = 1: its batch stride is never stepped and passed as 0)
    assert fake_gpu.launches[-1].strides[9:] == (0, 50 * 128, 128)
    with pytest.raises(ValueError, match=r"k.shape\[3\]=128: head dim must equal q's d=192"):
        flashgen.attention(q, v, v)


def test_cli_builds_a_dv_variant(tmp_path):
    from click.testing import CliRunner

    from flashgen.cli import main

    res = CliRunner().invoke(
        main, ["build", "--family", "mma", "--d", "192", "--dv", "128", "--no-compile",
               "--out", str(tmp_path)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (tmp_path / "flash_fwd_mma_d192_dv128_br128_bc64_bf16_noncausal_w8_s2.cu").exists()


def test_check_runs_a_feature_variant_with_its_values():
    from flashgen.verify import checks
    from flashgen.verify.oracle import reference

    seen = {}

    def emulate(spec, q, k, v, scale, **feats):
        seen.update(feats)
        o, lse = reference(q, k, v, causal=spec.causal, scale=scale, **feats)
        return o.astype(q.dtype), lse.astype(np.float32)

    spec = KernelSpec(family="simt", d=32, causal=True, features=("window", "softcap", "alibi"))
    r = checks.check_variant(spec, b=1, h=2, tq=40, tk=90, seed=1, execute=emulate)
    assert r.passed and seen["window"] == (64, 16) and seen["softcap"] == 30.0
    assert seen["alibi_slopes"].shape == (2,)


# ---- the wgmma grid: a block per query tile, or persistent blocks --------------------------------
def test_wgmma_grid_is_persistent_only_for_many_short_tiles():
    from flashgen.generator.families import FAMILIES
    from flashgen.generator.schedulers import (
        PERSISTENT_MAX_KEY_TILES,
        SINGLE_TILE,
        STATIC_PERSISTENT,
        key_tiles,
    )

    spec = KernelSpec(family="wgmma", d=128, causal=False)  # br = bc = 128
    wg = FAMILIES["wgmma"].scheduler(spec)
    assert wg is STATIC_PERSISTENT
    assert wg.grid(spec, 16, 16, 1024, 1024, 132) == (132, 1, 1)  # 2048 tiles of 8 key tiles
    assert wg.grid(spec, 1, 16, 16384, 16384, 132) == (2048, 1, 1)  # 128 key tiles each
    assert wg.grid(spec, 1, 2, 1024, 1024, 132) == (16, 1, 1)  # fewer tiles than SMs
    assert wg.grid(spec, 16, 16, 1024, 1024, 0) == (2048, 1, 1)  # SM count unknown
    causal = spec.replace(causal=True)
    assert key_tiles(causal, 4096, 4096, (-1, -1)) == 16.0
    assert key_tiles(causal, 16384, 16384, (4096, 0)) == 4097 / 128
    assert key_tiles(spec, 100, 16384, (7, 9)) == 17 / 128
    assert wg.grid(causal, 1, 16, 16384, 16384, 132, (4096, 0))[0] == 2048  # 32.0 + 1/128
    assert key_tiles(causal, 8192, 8192, (-1, -1)) <= PERSISTENT_MAX_KEY_TILES
    # the other families keep (query tiles, heads, batch)
    mma = KernelSpec(family="mma", d=64)
    assert FAMILIES["mma"].scheduler(mma) is SINGLE_TILE
    assert SINGLE_TILE.grid(mma, 3, 5, 1000, 1000, 132) == (-(-1000 // mma.br), 5, 3)


# ---- GQA packing --------------------------------------------------------------------------------
def test_select_packs_short_grouped_queries_that_fill_the_gpu():
    from flashgen.generator.select import GQAPACK_MAX_TQ, GQAPACK_MIN_KV_HEADS, select

    many = GQAPACK_MIN_KV_HEADS
    packed = select(128, "bf16", True, "sm_90", kv_group=4, tq=1, kv_heads=many)
    assert packed.family == "mma" and packed.features == ("gqapack",)
    assert "_gqapack_" in packed.name and KernelSpec.from_name(packed.name) == packed
    # long queries, one head per group, too few K/V blocks, or ALiBi: no packing
    for kw in (
        {"kv_group": 4, "tq": GQAPACK_MAX_TQ + 1, "kv_heads": many},
        {"kv_group": 1, "tq": 1, "kv_heads": many},
        {"kv_group": 4, "tq": 1, "kv_heads": many - 1},
    ):
        assert "gqapack" not in select(128, "bf16", True, "sm_90", **kw).features
    with_window = select(64, "fp16", False, "sm_80", features=("window",), kv_group=8, tq=4,
                         kv_heads=many)  # fmt: skip
    assert with_window.features == ("window", "gqapack")
    assert select(64, "fp16", False, "sm_80", features=("alibi",), kv_group=8, tq=4,
                  kv_heads=many).features == ("alibi",)  # fmt: skip


def test_gqapack_refuses_alibi_and_takes_a_grid_per_kv_head():
    from flashgen.generator.families import FAMILIES

    with pytest.raises(ValueError, match="gqapack,alibi"):
        KernelSpec(family="mma", d=64, features=("alibi", "gqapack"))
    with pytest.raises(ValueError, match="gqapack"):
        KernelSpec(family="wgmma", d=64, features=("gqapack",))
    spec = KernelSpec(family="mma", d=64, br=64, features=("gqapack",))
    # 5 tokens x 4 query heads = 20 packed rows: one 64-row tile per (K/V head, batch)
    grid = FAMILIES["mma"].scheduler(spec).grid
    assert grid(spec, 3, 8, 5, 100, 132, kv_group=4) == (1, 2, 3)
    assert grid(spec, 3, 8, 17, 100, 132, kv_group=4) == (2, 2, 3)


def test_wgmma_br192_takes_no_score_mod_and_select_moves_it_to_the_default_tile():
    from flashgen.generator.select import feature_variant

    with pytest.raises(ValueError, match="br=192: three consumer warpgroups have no registers"):
        KernelSpec(family="wgmma", d=64, br=192, bc=128, features=("softcap",))
    plain = KernelSpec(family="wgmma", d=64, br=192, bc=128, causal=True)
    assert feature_variant(plain, ("window",)) == plain.replace(features=("window",))
    moved = feature_variant(plain, ("alibi",))
    assert moved is not None and (moved.br, moved.bc, moved.features) == (128, 128, ("alibi",))


def test_a_call_without_features_reads_and_encodes_nothing():
    """The common call pays no per-feature work on the host: no keywords give the shared
    all-off values, which encode to the precomputed all-off op arguments."""
    from flashgen.runtime import op_args

    values = feature_values.from_keywords({}, "t")
    assert values is feature_values.NO_VALUES
    assert op_args.op_args(values) is op_args.OFF
    assert op_args.values_of(op_args.OFF) == values  # and they decode back to all off
    assert op_args.op_args(feature_values.from_keywords({"softcap": 5.0}, "t")) != op_args.OFF
