"""Family wgmma's backward on a CPU: spec, name, rules, template values, the launch's
kernelParams (four tensor maps ahead of the mma backward's ABI), the opt-in torch selection,
and (once templates/wgmma_bwd.cu.j2 exists) rendering and nvcc for sm_90a."""

from __future__ import annotations

import ctypes
import itertools
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import flashgen
from flashgen.bundle.emit import BundleError, bundle_files
from flashgen.generator import backward as bwd_shape
from flashgen.generator import families
from flashgen.generator.families.wgmma import bwd as wgmma_bwd
from flashgen.generator.families.wgmma.ptx import Wgmma, wrappers
from flashgen.generator.render import context, template_name
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.runtime import backward, tma
from flashgen.runtime.validate import Problem
from runtime.test_backward_cpu import abi_codes

TEMPLATE = Path(flashgen.__file__).parent / "templates" / "wgmma_bwd.cu.j2"
needs_template = pytest.mark.skipif(
    not TEMPLATE.is_file(), reason="templates/wgmma_bwd.cu.j2 is not written yet"
)

NAME = "flash_bwd_wgmma_d128_br64_bc128_bf16_causal_s2"


def bwd(**fields: Any) -> KernelSpec:
    return KernelSpec(family="wgmma", direction="bwd", **fields)


# ---- spec and name ----------------------------------------------------------------------------
def test_a_wgmma_backward_spec_gets_its_defaults_and_name() -> None:
    spec = bwd(d=128, causal=True)
    assert spec.name == NAME
    assert (spec.br, spec.bc, spec.stages, spec.dtype) == (64, 128, 2, "bf16")
    assert (spec.warps, spec.threads) == (12, 384)  # a producer and two consumer warpgroups
    assert template_name(spec) == "wgmma_bwd.cu.j2"
    assert families.FAMILIES["wgmma"].min_blocks(spec) == 1
    assert families.FAMILIES["wgmma"].d_pad(spec) == spec.d


