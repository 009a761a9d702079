"""The builds several bundle test files share, each made once per session.

`built`: ONE bundle holding a variant of each family and the wgmma backward (the smallest ones,
for sm_90 only: -DFLASHGEN_CUDA_ARCHITECTURES=90-real) configured and built with CMake and nvcc:
compile and link, no GPU. The slowest step of these tests, so only compile_all tests (CI's
compile check) use it, and it starts in the background before the first test of this folder
when a selected test needs it; the other tests run meanwhile.

`stand_ins`: bundles whose launchers (real code) are linked with CPU stand-ins for the CUDA
runtime and the kernels (sources/stand_in.cpp): the stand-in bundle (every kind of variant),
its example; a plain forward bundle (PAIR); a bundle of the wgmma backward alone, compiled as
against a CUDA 12.4 runtime, and its example. Both skip without nvcc (or g++, cmake), and fail
instead under FLASHGEN_REQUIRE_NVCC=1.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _nvcc import require_nvcc

from flashgen.bundle.emit import LAUNCHER, bundle_files, write_bundle
from flashgen.generator.nvcc import NvccNotFound, find_nvcc

from ._support import (
    BUILT,
    BWD_W,
    FEATURE_BITS,
    PAIR,
    SOURCES,
    STAND_IN,
    bwd_symbol,
    compile_all,
    cuda_includes,
    dtype_enum,
    fill,
    run_program,
    stand_in_source,
    symbol,
    tool,
)


class CMakeBuild:
    """The CMake configure and build of BUILT in a folder of `factory`, run in a thread."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.root = Path()
        self.thread: threading.Thread | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.failure: str | None = None
        self.cancelled = False

    def start(self, nvcc: Path, cmake: str) -> None:
        self.root = self.factory.mktemp("bundle")
        write_bundle(bundle_files(BUILT), self.root)
        build = str(self.root / "build")
        commands = [
            [cmake, "-S", str(self.root), "-B", build, f"-DCMAKE_CUDA_COMPILER={nvcc}",
             "-DFLASHGEN_CUDA_ARCHITECTURES=90-real"],
            [cmake, "--build", build, "-j", "2"],
        ]  # fmt: skip
        self.thread = threading.Thread(target=self._run, args=(commands,), daemon=True)
        self.thread.start()

    def _run(self, commands: list[list[str]]) -> None:
        for cmd in commands:
            if self.cancelled:
                return
            self.proc = subprocess.Popen(
                cmd, cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,  # its own process group: cancel() ends nvcc and make too
            )  # fmt: skip
            out, _ = self.proc.communicate()
            if self.proc.returncode != 0:
                self.failure = f"{' '.join(cmd)}\n{out[-6000:]}"
                return

    def wait(self) -> Path:
        assert self.thread is not None
        self.thread.join(timeout=1800)
        assert not self.thread.is_alive(), "the CMake build took over 30 minutes"
        assert self.failure is None, self.failure
        return self.root

    def cancel(self) -> None:
        self.cancelled = True
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session", autouse=True)
def cmake_build(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CMakeBuild]:
    """Starts the CMake build before the first test here when a selected test uses `built`."""
    job = CMakeBuild(tmp_path_factory)
    here = Path(__file__).parent
    wanted = any(
        "built" in item.fixturenames and here in Path(str(item.path)).parents
        for item in request.session.items
    )
    cmake = shutil.which("cmake")
    try:
        nvcc = find_nvcc()
    except NvccNotFound:
        nvcc = None
    if wanted and cmake is not None and nvcc is not None:
        job.start(nvcc, cmake)
    yield job
    job.cancel()


@pytest.fixture(scope="session")
def built(cmake_build: CMakeBuild) -> Path:
    """The CMake build of BUILT: sm_90 for simt/mma, sm_90a for wgmma (its own -gencode)."""
    nvcc = require_nvcc()
    cmake = tool("cmake")
    if cmake_build.thread is None:  # not started in the background
        cmake_build.start(nvcc, cmake)
    return cmake_build.wait()


@dataclass(frozen=True)
class StandIns:
    """Objects and programs of the stand-in builds (see the module docstring)."""

    root: Path  # the STAND_IN bundle: launch.o, stand_in.o, the example as `example_on_cpu`
    pair: Path  # the PAIR bundle: launch.o
    bwd_alone: Path  # the BWD_W bundle: launch.o and its example, `example_on_cpu`

    @property
    def example(self) -> Path:
        return self.root / "example_on_cpu"

    @property
    def objects(self) -> list[str]:
        """What a test program links with to call the stand-in bundle's launchers."""
        return [str(self.root / "launch.o"), str(self.root / "stand_in.o")]


