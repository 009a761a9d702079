"""The forward launchers (flashgen_launch.cu), compiled and run against the CPU stand-ins for
the CUDA runtime and the kernels: what each call returns and what it did first (launches,
shared-memory opt-ins, tensor maps encoded, the kernel that ran; sources/launch_contract.cpp),
the dispatch, the device rules; and the declarations of the kernels it launches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _nvcc import require_nvcc

from flashgen.bundle import emit as bundle_mod
from flashgen.bundle.emit import LAUNCHER, bundle_files, write_bundle
from flashgen.generator.features import FeatureArgs
from flashgen.generator.spec import KernelSpec
from flashgen.runtime.tma import L2_PROMOTION_128B, SWIZZLE_128B, TMA_DTYPE

from ._support import (
    BIG,
    FEATURE_BITS,
    FEATURED,
    INVALID,
    INVALID_DEVICE_FUNCTION,
    LAUNCH_FAILURE,
    NOT_SUPPORTED,
    PAIR,
    SOURCES,
    STAND_IN,
    TRIO,
    assert_declarations_match,
    compile_all,
    cuda_includes,
    dtype_enum,
    fill,
    rows,
    run_program,
    symbol,
    tool,
)
from .conftest import StandIns

FORWARD = [s for s in STAND_IN if s.direction == "fwd"]
STATIC_SMEM = 48 * 1024  # a kernel with more dynamic shared memory must opt in


def by_kernel(contract: str, kind: str) -> dict[str, list[str]]:
    """The contract program's `kind` rows by kernel name: their other fields."""
    return {r[0]: r[1:] for r in rows(contract, kind)}


def device_rule(spec: KernelSpec, cc: int) -> tuple[int, str]:
    """(status, start of the reason) of `spec`'s device rule on compute capability cc: sm_90a
    code (wgmma) runs on 9.0 only, the others on 8.0 or newer."""
    exact = spec.family == "wgmma"
    if (cc == 90) if exact else (cc >= 80):
        return 0, "NULL"
    needs = "9.0 only" if exact else "8.0 or newer"
    why = f"{spec.name} (family {spec.family}) needs compute capability {needs}"
    return INVALID_DEVICE_FUNCTION, why


@pytest.mark.compile_all  # nvcc-heavy: runs with the compile-everything check
def test_launcher_declarations_match_the_kernel_definitions(tmp_path: Path) -> None:
    write_bundle(bundle_files(TRIO), tmp_path)
    assert_declarations_match(tmp_path, TRIO, "tq")


def test_a_launcher_checks_then_launches_once_opting_in_above_48_kib(contract: str) -> None:
    accepted = by_kernel(contract, "accepted")
    refused = by_kernel(contract, "refused")
    failed = by_kernel(contract, "failed")
    assert set(accepted) == set(refused) == set(failed) == {s.name for s in FORWARD}
    assert max(s.smem_bytes for s in FORWARD) > STATIC_SMEM > min(s.smem_bytes for s in FORWARD)
    for s in FORWARD:
        opt_in = int(s.smem_bytes > STATIC_SMEM)
        maps = 3 if s.family == "wgmma" else 0  # Q, K and V for the tensor-map family
        maps += len(s.fam.fwd_prefix_of(s)) > len(s.fam.fwd_prefix)  # O's (O_TMA_STORE)
        # status, launches, opt-ins, maps encoded, the kernel that ran
        assert accepted[s.name] == ["0", "1", str(opt_in), str(maps), s.name], s.name
        # refused parameters (scale 0): nothing done, not even an opt-in or a tensor map
        assert refused[s.name] == [str(INVALID), "0", "0", "0"], s.name
        # the launch's own status is what the call returns
        assert failed[s.name] == [str(LAUNCH_FAILURE), "1"], s.name


def expected_dispatch(d: int, dv: int, dtype: int, causal: int, used: set[str]) -> tuple[int, str]:
    """(status, kernel run) of flashgen_fwd on a key using `used` features: the variant of the
    key (d, dv, dtype, causal) compiled with them and the fewest others; a softcap variant
    refuses a call without softcap."""
    dtypes = list(bundle_mod.DTYPES)
    fits = [
        s for s in FORWARD
        if (s.d, s.dv, dtypes.index(s.dtype), int(s.causal)) == (d, dv, dtype, causal)
        and used <= set(s.features)
    ]  # fmt: skip
    if not fits:
        return NOT_SUPPORTED, ""
    chosen = min(fits, key=lambda s: len(s.features))
    if "softcap" in chosen.features and "softcap" not in used:
        return INVALID, ""
    return 0, chosen.name


