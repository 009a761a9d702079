"""The backward variants on a CPU: spec and name, refusals, rendering, and nvcc with zero spills."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _nvcc import requires_nvcc

from flashgen.generator import backward as bwd_shape
from flashgen.generator.compile import BASE_FLAGS, run_nvcc
from flashgen.generator.families.mma import bwd as mma_bwd
from flashgen.generator.render import render
from flashgen.generator.report import parse_ptxas
from flashgen.generator.space import shipped
from flashgen.generator.spec import KernelSpec, SpecError
from flashgen.runtime import backward

BWD = shipped("mma", direction="bwd")  # family mma's (test_wgmma_bwd_cpu.py has wgmma's)


def test_sixteen_mma_backward_variants_ship_and_the_forward_space_has_none() -> None:
    assert len(BWD) == 16
    assert {(s.d, s.dtype, s.causal, bwd_shape.is_deterministic(s)) for s in BWD} == {
        (d, t, c, det) for d in (64, 128) for t in ("fp16", "bf16") for c in (False, True)
        for det in (False, True)
    }  # fmt: skip
    assert all(s.direction == "bwd" and s.family == "mma" for s in BWD)
    assert all(s.direction == "fwd" for s in shipped())


@pytest.mark.parametrize("spec", BWD, ids=lambda s: s.name)
def test_backward_names_round_trip(spec: KernelSpec) -> None:
    assert re.fullmatch(
        r"flash_bwd_mma_d\d+_br\d+_bc\d+_(fp16|bf16)_(causal|noncausal)(_deterministic)?_w\d+_s\d+",
        spec.name,
    )
    assert KernelSpec.from_name(spec.name) == spec


def test_a_backward_spec_gets_the_backward_defaults() -> None:
    spec = KernelSpec(family="mma", d=64, direction="bwd")
    assert (spec.br, spec.bc, spec.warps) == (*backward_tile(), 4)
    assert spec.name == "flash_bwd_mma_d64_br64_bc64_bf16_noncausal_w4_s2"
    # d=128: one Q/dO stage, so two blocks still fit an sm_80 SM
    assert KernelSpec(family="mma", d=128, direction="bwd").stages == 1


def backward_tile() -> tuple[int, int]:
    return KernelSpec(family="mma", direction="bwd").fam.bwd_tile


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"family": "simt"},
            "direction='bwd': family simt has no backward kernel yet; use --family mma",
        ),
        (
            {"family": "mma", "features": ("gqapack",)},
            "features=('gqapack',): gqapack has no backward (it packs a decoding forward's "
            "query heads; the backward reads K and V once per GQA group already); drop gqapack "
            "for direction='bwd'",
        ),
        (
            {"family": "mma", "features": ("window", "gqapack")},
            "features=('window', 'gqapack'): gqapack has no backward",
        ),
        (
            {"family": "mma", "features": ("deterministic",), "br": 32},
            "br=32, bc=64: the deterministic backward's dQ kernel gives each of the bc/16 = 4 "
            "warps 16 of the br query rows, so it needs br = bc; try br=64",
        ),
        ({"family": "mma", "dv": 128}, "dv=128: the backward pass needs v's head dim equal to d"),
        (
            {"family": "mma", "dv": 128, "features": ("window",)},
            "dv=128: the backward pass needs v's head dim equal to d=64 for now; leave dv unset "
            "for direction='bwd'",
        ),
        ({"family": "mma", "warps": 8}, "warps=8: the backward gives each warp 16 of the bc=64"),
        ({"family": "mma", "br": 256}, "br=256: the backward's query tile must be a multiple"),
        ({"family": "mma", "stages": 3}, "stages=3: the Q/dO ring depth must be 1 or 2"),
        ({"family": "mma", "d": 128, "br": 128}, "~288 registers per thread of the backward"),
        ({"family": "mma", "dtype": "fp32"}, "dtype=fp32: family mma needs a tensor-core dtype"),
    ],
)
def test_backward_refusals_name_the_value_and_the_fix(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec(direction="bwd", d=fields.pop("d", 64), **fields)  # type: ignore[arg-type]
    assert any(message in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    ("features", "name"),
    [
        (("window", "softcap"), "flash_bwd_mma_d64_br64_bc64_bf16_causal_window_softcap_w4_s2"),
        (("alibi",), "flash_bwd_mma_d64_br64_bc64_bf16_causal_alibi_w4_s2"),
        (
            ("alibi", "softcap", "window"),
            "flash_bwd_mma_d64_br64_bc64_bf16_causal_window_softcap_alibi_w4_s2",
        ),
        (
            ("deterministic", "window"),
            "flash_bwd_mma_d64_br64_bc64_bf16_causal_window_deterministic_w4_s2",
        ),
    ],
)
def test_a_backward_spec_takes_the_forwards_features_and_round_trips(
    features: tuple[str, ...], name: str
) -> None:
    spec = KernelSpec(family="mma", d=64, causal=True, direction="bwd", features=features)
    assert spec.name == name
    assert KernelSpec.from_name(name) == spec
    assert bwd_shape.is_deterministic(spec) == ("deterministic" in features)
    # the tiles and kernels are the plain variant's: features are arguments and a few flags
    plain = spec.replace(features=tuple(f for f in features if f == "deterministic"))
    assert (spec.br, spec.bc, spec.warps, spec.stages) == (
        plain.br, plain.bc, plain.warps, plain.stages,
    )  # fmt: skip
    assert bwd_shape.kernel_names(spec)[1] == name
    src = render(spec).source
    for token in ("window", "softcap", "alibi"):
        flag = "true" if token in features else "false"
        assert f"constexpr bool {token.upper()} = {flag};" in src, token


def test_the_backward_features_are_the_forwards_and_deterministic() -> None:
    from flashgen.generator.families import FAMILIES

    assert FAMILIES["mma"].bwd_features == {
        "deterministic", "window", "softcap", "alibi", "scoremod", "maskmod"
    }
    assert FAMILIES["wgmma"].bwd_features == {
        "deterministic", "window", "softcap", "alibi", "varlen", "scoremod", "maskmod"
    }


def test_deterministic_is_a_backward_only_feature() -> None:
    with pytest.raises(SpecError) as info:
        KernelSpec(family="mma", d=64, features=("deterministic",))
    assert info.value.problems == [
        "features: 'deterministic' is a backward-only feature (dQ without atomics); drop it "
        "for direction='fwd' (the forward is deterministic already)"
    ]
    with pytest.raises(SpecError, match=r"'deterministic' is not supported by family simt"):
        KernelSpec(family="simt", d=64, features=("deterministic",))


def test_the_deterministic_mode_is_named_and_round_trips() -> None:
    spec = KernelSpec(family="mma", d=64, causal=True, direction="bwd", features=("deterministic",))
    assert spec.name == "flash_bwd_mma_d64_br64_bc64_bf16_causal_deterministic_w4_s2"
    assert KernelSpec.from_name(spec.name) == spec
    assert bwd_shape.is_deterministic(spec)
    assert bwd_shape.kernel_names(spec) == (f"{spec.name}_pre", spec.name, f"{spec.name}_dq")
    fast = spec.replace(features=())
    assert bwd_shape.kernel_names(fast)[2] == f"{fast.name}_post"
    assert not bwd_shape.is_deterministic(fast)


def test_an_unknown_direction_is_refused_with_the_choices() -> None:
    with pytest.raises(
        SpecError,
        match=r"direction='up': unknown direction; choose one of fwd, bwd",
    ):
        KernelSpec(direction="up")


@pytest.mark.parametrize("spec", BWD, ids=lambda s: s.name)
def test_backward_render_is_plain_cuda_with_three_kernels(spec: KernelSpec) -> None:
    src = render(spec).source
    assert "{%" not in src and "{{" not in src and "{#" not in src
    assert "templates/mma_bwd.cu.j2" in src.splitlines()[0]
    assert src.count('extern "C" __global__') == 3
    for symbol in bwd_shape.kernel_names(spec):
        assert re.search(rf"\b{symbol}\(", src), symbol
    assert f"constexpr int STAGES = {spec.stages};" in src
    det = bwd_shape.is_deterministic(spec)
    assert f"constexpr bool DETERMINISTIC = {'true' if det else 'false'};" in src
    # the deterministic mode has a dQ kernel and no post kernel; the fast one the other way
    assert (f"{spec.name}_dq(" in src, f"{spec.name}_post(" in src) == (det, not det)
    if det:
        assert f"constexpr int DQ_SMEM_BYTES = {mma_bwd.dq_smem_bytes(spec)};" in src
    assert render(spec).source == src  # deterministic


def abi_codes(src: str, symbol: str) -> str:
    """The struct codes of a rendered kernel's parameters (P pointer, i int, q long long,
    f float), its leading `__grid_constant__` tensor maps left out."""
    start = re.search(rf"\b{symbol}\(", src)
    assert start, symbol
    sig = re.sub(r"//[^\n]*", "", src[start.end() : src.index("{", start.end())])
    codes = []
    for param in (p.strip().rstrip(")") for p in sig.split(",")):
        if "__grid_constant__" in param:
            continue
        code = next(
            c for t, c in (("*", "P"), ("long long", "q"), ("int", "i"), ("float", "f"))
            if t in param
        )  # fmt: skip
        codes.append(code)
    return "".join(codes)


def test_the_abi_format_has_one_code_per_kernel_argument() -> None:
    # 11 pointers, tq, tk, 24 strides, scale_log2, kv_group, then the forward's four feature
    # values (window_left, window_right, softcap, alibi_slopes): the order the template documents
    assert backward.ABI_FORMAT == "P" * 11 + "ii" + "q" * 24 + "f" + "i" + "ii" + "f" + "P"
    assert len(backward.ABI_FORMAT) == 43
    for spec in (BWD[0], BWD[0].replace(features=("window", "softcap", "alibi"))):
        src = render(spec).source
        for symbol in bwd_shape.kernel_names(spec):
            assert abi_codes(src, symbol) == backward.ABI_FORMAT, symbol


def test_validation_refuses_a_gradient_of_the_wrong_shape() -> None:
    spec = BWD[0]
    b, h, t, d = 1, 2, 8, spec.d
    dt = np.dtype(spec.dtype_info.numpy)
    q = np.zeros((b, h, t, d), dt)
    lse = np.zeros((b, h, t), np.float32)
    with pytest.raises(ValueError, match=r"do: shape \(1, 2, 8, 32\).*must be \(1, 2, 8, 64\)"):
        backward.validate_backward(
            spec, q, q, q, q, lse, q[..., :32], q, q, q, check_pointers=False
        )
    with pytest.raises(ValueError, match=r"dk: shape .*must be \(1, 2, 8, 64\) .*k's shape"):
        backward.validate_backward(spec, q, q, q, q, lse, q, q, q[:, :1], q, check_pointers=False)
    with pytest.raises(ValueError, match=r"a forward variant; pass spec\.replace\(direction="):
        backward.validate_backward(
            spec.replace(direction="fwd"), q, q, q, q, lse, q, q, q, q, check_pointers=False
        )
    problem = backward.validate_backward(spec, q, q, q, q, lse, q, q, q, q, check_pointers=False)
    assert problem.grids(spec) == ((1, 2, 1), (1, 2, 1), (1, 2, 1))
    assert len(problem.kernel_strides()) == 24


def test_the_deterministic_grids_and_shared_memory() -> None:
    spec = KernelSpec(family="mma", d=64, direction="bwd", features=("deterministic",))
    dt = np.dtype(spec.dtype_info.numpy)
    q = np.zeros((2, 3, 1000, 64), dt)
    k = np.zeros((2, 3, 130, 64), dt)
    lse = np.zeros((2, 3, 1000), np.float32)
    problem = backward.validate_backward(spec, q, k, k, q, lse, q, q, k, k, check_pointers=False)
    pre_rows = bwd_shape.pre_rows(spec)
    # pre per PRE_ROWS rows; main per key tile of BC; dQ per query tile of BR (the forward's)
    assert problem.grids(spec) == ((-(-1000 // pre_rows), 3, 2), (3, 3, 2), (16, 3, 2))
    # Q, dO and a two-deep K/V ring at d=64 (rows of 64+8 bf16); d=128: one K/V stage
    assert bwd_shape.smems(spec) == (0, spec.smem_bytes, 2 * 72 * (2 * 64 + 2 * 2 * 64))
    big = spec.replace(d=128)
    assert mma_bwd.dq_stages(big) == 1
    assert bwd_shape.smems(big)[2] == 2 * 136 * (2 * 64 + 2 * 64)
    assert bwd_shape.smems(spec.replace(features=()))[2] == 0  # the post kernel: none


# ---- nvcc -----------------------------------------------------------------------------------
def _compile_report(job: tuple[KernelSpec, str]) -> list[str]:
    spec, arch = job
    _, log = run_nvcc([*BASE_FLAGS, "-cubin", f"-arch={arch}"], render(spec).source)
    bad = []
    for symbol in bwd_shape.kernel_names(spec):
        r = parse_ptxas(log, symbol, arch)
        if r.spill_bytes or r.registers <= 0:
            bad.append(f"{symbol} [{arch}]: {r.registers} registers, {r.spill_bytes} B spilled")
    return bad


@pytest.mark.compile_all  # nvcc-heavy: runs with the compile-everything check
@requires_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_deterministic_mode_has_no_atomics_in_its_ptx(arch: str) -> None:
    """The fast mode's dQ is the only floating-point atomic of the backward; the deterministic
    variant's PTX has no atom./red. instruction at all (and the fast one's does: the test can
    fail)."""
    for spec in (s for s in BWD if s.d == 64 and s.causal and s.dtype == "bf16"):
        ptx, _ = run_nvcc([*BASE_FLAGS, "-ptx", f"-arch={arch}"], render(spec).source)
        has_atomics = re.search(rb"\b(atom|red)\.", ptx) is not None
        assert has_atomics != bwd_shape.is_deterministic(spec), spec.name


@requires_nvcc
@pytest.mark.compile_all  # every backward variant through nvcc: with the compile-everything check
def test_every_shipped_backward_variant_compiles_without_spills() -> None:
    """All three kernels of each shipped backward variant, for each arch it ships for."""
    jobs = [(s, a) for s in BWD for a in s.archs]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        failures = [msg for msgs in pool.map(_compile_report, jobs) for msg in msgs]
    assert not failures, "\n".join(failures)


def test_cli_builds_a_backward_variant_and_bundles_it(tmp_path):
    from click.testing import CliRunner

    from flashgen.cli import main

    run = CliRunner().invoke(
        main, ["build", "--family", "mma", "--d", "64", "--direction", "bwd", "--dtype", "fp16",
               "--no-compile", "--out", str(tmp_path)],
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    assert (tmp_path / "flash_bwd_mma_d64_br64_bc64_fp16_noncausal_w4_s2.cu").exists()
    assert "not a shipped variant" not in run.output
    bundled = CliRunner().invoke(
        main, ["build", "--family", "mma", "--d", "64", "--direction", "bwd", "--no-compile",
               "--bundle", str(tmp_path / "b")],
    )  # fmt: skip
    assert bundled.exit_code == 0, bundled.output
    kernel = "flash_bwd_mma_d64_br64_bc64_bf16_noncausal_w4_s2.cu"
    assert (tmp_path / "b" / "kernels" / kernel).exists()


def test_inspect_explains_a_backward_variant_without_the_forward_traffic_model():
    from click.testing import CliRunner

    from flashgen.cli import main

    name = "flash_bwd_mma_d64_br64_bc64_bf16_causal_w4_s2"
    run = CliRunner().invoke(main, ["inspect", "--name", name])
    assert run.exit_code == 0, run.output
    assert "spills         0 B" in run.output
    assert "traffic model  forward variants only" in run.output


@pytest.mark.parametrize("family", ["mma", "wgmma"])
def test_bundles_refuse_deterministic_backward_variants(family):
    from flashgen.bundle.emit import BundleError, bundle_files

    spec = KernelSpec(family=family, d=64, direction="bwd", features=("deterministic",))
    with pytest.raises(BundleError, match="deterministic backward variants are not bundled yet"):
        bundle_files([spec])


def test_a_prepared_backward_only_rewrites_the_pointers_between_calls(monkeypatch):
    import ctypes
    from types import SimpleNamespace

    from flashgen.runtime import backward, launch
    from flashgen.runtime.validate import Problem

    calls: list[tuple[int, tuple[int, int, int], tuple[int, ...], float]] = []

    class Driver:
        def cuCtxGetCurrent(self, ref):
            ctypes.cast(ref, ctypes.POINTER(ctypes.c_void_p))[0] = 7
            return 0

        def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            addrs = [int(a) for a in params]
            ptrs = tuple(int(ctypes.c_void_p.from_address(a).value or 0) for a in addrs[:11])
            scale = ctypes.c_float.from_address(addrs[11 + 2 + 24]).value
            calls.append((f, (gx, gy, gz), ptrs, scale))
            return 0

    monkeypatch.setattr(launch, "driver", lambda: Driver())
    monkeypatch.setattr(backward, "_functions", lambda plan, spec: (101, 102, 103))
    spec = KernelSpec(family="mma", d=64, direction="bwd", causal=True)
    fwd = Problem(2, 4, 100, 130, 64, spec.dtype, (25600, 6400, 64), (16640, 8320, 64),
                  (16640, 8320, 64), (25600, 6400, 64), h_kv=2)  # fmt: skip
    s = fwd.q_strides
    bp = backward.BackwardProblem(fwd, s, s, fwd.k_strides, fwd.v_strides, 0, 0, 0, 0)
    plan = SimpleNamespace(context=7, smem=spec.smem_bytes)
    prepared = backward.Prepared(plan, spec, bp, 0.5)
    first, second = tuple(range(16, 16 * 12, 16)), tuple(range(4096, 4096 + 16 * 11, 16))
    prepared(first, 0)
    prepared(second, 0)
    assert [c[0] for c in calls] == [101, 102, 103] * 2  # the three kernels in order, twice
    assert [c[1] for c in calls[:3]] == list(bp.grids(spec))
    assert all(c[2] == first for c in calls[:3]) and all(c[2] == second for c in calls[3:])
    assert all(c[3] == 0.5 for c in calls)  # the scalars stay as prepared


@pytest.mark.parametrize("family", ["mma", "wgmma"])
def test_bundles_refuse_backward_variants_with_features(family):
    from flashgen.bundle.emit import BundleError, bundle_files

    for feats in (("window",), ("softcap",), ("alibi",), ("window", "softcap")):
        spec = KernelSpec(family=family, d=64, causal=True, direction="bwd", features=feats)
        with pytest.raises(BundleError) as info:
            bundle_files([spec])
        message = str(info.value)
        assert "\n" not in message
        assert message == (
            f"{spec.name}: backward variants with {', '.join(feats)} are not bundled yet (the "
            "bundle's backward launcher passes the features off); bundle the plain backward "
            "variant; backward features in bundles come later"
        )
    # the forward variant with the same features still bundles
    fwd = KernelSpec(family=family, d=64, causal=True, features=("window",))
    assert any(fwd.name in path for path in bundle_files([fwd]))


# ---- the feature values on the host side -----------------------------------------------------
def _fake_prepared_launch(monkeypatch, spec, features=None, scale=0.5):
    """A Prepared backward on a fake driver: the kernelParams of its first launch, as values
    decoded by ABI_FORMAT."""
    import ctypes
    from types import SimpleNamespace

    from flashgen.runtime import launch
    from flashgen.runtime.validate import Problem

    seen: list[list[int]] = []

    class Driver:
        def cuCtxGetCurrent(self, ref):
            ctypes.cast(ref, ctypes.POINTER(ctypes.c_void_p))[0] = 7
            return 0

        def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            seen.append([int(a) for a in params])
            return 0

    monkeypatch.setattr(launch, "driver", lambda: Driver())
    monkeypatch.setattr(backward, "_functions", lambda plan, spec: (101, 102, 103))
    fwd = Problem(2, 4, 100, 130, spec.d, spec.dtype, (25600, 6400, 64), (16640, 8320, 64),
                  (16640, 8320, 64), (25600, 6400, 64), h_kv=2)  # fmt: skip
    s = fwd.q_strides
    bp = backward.BackwardProblem(fwd, s, s, fwd.k_strides, fwd.v_strides, 0, 0, 0, 0)
    plan = SimpleNamespace(context=7, smem=spec.smem_bytes)
    args = () if features is None else (features,)
    prepared = backward.Prepared(plan, spec, bp, scale, *args)
    prepared(tuple(range(16, 16 * 12, 16)), 0)
    readers = {"P": ctypes.c_void_p, "i": ctypes.c_int, "q": ctypes.c_longlong,
               "f": ctypes.c_float}  # fmt: skip
    values = []
    for code, addr in zip(backward.ABI_FORMAT, seen[0], strict=True):
        values.append(readers[code].from_address(addr).value or 0)
    assert all(len(call) == len(backward.ABI_FORMAT) for call in seen)
    return values


def test_a_plain_backward_passes_every_feature_off(monkeypatch):
    spec = KernelSpec(family="mma", d=64, direction="bwd", causal=True)
    values = _fake_prepared_launch(monkeypatch, spec)
    assert values[37:39] == [0.5, 2]  # scale_log2, kv_group
    assert values[39:] == [-1, -1, 0.0, 0]  # window_left, window_right, softcap, alibi


def test_the_feature_values_are_the_abis_last_four_arguments(monkeypatch):
    from flashgen.generator.features import FeatureArgs

    spec = KernelSpec(
        family="mma", d=64, direction="bwd", causal=True, features=("window", "softcap", "alibi")
    )
    feats = FeatureArgs(window=(16, 0), softcap=30.0, alibi=0xABC0)
    values = _fake_prepared_launch(monkeypatch, spec, feats)
    assert values[39:] == [16, 0, 30.0, 0xABC0]
    # a side that reaches every key (left >= tk, right >= tq) is passed as unbounded
    wide = FeatureArgs(window=(230, 5), softcap=30.0)
    assert _fake_prepared_launch(monkeypatch, spec, wide)[39:] == [-1, 5, 30.0, 0]


def test_a_prepared_backward_refuses_features_its_variant_lacks(monkeypatch):
    from flashgen.generator.features import FeatureArgs

    plain = KernelSpec(family="mma", d=64, direction="bwd", causal=True)
    with pytest.raises(ValueError, match=r"the call uses window, softcap but the variant is not"):
        _fake_prepared_launch(monkeypatch, plain, FeatureArgs(window=(8, 0), softcap=2.0))
    capped = plain.replace(features=("softcap",))
    with pytest.raises(ValueError, match=r"compiled with softcap, so it needs softcap > 0"):
        _fake_prepared_launch(monkeypatch, capped)


# launch_backward on host arrays: every check runs before the GPU is needed, so a call that
# passes them reaches runtime.get_function (replaced here by a sentinel)
class _GpuReached(Exception):
    pass


class _DeviceSlopes:
    """A (H,) float32 device array seen through the CUDA array interface (no memory)."""

    def __init__(self, heads: int, ptr: int = 0x7000, stride: int = 4, dtype: str = "<f4"):
        self.__cuda_array_interface__ = {
            "shape": (heads,), "strides": (stride,), "typestr": dtype, "data": (ptr, False),
            "version": 3,
        }  # fmt: skip


def _aligned(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros starting on a 64-byte boundary (the pointer rules need 16)."""
    dt = np.dtype(dtype)
    size = int(np.prod(shape)) * dt.itemsize
    raw = np.zeros(size + 64, np.uint8)
    at = -raw.ctypes.data % 64
    return raw[at : at + size].view(dt).reshape(shape)