@pytest.fixture(scope="session")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> StandIns:
    nvcc = str(require_nvcc())
    gxx = tool("g++")
    inc = cuda_includes()
    root = tmp_path_factory.mktemp("stand_in")
    pair = tmp_path_factory.mktemp("pair")
    alone = tmp_path_factory.mktemp("bwd_alone")
    for folder, specs in ((root, STAND_IN), (pair, PAIR), (alone, [BWD_W])):
        write_bundle(bundle_files(specs), folder)
    for folder in (root, alone):  # g++ compiles the example (it has no device code)
        (folder / "example.cpp").write_text((folder / "example.cu").read_text())
    (root / "stand_in.cpp").write_text(stand_in_source(STAND_IN))
    (alone / "launch_cuda12.cu").write_text((SOURCES / "launch_cuda12.cu").read_text())
    no_driver_api = SOURCES / "no_driver_api"  # its cuda.h is an #error
    # the launchers are plain host code: -O0 compiles them faster
    launcher = [nvcc, "-std=c++17", "-c", "-Xcompiler", "-O0"]
    compile_all(
        [
            [*launcher, f"-I{root}", str(root / LAUNCHER), "-o", str(root / "launch.o")],
            [gxx, "-std=c++17", "-O1", "-c", *inc, str(root / "stand_in.cpp"),
             "-o", str(root / "stand_in.o")],
            [gxx, "-std=c++17", "-O1", "-c", f"-I{root}", *inc, str(root / "example.cpp"),
             "-o", str(root / "example.o")],
            # a bundle without wgmma needs nothing of the driver API: cuda.h is never included
            [*launcher, f"-I{pair}", f"-I{no_driver_api}", str(pair / LAUNCHER),
             "-o", str(pair / "launch.o")],
            [*launcher, f"-I{alone}", str(alone / "launch_cuda12.cu"),
             "-o", str(alone / "launch.o")],
            [gxx, "-std=c++17", "-O1", "-c", f"-I{alone}", *inc, str(alone / "example.cpp"),
             "-o", str(alone / "example.o")],
        ],
        root,
    )  # fmt: skip
    compile_all(
        [
            [gxx, str(root / "example.o"), str(root / "launch.o"), str(root / "stand_in.o"),
             "-o", str(root / "example_on_cpu")],
            [gxx, str(alone / "example.o"), str(alone / "launch.o"), str(root / "stand_in.o"),
             "-o", str(alone / "example_on_cpu")],
        ],
        root,
    )  # fmt: skip
    return StandIns(root, pair, alone)


@pytest.fixture(scope="session")
def contract(stand_ins: StandIns) -> str:
    """The output of sources/launch_contract.cpp for every variant of the stand-in bundle."""
    fwd = [
        f'FWD({symbol(s)}, "{s.name}", {s.d}, {s.dv}, {dtype_enum(s)}, {int(s.causal)}, '
        f"{sum(FEATURE_BITS[f] for f in s.features)})"
        for s in STAND_IN
        if s.direction == "fwd"
    ]
    bwd = [
        f'BWD({bwd_symbol(s)}, "{s.name}", {s.d}, {dtype_enum(s)}, {int(s.causal)})'
        for s in STAND_IN
        if s.direction == "bwd"
    ]
    root = stand_ins.root
    (root / "contract.cpp").write_text(
        fill("launch_contract.cpp", FWD="\n".join(fwd), BWD="\n".join(bwd))
    )
    compile_all(
        [[tool("g++"), "-std=c++17", f"-I{root}", *cuda_includes(), "contract.cpp",
          *stand_ins.objects, "-o", "contract"]],
        root,
    )  # fmt: skip
    out = run_program(root / "contract")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    return out.stdout


@dataclass(frozen=True)
class ExampleRun:
    """The stand-in bundle's example run with nothing broken, logging what it launched."""

    proc: subprocess.CompletedProcess[str]
    launches: str  # MOCK_LAUNCH_LOG: each forward launch's arguments
    maps: str  # MOCK_MAP_LOG: each wgmma backward's four tensor maps


@pytest.fixture(scope="session")
def example_run(stand_ins: StandIns) -> ExampleRun:
    launches, maps = stand_ins.root / "launches.txt", stand_ins.root / "maps.txt"
    proc = run_program(stand_ins.example, MOCK_LAUNCH_LOG=str(launches), MOCK_MAP_LOG=str(maps))
    logs = [f.read_text() if f.is_file() else "" for f in (launches, maps)]
    return ExampleRun(proc, *logs)