def test_dispatch_runs_the_variant_of_the_key_with_the_fewest_features(contract: str) -> None:
    found = rows(contract, "dispatch")
    # each variant's key with no feature, each feature alone, all three; and dv left 0
    assert len(found) == 6 * len(FORWARD)
    ran = set()
    for d, dv, dtype, causal, bits, dv0, rc, last in found:
        used = {f for f, bit in FEATURE_BITS.items() if int(bits) & bit}
        want_dv = int(d) if dv0 == "1" else int(dv)
        want = expected_dispatch(int(d), want_dv, int(dtype), int(causal), used)
        assert (int(rc), last) == want, (d, dv, dtype, causal, used, dv0)
        ran.add(last)
    assert ran - {""} == {s.name for s in FORWARD}  # every variant is reachable


def test_device_rules_are_9_0_exactly_for_wgmma_and_8_0_or_newer_for_the_others(
    contract: str,
) -> None:
    found = rows(contract, "device")
    assert {(r[0], int(r[1])) for r in found} == {
        (s.name, cc) for s in FORWARD for cc in (75, 80, 86, 90, 100)
    }
    for kernel, cc, rc, why, supported, why_supported in found:
        spec = next(s for s in FORWARD if s.name == kernel)
        status, reason = device_rule(spec, int(cc))
        assert int(rc) == status and why.startswith(reason), (kernel, cc, why)
        # flashgen_fwd_supported answers for the key's variant without features
        plain = min(
            (s for s in FORWARD if (s.d, s.dtype, s.causal) == (spec.d, spec.dtype, spec.causal)),
            key=lambda s: len(s.features),
        )
        status, reason = device_rule(plain, int(cc))
        assert int(supported) == status and why_supported.startswith(reason), (kernel, cc)


def test_wgmma_launcher_refuses_another_gpu_or_a_refused_map_before_launching(
    contract: str,
) -> None:
    wrong_gpu = by_kernel(contract, "wrong_gpu")
    map_refused = by_kernel(contract, "map_refused")
    for s in FORWARD:
        if s.family == "wgmma":
            # on sm_86: refused before any map or launch, and bad parameters refused first
            assert wrong_gpu[s.name] == [str(INVALID_DEVICE_FUNCTION), str(INVALID), "0", "0", "0"]
            # a map the driver refuses (the first, Q's): nothing launched, no opt-in
            assert map_refused[s.name] == [str(INVALID), "0", "0", "1"], s.name
        else:  # the sm_80+ families launch there, and need no map
            opt_in = str(int(s.smem_bytes > STATIC_SMEM))
            assert wrong_gpu[s.name] == ["0", str(INVALID), "1", opt_in, "0"], s.name
            assert map_refused[s.name] == ["0", "1", opt_in, "0"], s.name


def test_wgmma_launcher_static_asserts_the_tma_numbers_it_is_rendered_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher holds tma.py's enum values against cuda.h's: rendered with other ones (each
    shifted by one), it does not compile, and says which."""
    nvcc = str(require_nvcc())
    monkeypatch.setattr(bundle_mod, "SWIZZLE_128B", SWIZZLE_128B + 1)
    monkeypatch.setattr(bundle_mod, "L2_PROMOTION_128B", L2_PROMOTION_128B + 1)
    monkeypatch.setattr(bundle_mod, "TMA_DTYPE", {k: v + 1 for k, v in TMA_DTYPE.items()})
    write_bundle(bundle_files(TRIO), tmp_path)
    (proc,) = compile_all(
        [[nvcc, "-std=c++17", "-c", f"-I{tmp_path}", LAUNCHER, "-o", "launch.o"]],
        tmp_path,
        fail=True,
    )
    assert proc.returncode != 0
    failed = set(re.findall(r'static assertion failed with "([^"]*)"', proc.stderr))
    assert failed == {"128-byte swizzle", "L2 promotion", *TMA_DTYPE}, proc.stderr[-3000:]


def test_a_bundle_without_wgmma_needs_no_driver_api(stand_ins: StandIns, tmp_path: Path) -> None:
    """The plain bundle's launcher compiled (in the stand_ins fixture) with a cuda.h that is an
    #error first on the include path; a wgmma bundle's does not compile so."""
    assert (stand_ins.pair / "launch.o").is_file()
    plain = bundle_files(PAIR)[LAUNCHER]
    assert "TensorMap" not in plain and "EntryPoint" not in plain
    write_bundle(bundle_files(TRIO), tmp_path)
    (proc,) = compile_all(
        [[tool("g++"), "-x", "c++", "-std=c++17", "-E", f"-I{tmp_path}",
          f"-I{SOURCES / 'no_driver_api'}", *cuda_includes(), LAUNCHER, "-o", "launch.ii"]],
        tmp_path,
        fail=True,
    )  # fmt: skip
    assert proc.returncode != 0 and "needs no driver API" in proc.stderr


