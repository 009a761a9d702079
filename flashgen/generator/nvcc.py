"""Find nvcc: FLASHGEN_NVCC, PATH, CUDA_HOME / CUDA_PATH, /usr/local/cuda, or the PyPI wheel."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path


class NvccNotFound(RuntimeError):
    """No usable nvcc; the message says where flashgen looked and how to get one."""


class NvccSettingError(ValueError):
    """An nvcc setting in the environment (FLASHGEN_NVCC_TIMEOUT) is not usable."""


def _wheel_candidates() -> list[Path]:
    # nvidia-cuda-nvcc (13.x) installs nvcc into site-packages/nvidia/cu13/bin/
    out: list[Path] = []
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        for sub in ("cu13", "cuda_nvcc"):
            out.append(base / sub / "bin" / "nvcc")
    return out


def find_nvcc() -> Path:
    """Return the nvcc flashgen will use, or raise NvccNotFound with the fix."""
    explicit = os.environ.get("FLASHGEN_NVCC")
    if explicit:
        if Path(explicit).is_file():
            return Path(explicit)
        raise NvccNotFound(f"FLASHGEN_NVCC={explicit}: no such file; point it at an nvcc binary")
    candidates: list[Path] = []
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "nvcc")
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    candidates += _wheel_candidates()
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise NvccNotFound(
        "nvcc not found (looked at FLASHGEN_NVCC, PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda "
        "and the nvidia-cuda-nvcc wheel); install the CUDA toolkit or run "
        "`pip install 'flashgen[nvcc]'`"
    )


def have_nvcc() -> bool:
    """True when find_nvcc() would succeed."""
    try:
        find_nvcc()
    except NvccNotFound:
        return False
    return True


DEFAULT_TIMEOUT_S = 600.0  # one nvcc run; the slowest shipped variant takes ~10 s cold
TIMEOUT_ENV = "FLASHGEN_NVCC_TIMEOUT"


def nvcc_timeout() -> float:
    """Seconds one nvcc run may take (FLASHGEN_NVCC_TIMEOUT, default 600); NvccSettingError
    (a ValueError) when the variable is not a positive number."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise NvccSettingError(
            f"{TIMEOUT_ENV}={raw!r}: must be a positive number of seconds; e.g. {TIMEOUT_ENV}=900"
        )
    return value


@cache
def nvcc_version(nvcc: Path) -> str:
    """The whole of `nvcc --version` (release and build): part of every cache key."""
    try:
        proc = subprocess.run(
            [str(nvcc), "--version"],
            capture_output=True,
            text=True,
            check=False,
            timeout=min(nvcc_timeout(), 60.0),
        )
    except subprocess.TimeoutExpired:
        raise NvccNotFound(
            f"{nvcc} --version did not answer within 60 s; check the nvcc install"
        ) from None
    except OSError as exc:
        raise NvccNotFound(
            f"{nvcc} cannot be run ({exc.strerror}); check the nvcc install"
        ) from None
    out = proc.stdout.strip()
    if proc.returncode != 0:
        raise NvccNotFound(
            f"{nvcc} --version failed (exit {proc.returncode}); is it nvcc? point FLASHGEN_NVCC "
            "at a working nvcc"
        )
    if "release" not in out:  # the version is part of every cache key: no guessing it
        shown = f"printed {_excerpt(out)!r}" if out else "printed nothing"
        raise NvccNotFound(
            f"{nvcc} --version {shown}, not nvcc's version (a line with 'release'); is it "
            "nvcc? point FLASHGEN_NVCC at a working nvcc"
        )
    return out


def _excerpt(text: str, limit: int = 80) -> str:
    """The first line of `text`, cut to `limit` characters."""
    first = text.splitlines()[0] if text else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


# the static runtime libraries CMake's CUDA language links a bundle's example and library with
BUNDLE_RUNTIME_LIBS = ("libcudart_static.a", "cudart_static.lib")


def bundle_toolkit_note() -> str | None:
    """Why CMake cannot build a C bundle with the nvcc flashgen finds, or None when it can.

    A bundle links the CUDA runtime statically (`cudart_static`): the nvcc of a CUDA toolkit
    has it in the library folders `nvcc -dryrun` lists; the PyPI wheel's nvcc (`flashgen[nvcc]`)
    compiles kernels without it.
    """
    try:
        nvcc = find_nvcc()
    except NvccNotFound:
        return (
            "no nvcc found: building this bundle with CMake needs a CUDA toolkit (nvcc and the "
            "CUDA runtime libraries)"
        )
    try:
        proc = subprocess.run(
            [str(nvcc), "-dryrun", "-cudart", "static", "bundle_probe.cu", "-o", "bundle_probe"],
            capture_output=True, text=True, check=False, timeout=60.0,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None  # nothing to say for sure: CMake will report it
    dirs = [Path(d) for d in re.findall(r'-L"?([^"\s]+)"?', proc.stdout + proc.stderr)]
    if any((d / lib).is_file() for d in dirs for lib in BUNDLE_RUNTIME_LIBS):
        return None
    return (
        f"the nvcc flashgen finds ({nvcc}) has no static CUDA runtime (libcudart_static) in "
        "its library folders: it compiles kernels, but CMake needs a CUDA toolkit to build this "
        "bundle; install one, or build the bundle where one is"
    )