@pytest.mark.parametrize(
    ("d", "br", "bc", "dtype", "causal", "stages"),
    list(itertools.product((64, 128), (64,), (64, 128), ("fp16", "bf16"), (False, True),
                           (2, 3))),  # fmt: skip
)
def test_every_wgmma_backward_variant_round_trips_its_name(
    d: int, br: int, bc: int, dtype: str, causal: bool, stages: int
) -> None:
    spec = bwd(d=d, br=br, bc=bc, dtype=dtype, causal=causal, stages=stages)
    mask = "causal" if causal else "noncausal"
    assert spec.name == f"flash_bwd_wgmma_d{d}_br{br}_bc{bc}_{dtype}_{mask}_s{stages}"
    assert KernelSpec.from_name(spec.name) == spec
    assert spec.warps == 4 * (1 + bc // 64) and spec.threads == 128 * (1 + bc // 64)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"d": 100}, "d=100: the wgmma backward takes d a multiple of 8 up to 128"),
        ({"d": 256}, "d=256: the wgmma backward takes d a multiple of 8 up to 128"),
        ({"dtype": "fp32"}, "dtype=fp32: family wgmma needs a tensor-core dtype; use fp16 or bf16"),
        ({"dv": 64}, "dv=64: the backward pass needs v's head dim equal to d=128"),
        ({"br": 128}, "br=128: the wgmma backward's 128-row query tile needs d = 64 and bc = 128"),
        ({"br": 32}, "br=32: the wgmma backward's query tile must be 64 or 128"),
        ({"d": 64, "br": 128, "bc": 64}, "br=128: the wgmma backward's 128-row query tile needs"),
        ({"d": 64, "br": 128, "features": ("varlen",)},
         "br=128: the wgmma backward's 128-row query tile is for dense kernels without hooks"),
        ({"d": 64, "br": 128, "features": ("softcap",)},
         "br=128: the wgmma backward's 128-row query tile does not take softcap"),
        ({"d": 64, "br": 128, "features": ("deterministic",)},
         "br=128: the wgmma backward's 128-row query tile has no deterministic mode"),
        ({"d": 40, "br": 128}, "br=128: the wgmma backward's 128-row query tile needs d = 64"),
        # 3 stages: 233576 B of shared memory
        ({"d": 64, "br": 128, "stages": 3},
         "smem=233576 B: exceeds the 232448 B per block of sm_90a"),
        ({"bc": 192}, "bc=192: the wgmma backward's key tile must be 64 or 128"),
        ({"bc": 32}, "bc=32: the wgmma backward's key tile must be 64 or 128"),
        ({"stages": 4}, "stages=4: the wgmma backward's Q/dO ring depth must be 2 or 3"),
        ({"stages": 1}, "stages=1: the wgmma backward's Q/dO ring depth must be 2 or 3"),
        ({"warps": 8}, "warps=8: the wgmma backward derives warps from bc (4 * (bc/64 + 1) = 12"),
    ]
    + [
        (
            {"features": ("gqapack",)},
            "features=('gqapack',): gqapack has no backward (it packs a decoding forward's "
            "query heads; the backward reads K and V once per GQA group already); drop gqapack "
            "for direction='bwd'",
        ),
        (
            {"features": ("varlen", "deterministic")},
            "features=('varlen', 'deterministic'): the wgmma backward's deterministic mode "
            "orders dQ's adds by key tile, which hooks (a mask skips key tiles) and varlen do not "
            "keep; drop deterministic, or use --family mma for bit-identical gradients",
        ),
        (
            {"features": ("alibi",), "dv": 64},
            "dv=64: the backward pass needs v's head dim equal to d=128",
        ),
    ],
)
def test_wgmma_backward_refusals_are_one_line_naming_value_rule_and_fix(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as info:
        bwd(d=fields.pop("d", 128), **fields)
    assert len(info.value.problems) == 1, info.value.problems
    assert message in info.value.problems[0], info.value.problems


@pytest.mark.parametrize(
    "features",
    [("window",), ("softcap",), ("alibi",), ("window", "softcap"), ("alibi", "softcap", "window")],
)
def test_a_wgmma_backward_takes_the_forwards_features_and_round_trips(
    features: tuple[str, ...],
) -> None:
    spec = bwd(d=128, causal=True, features=features)
    canonical = [f for f in ("window", "softcap", "alibi") if f in features]
    assert spec.name == NAME.replace("_causal_", "_causal_" + "_".join(canonical) + "_")
    assert KernelSpec.from_name(spec.name) == spec
    plain = bwd(d=128, causal=True)
    # the tiles, stages and shared memory are the plain variant's
    assert (spec.br, spec.bc, spec.stages, spec.warps, spec.smem_bytes) == (
        plain.br, plain.bc, plain.stages, plain.warps, plain.smem_bytes,
    )  # fmt: skip
    assert bwd_shape.kernel_names(spec) == tuple(
        n.replace(plain.name, spec.name) for n in bwd_shape.kernel_names(plain)
    )


WIDE = "flash_bwd_wgmma_d64_br128_bc128_bf16_causal_s2"


@pytest.mark.parametrize("features", [(), ("window",), ("alibi",), ("window", "alibi")])
def test_the_128_row_query_tile_at_d64_takes_two_stages_and_round_trips(
    features: tuple[str, ...],
) -> None:
    spec = bwd(d=64, br=128, causal=True, features=features)
    assert spec.name == WIDE.replace("_causal_", "_".join(("_causal", *features)) + "_")
    assert KernelSpec.from_name(spec.name) == spec
    assert (spec.bc, spec.stages, spec.warps) == (128, 2, 12)  # 3 stages do not fit
    assert wgmma_bwd.wide(spec) and not wgmma_bwd.wide(bwd(d=64, br=64))
    # d + br + 48 = 240: the two consumers' budget exactly
    assert wgmma_bwd.register_estimate(spec) == 240 == families.WGMMA_REGS[2][1]
    # 1024 + K, V + a 2-slot Q/dO ring + 2 x 2 dS^T buffers + dQ + D/LSE rows + barriers
    assert spec.smem_bytes == 1024 + 32768 + 65536 + 65536 + 32768 + 2048 + 72 == 199752
    # the default at d 64 where it applies (wgmma_bwd.default_tile), otherwise br 64
    assert bwd(d=64, causal=True, features=features) == spec
    for other in (("softcap",), ("deterministic",), ("varlen",)):
        assert bwd(d=64, features=other).br == 64
    assert bwd(d=64, bc=64).br == 64 and bwd(d=40).br == 64  # bc named: the plain tile
    # 3 stages named: the 64-row tile (the wide one's 3-stage ring does not fit)
    assert (bwd(d=64, stages=3).br, bwd(d=64, stages=2).br) == (64, 128)


def test_the_register_rule_refuses_past_the_consumer_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # d + br + 48 per consumer thread: d=128 br=64 is 240, exactly two consumers' budget
    assert wgmma_bwd.register_estimate(bwd(d=128)) == 240 == families.WGMMA_REGS[2][1]
    monkeypatch.setitem(families.WGMMA_REGS, 2, (24, 200))
    with pytest.raises(SpecError) as info:
        bwd(d=128)
    assert info.value.problems == [
        "d=128, br=64: ~240 registers per consumer thread of the wgmma backward (d_pad + br + 48) "
        "exceed the 200 that 2 consumer warpgroups get; lower br"
    ]
    assert bwd(d=64, br=64).d == 64  # 176 fits
    assert bwd(d=128, bc=64).bc == 64  # one consumer: its own budget (240)

def test_the_shared_memory_rule_uses_the_family_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(families.WgmmaFamily, "smem_limit", lambda self: 150_000)
    with pytest.raises(SpecError) as info:
        bwd(d=128)
    [line] = info.value.problems
    assert line.startswith("smem=198728 B: exceeds the 150000 B per block of sm_90a")
    assert line.endswith("lower stages, br or bc")
    assert bwd(d=64, br=64, stages=2).smem_bytes < 150_000


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # 1024 + 2*bc*d*2 + 2*stages*br*d*2 + 2*bc*br*2 + 4*br*d + 8*br*stages (each ring
        # slot's D and LSE rows) + 8*(1 + 4*stages)
        ({"d": 128}, 1024 + 65536 + 65536 + 32768 + 32768 + 1024 + 72),
        ({"d": 64, "bc": 64, "stages": 2}, 1024 + 16384 + 32768 + 16384 + 16384 + 1024 + 72),
        ({"d": 128, "stages": 3}, 1024 + 65536 + 98304 + 32768 + 32768 + 1536 + 104),
    ],
)
def test_the_shared_memory_formula(fields: dict[str, Any], expected: int) -> None:
    spec = bwd(**fields)
    assert spec.smem_bytes == expected
    assert bwd_shape.smems(spec) == (0, expected, 0)