def _host_call(spec: KernelSpec):
    dt = spec.dtype_info.numpy
    q, k = (_aligned(s, dt) for s in ((1, 4, 32, spec.d), (1, 2, 40, spec.d)))
    lse = _aligned((1, 4, 32), np.float32)
    q2, dq, do = (_aligned(q.shape, dt) for _ in range(3))
    dk, dv = (_aligned(k.shape, dt) for _ in range(2))
    return (spec, q, k, k, q2, lse, do, dq, dk, dv)


@pytest.fixture
def no_gpu(monkeypatch):
    from flashgen.runtime import gpu as runtime

    def get_function(spec):
        raise _GpuReached(spec.name)

    monkeypatch.setattr(runtime, "get_function", get_function)


@pytest.mark.parametrize(
    ("features", "call", "message"),
    [
        (
            (),
            {"window": (8, 0)},
            r"the call uses window but the variant is not compiled with it; "
            r"use flash_bwd_mma_d64_br64_bc64_bf16_causal_window_w4_s2$",
        ),
        ((), {"softcap": 30.0}, r"the call uses softcap but"),
        ((), {"alibi_slopes": _DeviceSlopes(4)}, r"the call uses alibi but"),
        (
            ("window",),
            {"window": (8, 0), "softcap": 2.0},
            r"the call uses softcap but .* use "
            r"flash_bwd_mma_d64_br64_bc64_bf16_causal_window_softcap_w4_s2$",
        ),
        (("softcap",), {}, r"compiled with softcap, so it needs softcap > 0"),
        (("softcap",), {"softcap": 0.0}, r"compiled with softcap, so it needs softcap > 0"),
        (("window",), {"window": (8,)}, r"window=\(8,\): must be a pair \(left, right\)"),
        (("window",), {"window": (-2, 0)}, r"each side must be >= 0 keys, or -1 for unbounded"),
        (("softcap",), {"softcap": -1.0}, r"softcap=-1.0: must be in \["),
        (
            ("alibi",),
            {"alibi_slopes": _DeviceSlopes(2)},
            r"alibi_slopes.shape=\(2,\): must be "
            r"\(4,\), one slope per query head",
        ),
        (("alibi",), {"alibi_slopes": _DeviceSlopes(4, dtype="<f2")}, r"must be float32"),
        (("alibi",), {"alibi_slopes": _DeviceSlopes(4, stride=8)}, r"must be contiguous"),
        (
            ("alibi",),
            {"alibi_slopes": np.ones(4, np.float32)},
            r"alibi_slopes=ndarray: the "
            r"kernels read it on the GPU; pass it as a device array",
        ),
    ],
)
def test_launch_backward_refuses_features_that_do_not_fit_before_the_gpu(
    no_gpu, features, call, message
):
    spec = KernelSpec(family="mma", d=64, direction="bwd", causal=True, features=features)
    with pytest.raises(ValueError, match=message) as info:
        backward.launch_backward(*_host_call(spec), **call)
    assert "\n" not in str(info.value) and "spec=None" not in str(info.value)


