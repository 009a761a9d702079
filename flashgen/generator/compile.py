"""Compile rendered kernels with nvcc (a subprocess: works on machines with no GPU), cached."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .._version import __version__
from .arch import DEFAULT_ARCH, arch_info
from .cache import CubinCache, cache_key, locked
from .nvcc import find_nvcc, nvcc_version
from .render import RenderedKernel, render
from .report import ResourceReport, parse_ptxas
from .spec import KernelSpec

BASE_FLAGS: tuple[str, ...] = ("-std=c++17", "-O3", "-lineinfo", "-Xptxas=-v")


class CompileError(RuntimeError):
    """nvcc failed; the message carries the command and the first error lines."""


@dataclass(frozen=True)
class CompiledKernel:
    """A cubin for one arch, with its ptxas report."""

    spec: KernelSpec
    arch: str
    cubin: bytes
    report: ResourceReport
    cached: bool  # True when it came from the cache without running nvcc

    @property
    def name(self) -> str:
        """The kernel symbol inside the cubin."""
        return self.spec.name


def _first_errors(text: str, n: int = 12) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error" in ln.lower()]
    return "\n".join((errs or lines)[:n])


def run_nvcc(args: list[str], source: str, suffix: str = ".cu") -> tuple[bytes, str]:
    """Compile `source` with nvcc and `args` (output to the file `-o` names); return (out, log).

    nvcc runs inside a folder named after the content (source and flags), under a lock, on a
    source file with a fixed mtime: with -lineinfo the cubin records the folder and the file's
    mtime, so a random folder or a fresh timestamp would make the same source give new bytes.
    """
    nvcc = find_nvcc()
    digest = cache_key(source, " ".join(args), suffix)[:20]
    work = Path(tempfile.gettempdir()) / f"flashgen-nvcc-{os.getuid()}" / digest
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"kernel{suffix}"
    out = work / "kernel.out"
    with locked(src):
        src.write_text(source)
        # the line table also records the source file's mtime: pin it for identical bytes
        os.utime(src, (0, 0))
        cmd = [str(nvcc), *args, "-o", out.name, src.name]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=work)
            log = proc.stdout + proc.stderr
            if proc.returncode != 0 or not out.exists():
                raise CompileError(
                    f"nvcc failed (exit {proc.returncode}): {' '.join(cmd)}\n{_first_errors(log)}"
                )
            return out.read_bytes(), log
        finally:
            for p in (src, out):
                p.unlink(missing_ok=True)


def compile_kernel(
    kernel: KernelSpec | RenderedKernel,
    arch: str | None = None,
    *,
    extra_flags: tuple[str, ...] = (),
    cache: CubinCache | None = None,
) -> CompiledKernel:
    """Compile to a cubin for `arch` (default: the local GPU's, else sm_90), via the cache."""
    rendered = kernel if isinstance(kernel, RenderedKernel) else render(kernel)
    arch = arch or local_arch() or DEFAULT_ARCH
    info = arch_info(arch)
    flags = [*BASE_FLAGS, "-cubin", info.gencode, *extra_flags]
    nvcc = find_nvcc()
    key = cache_key(rendered.source, " ".join(flags), arch, nvcc_version(nvcc), __version__)
    store = cache if cache is not None else CubinCache()
    with store.lock(key):
        hit = store.get(key)
        if hit is not None:
            data, meta = hit
            return CompiledKernel(rendered.spec, arch, data, ResourceReport(**meta["report"]), True)
        data, log = run_nvcc(flags, rendered.source)
        report = parse_ptxas(log, rendered.name, arch)
        store.put(key, data, {"report": report.to_dict(), "name": rendered.name, "flags": flags})
    return CompiledKernel(rendered.spec, arch, data, report, False)


def local_arch() -> str | None:
    """`sm_XY` of GPU 0 when PyCUDA and a GPU are present (or FLASHGEN_ARCH), else None."""
    env = os.environ.get("FLASHGEN_ARCH")
    if env:
        return env
    try:
        import pycuda.driver as drv

        drv.init()
        major, minor = drv.Device(0).compute_capability()
    except Exception:  # no PyCUDA, no driver or no device: fall back to the default arch
        return None
    return f"sm_{major}{minor}"