def test_the_largest_wgmma_backward_fits_an_sm_90a_block() -> None:
    big = bwd(d=128, br=64, bc=128, stages=3)
    assert big.smem_bytes <= families.FAMILIES["wgmma"].smem_limit()


def test_sixteen_wgmma_backward_variants_ship_and_bundles_take_the_fast_ones() -> None:
    ships = shipped("wgmma", direction="bwd")
    assert {(s.d, s.dtype, s.causal, s.features) for s in ships} == {
        (d, t, c, f) for d in (64, 128) for t in ("fp16", "bf16") for c in (False, True)
        for f in ((), ("deterministic",))
    }  # fmt: skip
    # the default tiles (wgmma_bwd.default_tile): 128 x 128 at d 64 (2 stages), but 64 x 128
    # (3 stages) for its deterministic mode; 64 x 128 (2 stages) at d 128
    assert {(s.d, s.br, s.bc, s.stages, s.features) for s in ships} == {
        (64, 128, 128, 2, ()), (64, 64, 128, 3, ("deterministic",)),
        (128, 64, 128, 2, ()), (128, 64, 128, 2, ("deterministic",)),
    }  # fmt: skip
    assert len(shipped(direction="bwd")) == len(shipped("mma", direction="bwd")) + 16
    for spec in (s for s in ships if not s.features):  # (tests/bundle/ checks what it holds)
        assert f"kernels/{spec.name}.cu" in bundle_files([spec])
    # a feature variant does not, as in family mma (tests/runtime/test_backward_cpu.py)
    with pytest.raises(BundleError, match=r"backward variants with window are not bundled yet"):
        bundle_files([bwd(d=64, features=("window",))])


def test_families_without_a_backward_point_at_the_shipped_one() -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec(family="simt", direction="bwd")
    assert info.value.problems == [
        "direction='bwd': family simt has no backward kernel yet; use --family mma or --family "
        "wgmma for the backward pass"
    ]


def test_the_forward_wgmma_rules_are_unchanged_by_the_backward() -> None:
    fwd = KernelSpec(family="wgmma", d=128)
    assert fwd.name == "flash_fwd_wgmma_d128_br128_bc128_bf16_noncausal_s2"
    assert families.FAMILIES["wgmma"].consumers(fwd) == 2
    with pytest.raises(SpecError, match=r"stages=1: K/V ring depth must be 2, 3 or 4"):
        KernelSpec(family="wgmma", d=128, stages=1)


# ---- template values --------------------------------------------------------------------------
def test_the_context_for_d128_br64_bc128() -> None:
    spec = KernelSpec.from_name(NAME)
    ctx = context(spec)
    sdp = Wgmma(n=64, a_regs=False, trans_b=False, mma_type="bf16")
    dkv = Wgmma(n=128, a_regs=True, trans_b=True, mma_type="bf16")
    dq = Wgmma(n=64, a_regs=False, trans_b=True, mma_type="bf16", trans_a=True)
    assert {k: ctx[k] for k in (
        "consumers", "stages", "producer_regs", "consumer_regs", "pack_type", "pre_name",
        "last_name", "pre_lanes", "pre_rows", "sdp_fn", "dkv_fn", "dq_fn", "wgmma_wrappers",
    )} == {
        "consumers": 2, "stages": 2, "producer_regs": 24, "consumer_regs": 240,
        "pack_type": "bf16x2", "pre_name": f"{NAME}_pre", "last_name": f"{NAME}_post",
        "pre_lanes": bwd_shape.PRE_LANES_PER_ROW, "pre_rows": 384 // bwd_shape.PRE_LANES_PER_ROW,
        "sdp_fn": sdp.fn, "dkv_fn": dkv.fn, "dq_fn": dq.fn,
        "wgmma_wrappers": wrappers([sdp, dkv, dq]),
    }  # fmt: skip
    assert (ctx["d_pad"], ctx["dv_pad"], ctx["threads"], ctx["warps"]) == (128, 128, 384, 12)
    assert (ctx["smem_bytes"], ctx["min_blocks"], ctx["ctype"]) == (198728, 1, "__nv_bfloat16")
    assert ctx["dq_fn"].endswith("_ta_tb")