@pytest.mark.parametrize(
    ("features", "call"),
    [
        ((), {}),
        ((), {"window": (-1, -1), "softcap": 0.0}),  # FlashAttention's "off" values
        (("window",), {"window": (8, 0)}),
        (("window",), {}),  # a window variant runs a call without one (unbounded)
        (("alibi",), {"alibi_slopes": _DeviceSlopes(4)}),
        (
            ("window", "softcap", "alibi"),
            {"window": (8, 2), "softcap": 30.0, "alibi_slopes": _DeviceSlopes(4)},
        ),
        (("softcap", "deterministic"), {"softcap": 5.0}),
    ],
)
def test_launch_backward_takes_features_that_fit(no_gpu, features, call):
    spec = KernelSpec(family="mma", d=64, direction="bwd", causal=True, features=features)
    with pytest.raises(_GpuReached):
        backward.launch_backward(*_host_call(spec), **call)


def test_backward_features_reads_the_slopes_pointer():
    spec = KernelSpec(family="mma", d=64, direction="bwd", features=("window", "alibi"))
    _, q, k, v, o, lse, do, dq, dk, dv = _host_call(spec)
    problem = backward.validate_backward(spec, q, k, v, o, lse, do, dq, dk, dv)
    got = backward.backward_features(spec, problem, ((4, 4), None, _DeviceSlopes(4, ptr=0x9100)))
    assert (got.window, got.softcap, got.alibi) == ((4, 4), None, 0x9100)
    assert got.tokens == ("window", "alibi")