@pytest.mark.parametrize("spec", FEATURED, ids=lambda s: s.family)
def test_the_launcher_passes_a_window_side_that_reaches_every_key_as_unbounded(
    stand_ins: StandIns, tmp_path: Path, spec: KernelSpec
) -> None:
    """A left side of Tk keys or more, a right side of Tq or more, reach every key of every
    row: passed as -1, so that the kernels' int arithmetic never sees a side near 2^31 (Tk
    near 2^31 with a window edge p + right past it gave rows of zeros); the same values as
    the Python launcher's FeatureArgs.kernel_args (sources/window_sides.cpp, Tq < Tk and
    Tq > Tk)."""
    softcap = 30.0 if "softcap" in spec.features else 0.0
    (tmp_path / "window.cpp").write_text(
        fill("window_sides.cpp", SYM=symbol(spec), D=spec.d, EB=spec.dtype_info.itemsize,
             SOFTCAP=softcap)
    )  # fmt: skip
    compile_all(
        [[tool("g++"), "-std=c++17", f"-I{stand_ins.root}", *cuda_includes(), "window.cpp",
          *stand_ins.objects, "-o", "window"]],
        tmp_path,
    )  # fmt: skip
    out = run_program(tmp_path / "window")
    assert out.returncode == 0, out.stdout + out.stderr
    found = rows(out.stdout, "side")
    assert len(found) == 2 * 10
    for row in found:
        tq, tk, left, right, err, got_left, got_right = (int(x) for x in row)
        assert err == 0, row
        window = None if (left, right) == (-1, -1) else (left, right)
        want = FeatureArgs(window=window).kernel_args(tq, tk)[:2]
        assert (got_left, got_right) == want, (row, want)
    # both boundaries were crossed on each side: a bounded side just below, -1 from it on
    sides = {(int(r[0]), int(r[1]), int(r[5]), int(r[6])) for r in found}
    assert {(5, 7, 6, 4), (5, 7, -1, -1), (7, 5, 4, 6), (7, 5, -1, 6), (7, 5, 4, -1)} <= sides


# ---- the device's shared memory (issue 30: sm_86/89/120 give a block 99 KiB) ---------------------
def test_a_variant_refuses_a_gpu_whose_shared_memory_it_exceeds(
    stand_ins: StandIns, tmp_path: Path
) -> None:
    """`<symbol>_device_check` and `flashgen_fwd_supported` check the block's shared memory
    against what the device lets one block opt in to, naming the rule; before, only the compute
    capability was checked and the launch failed in cudaFuncSetAttribute on an RTX 4090."""
    big = BIG  # 69,632 B of shared memory
    (tmp_path / "smem.cpp").write_text(
        fill("smem_rule.cpp", SYM=symbol(big), D=big.d, DTYPE=dtype_enum(big),
             CAUSAL=int(big.causal))
    )  # fmt: skip
    compile_all(
        [[tool("g++"), "-std=c++17", f"-I{stand_ins.root}", *cuda_includes(), "smem.cpp",
          *stand_ins.objects, "-o", "smem"]],
        tmp_path,
    )  # fmt: skip
    roomy = run_program(tmp_path / "smem")  # the stand-in plays an H200: 227 KiB
    assert roomy.returncode == 0, roomy.stdout + roomy.stderr
    assert rows(roomy.stdout, "check") == [["0", "NULL"]]
    assert rows(roomy.stdout, "supported") == [["0", "NULL"]]
    small = run_program(tmp_path / "smem", MOCK_SMEM=str(big.smem_bytes - 1))
    assert small.returncode == 0, small.stdout + small.stderr
    for kind in ("check", "supported"):
        ((status, why),) = rows(small.stdout, kind)
        assert int(status) == INVALID_DEVICE_FUNCTION, small.stdout
        assert f"{big.name} needs {big.smem_bytes} B of shared memory per block" in why
    exact = run_program(tmp_path / "smem", MOCK_SMEM=str(big.smem_bytes))
    assert rows(exact.stdout, "check") == [["0", "NULL"]]