def test_the_context_of_the_128_row_tile() -> None:
    ctx = context(KernelSpec.from_name(WIDE))
    assert ctx["wide"] and not context(bwd(d=64, br=64))["wide"]
    # S^T and dP^T of 64 keys x 128 queries; dV, dK and dQ as at br 64 (N = d = 64)
    assert ctx["sdp_fn"] == Wgmma(n=128, a_regs=False, trans_b=False, mma_type="bf16").fn
    assert ctx["dkv_fn"] == Wgmma(n=64, a_regs=True, trans_b=True, mma_type="bf16").fn
    assert ctx["dq_fn"] == Wgmma(64, False, True, "bf16", trans_a=True).fn
    assert (ctx["stages"], ctx["consumers"], ctx["smem_bytes"]) == (2, 2, 199752)


def test_one_consumer_takes_dq_whole_and_fp16_uses_f16_wrappers() -> None:
    ctx = context(bwd(d=64, bc=64, dtype="fp16"))
    assert (ctx["consumers"], ctx["producer_regs"], ctx["consumer_regs"]) == (1, 56, 240)
    assert ctx["pack_type"] == "f16x2"
    assert ctx["sdp_fn"] == Wgmma(n=64, a_regs=False, trans_b=False, mma_type="f16").fn
    assert ctx["dq_fn"] == Wgmma(64, False, True, "f16", trans_a=True).fn  # a 64-column slab
    two = context(bwd(d=64))  # two consumers: still 64 columns of dQ a wgmma (not d/2)
    assert two["dq_fn"] == Wgmma(64, False, True, "bf16", trans_a=True).fn
    assert ".f32.f16.f16" in ctx["wgmma_wrappers"] and "bf16" not in ctx["wgmma_wrappers"]
    assert ctx["pre_rows"] == 256 // bwd_shape.PRE_LANES_PER_ROW


# ---- launch: grids and kernelParams -----------------------------------------------------------
def _problem(spec: KernelSpec) -> backward.BackwardProblem:
    d = spec.d
    fwd = Problem(2, 4, 100, 130, d, spec.dtype, (400 * d, 100 * d, d), (260 * d, 130 * d, d),
                  (260 * d, 130 * d, d), (400 * d, 100 * d, d), h_kv=2)  # fmt: skip
    s = fwd.q_strides
    return backward.BackwardProblem(fwd, s, s, fwd.k_strides, fwd.v_strides, 0, 0, 0, 0)


