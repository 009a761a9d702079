"""Find nvcc: FLASHGEN_NVCC, PATH, CUDA_HOME / CUDA_PATH, /usr/local/cuda, or the PyPI wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path


class NvccNotFound(RuntimeError):
    """No usable nvcc; the message says where flashgen looked and how to get one."""


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


@cache
def nvcc_version(nvcc: Path) -> str:
    """The `release X.Y, VX.Y.Z` line of `nvcc --version` (part of every cache key)."""
    out = subprocess.run(
        [str(nvcc), "--version"], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        if "release" in line:
            return line.strip()
    return out.strip().splitlines()[-1] if out.strip() else "unknown"
