"""The CMake build: what CMakeLists.txt declares (read as CMake commands), and the library CMake
builds from it (the session's `built` bundle: a variant of each family and the wgmma backward,
for sm_90 only, configured and built with nvcc, no GPU; its tests are compile_all tests, run by
CI's compile check)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flashgen.bundle.emit import (
    LAUNCHER,
    arch_specific_gencode,
    bundle_files,
    cuda_architectures,
)

from ._support import (
    BUILT,
    BWD_W,
    PAIR,
    TRIO,
    WGMMA,
    bwd_symbol,
    cmake_args,
    symbol,
)

SM90A = "-gencode=arch=compute_90a,code=sm_90a"


def properties(cmake: str, target: str) -> dict[str, str]:
    """The properties set_target_properties(target PROPERTIES name value ...) gives `target`."""
    (args,) = cmake_args(cmake, "set_target_properties", target)
    assert args[1] == "PROPERTIES", args
    return dict(zip(args[2::2], args[3::2], strict=True))


def cache_default(cmake: str, name: str) -> str:
    """The default of cache variable `name`: set(name "value" CACHE STRING "doc")."""
    (args,) = cmake_args(cmake, "set", name)
    assert args[2:4] == ["CACHE", "STRING"], args
    return args[1]


def test_cmake_builds_a_static_library_for_sm80_sm90_and_ptx() -> None:
    cmake = bundle_files(PAIR)["CMakeLists.txt"]
    assert cmake_args(cmake, "project") == [["flashgen_attention", "LANGUAGES", "CXX", "CUDA"]]
    (lib,) = cmake_args(cmake, "add_library", "flashgen_kernels")
    assert lib[:3] == ["flashgen_kernels", "STATIC", LAUNCHER]
    assert sorted(lib[3:]) == sorted(f"kernels/{s.name}.cu" for s in PAIR)
    assert cache_default(cmake, "FLASHGEN_CUDA_ARCHITECTURES") == "80-real;90-real;90-virtual"
    assert cuda_architectures(PAIR) == "80-real;90-real;90-virtual"
    assert properties(cmake, "flashgen_kernels")["CUDA_ARCHITECTURES"] == (
        "${FLASHGEN_CUDA_ARCHITECTURES}"
    )
    assert properties(cmake, "flashgen_kernels")["CUDA_STANDARD"] == "17"
    assert cmake_args(cmake, "add_executable") == [["example", "example.cu"]]
    assert properties(cmake, "example")["CUDA_STANDARD"] == "17"
    # no wgmma: no sm_90a object library, no gencode of its own
    assert cmake_args(cmake, "set", "FLASHGEN_WGMMA_GENCODE") == []
    assert cmake_args(cmake, "add_library", "flashgen_kernels_sm90a") == []
    assert "sm90a" not in cmake


def test_cmake_compiles_the_wgmma_kernel_for_sm90a_alone() -> None:
    cmake = bundle_files(TRIO)["CMakeLists.txt"]
    wg = f"kernels/{WGMMA.name}.cu"
    assert cache_default(cmake, "FLASHGEN_WGMMA_GENCODE") == SM90A
    assert cmake_args(cmake, "add_library", "flashgen_kernels_sm90a") == [
        ["flashgen_kernels_sm90a", "OBJECT", wg]
    ]
    # its own gencode flags, and no CMake architectures
    assert cmake_args(cmake, "separate_arguments") == [
        ["_flashgen_wgmma_gencode", "UNIX_COMMAND", "${FLASHGEN_WGMMA_GENCODE}"]
    ]
    assert properties(cmake, "flashgen_kernels_sm90a")["CUDA_ARCHITECTURES"] == "OFF"
    (options,) = cmake_args(cmake, "target_compile_options", "flashgen_kernels_sm90a")
    assert "${_flashgen_wgmma_gencode}" in options
    # linked into the library, which compiles the others
    (lib,) = cmake_args(cmake, "add_library", "flashgen_kernels")
    assert wg not in lib and "$<TARGET_OBJECTS:flashgen_kernels_sm90a>" in lib
    assert all(f"kernels/{s.name}.cu" in lib for s in PAIR)
    # the plain archs come from the plain variants only; a wgmma-only bundle's host code: 90
    assert cache_default(cmake, "FLASHGEN_CUDA_ARCHITECTURES") == "80-real;90-real;90-virtual"
    assert cuda_architectures([WGMMA]) == "90-real"
    assert arch_specific_gencode(TRIO) == SM90A
    assert arch_specific_gencode(PAIR) == ""
    # no driver library: the launcher finds cuTensorMapEncodeTiled at run time
    links = [a for args in cmake_args(cmake, "target_link_libraries") for a in args]
    assert not [a for a in links if "cuda_driver" in a or a in ("cuda", "-lcuda")], links
    assert "-lcuda" not in cmake


@pytest.mark.compile_all  # the CMake build of real kernels (`built`): CI's compile check
def test_cmake_builds_the_library_and_the_example(built: Path) -> None:
    lib = built / "build" / "libflashgen_kernels.a"
    assert lib.is_file() and (built / "build" / "example").is_file()
    # the defaults the build took: its own sm_90a gencode for the wgmma kernels
    cache = (built / "build" / "CMakeCache.txt").read_text()
    assert f"FLASHGEN_WGMMA_GENCODE:STRING={SM90A}\n" in cache
    nm = shutil.which("nm")
    if nm is None:
        return
    symbols = subprocess.run(
        [nm, "-g", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    for name in [
        "flashgen_fwd",
        "flashgen_fwd_variant",
        "flashgen_fwd_supported",
        "flashgen_bwd",
        "flashgen_bwd_workspace_bytes",
        *(f"{symbol(s)}_{f}" for s in TRIO for f in ("fwd", "check", "device_check")),
        *(s.name for s in TRIO),
        *(f"{bwd_symbol(BWD_W)}_bwd{f}" for f in ("", "_check", "_device_check")),
        f"{bwd_symbol(BWD_W)}_bwd_workspace_bytes",
        *(f"{BWD_W.name}{k}" for k in ("_pre", "", "_post")),
    ]:
        assert re.search(rf" T {name}$", symbols, re.M), name
    # no driver API symbol: the launcher gets cuTensorMapEncodeTiled at run time
    undefined = subprocess.run(
        [nm, "-u", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    assert not re.search(r"\bcu[A-Z]\w+", undefined), undefined


@pytest.mark.compile_all  # the CMake build of real kernels (`built`): CI's compile check
def test_cmake_builds_the_wgmma_kernel_for_sm90a_and_the_others_for_sm90(built: Path) -> None:
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        from flashgen.perf.sass import SassUnavailable, find_cuobjdump

        try:
            cuobjdump = str(find_cuobjdump())
        except SassUnavailable as exc:
            pytest.skip(f"needs cuobjdump to list the cubins: {exc}")
    objs = built / "build" / "CMakeFiles"
    for s in BUILT:
        (obj,) = objs.rglob(f"{s.name}.cu.o")
        listing = subprocess.run(
            [cuobjdump, "--list-elf", str(obj)], capture_output=True, text=True, check=True
        ).stdout
        archs = set(re.findall(r"\.(sm_\w+)\.cubin", listing))
        assert archs == ({"sm_90a"} if s.family == "wgmma" else {"sm_90"}), (s.name, listing)