def test_the_grids_are_the_mma_backwards() -> None:
    spec = KernelSpec.from_name(NAME)
    bp = _problem(spec)
    rows = -(-100 // (384 // bwd_shape.PRE_LANES_PER_ROW))
    assert bp.grids(spec) == ((rows, 4, 2), (-(-130 // 128), 2, 2), (rows, 4, 2))


class _Driver:
    """Records each cuLaunchKernel: the function, grid, block, smem and the params' addresses."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, tuple[int, int, int], int, int, list[int]]] = []

    def cuCtxGetCurrent(self, ref: Any) -> int:
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_void_p))[0] = 7
        return 0

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra) -> int:
        addrs = [int(a) for a in params]
        self.calls.append((f, (gx, gy, gz), bx, smem, addrs))
        return 0


@pytest.fixture
def fake_launch(monkeypatch: pytest.MonkeyPatch) -> tuple[_Driver, list[tuple[Any, ...]]]:
    from flashgen.runtime import launch

    drv = _Driver()
    encoded: list[tuple[Any, ...]] = []

    def encode(ptr, dtype, b, h, t, d, strides, rows):
        encoded.append((ptr, dtype, b, h, t, d, strides, rows))
        m = tma.TensorMap()
        m.opaque[0], m.opaque[1], m.opaque[2] = ptr, rows, len(encoded)
        return m

    monkeypatch.setattr(launch, "driver", lambda: drv)
    monkeypatch.setattr(tma, "encode", encode)
    monkeypatch.setattr(tma, "_bwd_maps", tma.OrderedDict())
    return drv, encoded


def test_kernel_params_put_four_tensor_maps_ahead_of_the_mma_abi(
    monkeypatch: pytest.MonkeyPatch, fake_launch: tuple[_Driver, list[tuple[Any, ...]]]
) -> None:
    drv, encoded = fake_launch
    monkeypatch.setattr(backward, "_functions", lambda plan, spec: (201, 202, 203))
    spec = KernelSpec.from_name(NAME)
    bp = _problem(spec)
    prepared = backward.Prepared(SimpleNamespace(context=7), spec, bp, 0.25)
    ptrs = tuple(range(0x1000, 0x1000 + 0x100 * 11, 0x100))  # q k v o do lse d dqa dq dk dv
    prepared(ptrs, 0)
    assert [c[0] for c in drv.calls] == [201, 202, 203]
    assert [c[1] for c in drv.calls] == list(bp.grids(spec))
    assert {c[2] for c in drv.calls} == {384}
    assert [c[3] for c in drv.calls] == [0, spec.smem_bytes, 0]
    f = bp.fwd
    # tm_q, tm_k, tm_v, tm_do: Q and dO boxes of br rows over H heads, K and V of bc over H_kv
    assert encoded == [
        (ptrs[0], "bf16", 2, 4, 100, 128, f.q_strides, 64),
        (ptrs[1], "bf16", 2, 2, 130, 128, f.k_strides, 128),
        (ptrs[2], "bf16", 2, 2, 130, 128, f.v_strides, 128),
        (ptrs[4], "bf16", 2, 4, 100, 128, bp.do_strides, 64),
    ]
    for _, _, _, _, addrs in drv.calls:
        assert len(addrs) == 4 + len(backward.ABI_FORMAT) == 4 + 43
        maps = [tma.TensorMap.from_address(a) for a in addrs[:4]]
        assert [(m.opaque[0], m.opaque[1]) for m in maps] == [
            (ptrs[0], 64), (ptrs[1], 128), (ptrs[2], 128), (ptrs[4], 64),
        ]  # fmt: skip
        abi = addrs[4:]
        got = tuple(int(ctypes.c_void_p.from_address(a).value or 0) for a in abi[:11])
        assert got == ptrs
        assert [ctypes.c_int.from_address(a).value for a in abi[11:13]] == [100, 130]
        assert tuple(ctypes.c_longlong.from_address(a).value for a in abi[13:37]) == (
            bp.kernel_strides()
        )
        assert ctypes.c_float.from_address(abi[37]).value == 0.25
        assert ctypes.c_int.from_address(abi[38]).value == 2  # kv_group
        # the forward's four feature values, all off for a plain variant
        assert [ctypes.c_int.from_address(a).value for a in abi[39:41]] == [-1, -1]
        assert ctypes.c_float.from_address(abi[41]).value == 0.0
        assert ctypes.c_void_p.from_address(abi[42]).value is None


def test_a_wgmma_feature_variant_gets_the_call_values_after_the_maps(
    monkeypatch: pytest.MonkeyPatch, fake_launch: tuple[_Driver, list[tuple[Any, ...]]]
) -> None:
    from flashgen.generator.features import FeatureArgs

    drv, encoded = fake_launch
    monkeypatch.setattr(backward, "_functions", lambda plan, spec: (201, 202, 203))
    spec = bwd(d=128, causal=True, features=("window", "softcap", "alibi"))
    feats = FeatureArgs(window=(32, 0), softcap=50.0, alibi=0x5500)
    prepared = backward.Prepared(SimpleNamespace(context=7), spec, _problem(spec), 0.25, feats)
    prepared(tuple(range(0x1000, 0x1000 + 0x100 * 11, 0x100)), 0)
    assert len(encoded) == 4 and len(drv.calls) == 3
    for *_, addrs in drv.calls:
        abi = addrs[4:]
        assert [ctypes.c_int.from_address(a).value for a in abi[39:41]] == [32, 0]
        assert ctypes.c_float.from_address(abi[41]).value == 50.0
        assert ctypes.c_void_p.from_address(abi[42]).value == 0x5500
    with pytest.raises(ValueError, match=r"the call uses softcap but the variant is not"):
        backward.Prepared(
            SimpleNamespace(context=7), bwd(d=128), _problem(spec), 0.25, FeatureArgs(softcap=1.0)
        )


def test_the_maps_are_rebuilt_only_when_q_k_v_or_do_move(
    monkeypatch: pytest.MonkeyPatch, fake_launch: tuple[_Driver, list[tuple[Any, ...]]]
) -> None:
    drv, encoded = fake_launch
    monkeypatch.setattr(backward, "_functions", lambda plan, spec: (201, 202, 203))
    spec = KernelSpec.from_name(NAME)
    prepared = backward.Prepared(SimpleNamespace(context=7), spec, _problem(spec), 0.25)
    first = tuple(range(0x1000, 0x1000 + 0x100 * 11, 0x100))
    fresh_outputs = first[:5] + tuple(p + 0x10000 for p in first[5:])  # lse .. dv move
    prepared(first, 0)
    prepared(fresh_outputs, 0)
    assert len(encoded) == 4  # nothing the maps depend on moved
    new_do = fresh_outputs[:4] + (0x9000,) + fresh_outputs[5:]
    prepared(new_do, 0)
    assert len(encoded) == 8 and encoded[-1][0] == 0x9000
    last = drv.calls[-1][4]
    assert tma.TensorMap.from_address(last[3]).opaque[0] == 0x9000
    prepared(first, 0)  # back to the first pointers: from the cache, not encoded again
    assert len(encoded) == 8


def test_the_mma_backward_still_has_no_leading_arguments(
    monkeypatch: pytest.MonkeyPatch, fake_launch: tuple[_Driver, list[tuple[Any, ...]]]
) -> None:
    drv, encoded = fake_launch
    monkeypatch.setattr(backward, "_functions", lambda plan, spec: (101, 102, 103))
    spec = KernelSpec(family="mma", d=64, direction="bwd", causal=True)
    assert backward.prefix_builder("mma") is None
    prepared = backward.Prepared(SimpleNamespace(context=7), spec, _problem(spec), 0.5)
    ptrs = tuple(range(16, 16 * 12, 16))
    prepared(ptrs, 0)
    assert not encoded and len(prepared._params) == len(backward.ABI_FORMAT) == 43
    for *_, addrs in drv.calls:
        assert tuple(int(ctypes.c_void_p.from_address(a).value or 0) for a in addrs[:11]) == ptrs


def test_a_prefix_builder_names_known_pointers() -> None:
    with pytest.raises(ValueError, match=r"uses=\('x',\): name some of q, k, v, o, do"):
        backward.register_prefix_args("nope", lambda s, p, ptrs: [], uses=("x",))


# ---- flashgen.torch: opt-in selection ---------------------------------------------------------
@pytest.fixture
def fgt(monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("torch")
    mod = pytest.importorskip("flashgen.torch")
    monkeypatch.setattr(mod, "_device_arch", lambda dev: "sm_90")
    monkeypatch.delenv(mod.WGMMA_BWD_ENV, raising=False)
    return mod


def _call(d: int = 128, dtype: str = "bf16") -> tuple[Problem, tuple[Any, ...]]:
    import torch

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    q = torch.empty(2, 4, 100, d, device="meta", dtype=tdt)
    s = (400 * d, 100 * d, d)
    return Problem(2, 4, 100, 100, d, dtype, s, s, s, s), (q, q, q, q, q)


def test_torch_takes_the_wgmma_backward_on_sm_90_unless_told_not_to(
    fgt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem, tensors = _call()
    monkeypatch.delenv(fgt.WGMMA_BWD_ENV, raising=False)
    assert fgt._bwd_family(0, problem, False, tensors) == "wgmma"  # the default on sm_90
    monkeypatch.setenv(fgt.WGMMA_BWD_ENV, "0")
    assert fgt._bwd_family(0, problem, False, tensors) == "mma"
    monkeypatch.setenv(fgt.WGMMA_BWD_ENV, "1")
    assert fgt._bwd_family(0, problem, False, tensors) == "wgmma"
    assert fgt._bwd_family(0, problem, True, tensors) == "wgmma"  # deterministic: its own
    for d, dtype, want in ((96, "bf16", "wgmma"), (72, "fp16", "wgmma"), (256, "bf16", "mma"),
                           (100, "bf16", "mma"), (64, "fp32", "mma"),
                           (64, "fp16", "wgmma")):  # fmt: skip
        other, like = _call(d, dtype)
        assert fgt._bwd_family(0, other, False, like) == want, (d, dtype)
    expanded = tensors[0][:, :1].expand(2, 4, 100, 128)  # stride 0 on heads: no TMA
    assert fgt._bwd_family(0, problem, False, (*tensors[:4], expanded)) == "mma"
    monkeypatch.setattr(fgt, "_device_arch", lambda dev: "sm_80")
    assert fgt._bwd_family(0, problem, False, tensors) == "mma"
    monkeypatch.setattr(fgt, "_device_arch", lambda dev: "sm_100")
    assert fgt._bwd_family(0, problem, False, tensors) == "mma"


def test_torch_builds_the_plan_of_the_chosen_family(
    fgt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flashgen.runtime import launch

    made: list[tuple[str, str]] = []

    def plan(spec: KernelSpec, cubin: Any, arch: str, dev: int) -> Any:
        made.append((spec.name, arch))
        return SimpleNamespace(spec=spec)

    monkeypatch.setattr(launch, "plan", plan)
    monkeypatch.setattr(fgt, "_bwd_plans", {})
    spec, _ = fgt._bwd_plan(0, 128, "bf16", True, False, "wgmma")
    assert spec.name == NAME
    spec, _ = fgt._bwd_plan(0, 128, "bf16", True, False, "mma")
    assert spec.family == "mma"
    assert made == [(NAME, "sm_90a"), (spec.name, "sm_90")]
    fgt.clear_cache()
    assert not fgt._bwd_plans


def test_torch_builds_the_backward_plan_of_the_calls_features(
    fgt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Window, softcap and ALiBi keep sm_90 on the wgmma backward (the family choice ignores
    them) and are compiled into the variant; each feature set has a plan of its own."""
    from flashgen.runtime import launch

    made: list[str] = []

    def plan(spec: KernelSpec, cubin: Any, arch: str, dev: int) -> Any:
        made.append(spec.name)
        return SimpleNamespace(spec=spec)

    monkeypatch.setattr(launch, "plan", plan)
    monkeypatch.setattr(fgt, "_bwd_plans", {})
    spec, _ = fgt._bwd_plan(0, 128, "bf16", True, False, "wgmma", features=("window", "softcap"))
    assert spec.name == NAME.replace("_causal_", "_causal_window_softcap_")
    spec, _ = fgt._bwd_plan(0, 128, "bf16", True, False, "wgmma", features=("window", "softcap"))
    assert len(made) == 1  # cached
    spec, _ = fgt._bwd_plan(0, 128, "bf16", True, False, "wgmma")
    assert spec.name == NAME and len(made) == 2  # the plain variant: another key
    spec, _ = fgt._bwd_plan(0, 64, "fp16", False, True, "mma", features=("alibi",))
    assert spec.name == "flash_bwd_mma_d64_br64_bc64_fp16_noncausal_alibi_deterministic_w4_s2"
    problem, tensors = _call()
    assert fgt._bwd_family(0, problem, False, tensors) == "wgmma"


# ---- rendering and nvcc (once the template exists) ----------------------------------------------
COMPILED = ["flash_bwd_wgmma_d64_br64_bc128_bf16_causal_s2", NAME, WIDE]


@needs_template
@pytest.mark.parametrize("name", COMPILED)
def test_the_render_has_three_kernels_each_taking_four_maps_then_the_mma_abi(name: str) -> None:
    from flashgen.generator.render import render

    spec = KernelSpec.from_name(name)
    src = render(spec).source
    assert "{%" not in src and "{{" not in src
    assert "templates/wgmma_bwd.cu.j2" in src.splitlines()[0]
    assert src.count('extern "C" __global__') == 3
    for symbol in bwd_shape.kernel_names(spec):
        m = re.search(rf"\b{symbol}\(", src)
        assert m, symbol
        sig = src[m.end() : src.index("{", m.end())]
        at = [sig.find(t) for t in ("tm_q", "tm_k", "tm_v", "tm_do")]
        assert -1 not in at and at == sorted(at), (symbol, at)
        assert sig.count("__grid_constant__") == 4 and sig.count("long long") == 24, symbol
        assert at[-1] < sig.index("long long")
        # after the maps, exactly the mma backward's ABI (the feature values last)
        assert abi_codes(src, symbol) == backward.ABI_FORMAT, symbol
    assert render(spec).source == src


@needs_template
def test_a_feature_variant_renders_its_flags_and_the_same_abi() -> None:
    from flashgen.generator.render import render

    spec = bwd(d=128, causal=True, features=("window", "alibi"))
    src = render(spec).source
    for flag, on in (("WINDOW", True), ("SOFTCAP", False), ("ALIBI", True)):
        assert f"constexpr bool {flag} = {'true' if on else 'false'};" in src, flag
    for symbol in bwd_shape.kernel_names(spec):
        assert abi_codes(src, symbol) == backward.ABI_FORMAT, symbol


@needs_template
def test_the_d_and_lse_rows_ride_in_the_q_and_do_transactions() -> None:
    from flashgen.generator.render import render

    src = render(bwd(d=128, causal=True)).source
    # the producer's bulk copies, counted into the slot's full barriers
    assert "mbar_expect_tx(&q_full[s], Q_BYTES + LD_BYTES);" in src
    assert "bulk_load(lds + BR, ld + tqp, LD_BYTES, &q_full[s]);" in src  # LSE_2
    assert "mbar_expect_tx(&do_full[s], Q_BYTES + LD_BYTES);" in src
    assert "bulk_load(lds, ld, LD_BYTES, &do_full[s]);" in src  # D
    # the consumers read them from the slot, after its full barrier; no global loads remain
    at = src[src.index("consumers =====") :].index
    assert at("mbar_wait(&q_full[s], phase);") < at("columns(lds_t + BR, l2);")
    assert at("mbar_wait(&do_full[s], phase);") < at("columns(lds_t, dd);")
    assert "prefetch.global" not in src and "__ldg(reinterpret_cast<const float2*>" not in src
    assert "DQ_BYTES + 2 * STAGES * LD_BYTES + 8 * BARRIERS" in src  # the static_assert
    # every consumer thread arrives on the empty barriers (each read the rows itself)
    assert "mbar_init(&q_empty[s], 128 * CONSUMERS);" in src


@needs_template
def test_the_128_row_tile_splits_dq_by_query_rows_and_reads_d_and_lse_where_used() -> None:
    from flashgen.generator.render import render

    src = render(KernelSpec.from_name(WIDE)).source
    assert "static_assert(BR == 128 && D == 64 && CONSUMERS == 2," in src
    consumers = src[src.index("consumers =====") :]
    # D and LSE_2 read per n-tile from the ring slot, not as arrays of BR / 4 ahead
    assert "float l2[BR / 4];" not in consumers and "float dd[BR / 4];" not in consumers
    assert "const float2 l2 = ld_col(lds_t + BR, nt);" in consumers
    # P^T, dV and dS^T by query halves: dV's half 0 is issued before dP^T is waited for
    at = consumers.index
    assert at("pack_half(s_acc, p_frag, hq);") < at("wgmma_wait<1>();  // dP^T has landed")
    assert at("wgmma_wait<1>();  // dP^T has landed") < at("pack_half(dp_acc, ds_frag, hq);")
    # dS^T in 64-query slabs; each consumer reduces its own 64 rows of dQ every step
    assert "(k / 4) * 64 * CHUNK * E16 + (((2 * (k % 4) + m / 2) ^ (lane % 8)) * 16)" in consumers
    assert "bulk_reduce_add(dq_accum + rows * D, dQs + c * 64 * CHUNK, 64 * CHUNK" in consumers
    assert "my_dq" not in consumers
    # the post kernel reads each 64-row half of a tile as a 64-row tile
    assert "const int r = row % 64;" in src[src.index(f"{WIDE}_post(") :]
    # the br 64 kernel is as it was
    plain = render(bwd(d=64, br=64, causal=True)).source
    assert "pack_half" not in plain and "columns(lds_t + BR, l2);" in plain


@needs_template
def test_varlen_backwards_bulk_copy_their_padded_rows_too() -> None:
    from flashgen.generator.families.wgmma.bwd import VARLEN_SEQ_BYTES
    from flashgen.generator.render import render

    spec = bwd(d=128, causal=True, features=("varlen",))
    src = render(spec).source
    # the sequence's padded rows (q_pad: a multiple of PAD_ALIGN, 16-byte aligned)
    assert "d_buf + ((long long)batch * n_heads + head) * 2 * tqp + q_pad + q0;" in src
    assert "bulk_load(lds, ld, LD_BYTES, &do_full[s]);" in src
    assert "prefetch.global.L1" not in src and "columns(lds_t + BR, l2);" in src
    assert spec.smem_bytes == bwd(d=128, causal=True).smem_bytes + VARLEN_SEQ_BYTES


@needs_template
@pytest.mark.parametrize(
    "name",
    [*COMPILED, "flash_bwd_wgmma_d64_br128_bc128_fp16_noncausal_s2",
     "flash_bwd_wgmma_d64_br128_bc128_bf16_causal_window_alibi_s2"],
)  # fmt: skip
def test_nvcc_compiles_the_three_kernels_for_sm_90a_without_spills_or_serialized_wgmma(
    name: str, nvcc_required: Path
) -> None:
    from flashgen.generator.compile import BASE_FLAGS, run_nvcc
    from flashgen.generator.render import render
    from flashgen.generator.report import parse_ptxas

    spec = KernelSpec.from_name(name)
    _, log = run_nvcc([*BASE_FLAGS, "-cubin", "-arch=sm_90a"], render(spec).source)
    for symbol in bwd_shape.kernel_names(spec):
        r = parse_ptxas(log, symbol, "sm_90a")
        assert r.registers > 0 and r.spill_bytes == 0, (symbol, r)
    # C7510-C7515: ptxas serialized the wgmmas (e.g. C7512, too few registers: every wgmma
    # waited for before the next, which a dQ issued while dV still held P^T brought about)
    assert "C751" not in log, log


@needs_template
def test_cli_builds_a_wgmma_backward_variant(nvcc_required: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from flashgen.cli import main

    run = CliRunner().invoke(
        main, ["build", "--family", "wgmma", "--direction", "bwd", "--d", "64", "--causal",
               "--out", str(tmp_path)],
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    assert (tmp_path / "flash_bwd_wgmma_d64_br128_bc128_bf16_causal_s2.cu").exists()
    assert "sm_90a" in run.output


def test_cli_renders_nothing_for_an_invalid_wgmma_backward(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from flashgen.cli import main

    run = CliRunner().invoke(
        main, ["build", "--family", "wgmma", "--direction", "bwd", "--d", "200", "--no-compile",
               "--out", str(tmp_path)],
    )  # fmt: skip
    assert run.exit_code == 2
    assert "d=200: the wgmma backward takes d a multiple of 8 up to 128" in run.output
