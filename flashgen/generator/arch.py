"""GPU architectures flashgen compiles for, and the per-block limits used to prune variants."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchInfo:
    """Hardware limits of one compute capability (per block / per SM)."""

    name: str  # nvcc spelling: sm_80, sm_90, sm_90a
    major: int
    smem_per_block: int  # max dynamic shared memory one block may opt in to (bytes)
    smem_per_sm: int  # shared memory an SM can give to resident blocks (bytes)
    regs_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int

    @property
    def gencode(self) -> str:
        """The `-gencode` argument producing SASS for this arch."""
        num = self.name.removeprefix("sm_")
        return f"-gencode=arch=compute_{num},code=sm_{num}"

    @property
    def ptx_gencode(self) -> str:
        """The `-gencode` argument embedding PTX, so newer GPUs can JIT the kernel."""
        num = self.name.removeprefix("sm_")
        return f"-gencode=arch=compute_{num},code=compute_{num}"


ARCHS: dict[str, ArchInfo] = {
    # A100: 164 KiB per SM, 163 KiB opt-in per block (1 KiB reserved by the system).
    "sm_80": ArchInfo("sm_80", 8, 163 * 1024, 164 * 1024, 65536, 2048, 32),
    # H100/H200: 228 KiB per SM, 227 KiB opt-in per block.
    "sm_90": ArchInfo("sm_90", 9, 227 * 1024, 228 * 1024, 65536, 2048, 32),
    "sm_90a": ArchInfo("sm_90a", 9, 227 * 1024, 228 * 1024, 65536, 2048, 32),
}

DEFAULT_ARCH = "sm_90"
STATIC_SMEM_LIMIT = 48 * 1024  # above this a kernel must raise its dynamic smem attribute


def arch_info(name: str) -> ArchInfo:
    """Return the limits of `name`; raise ValueError listing the supported archs otherwise."""
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(
            f"arch={name!r}: not supported; choose one of {', '.join(ARCHS)}"
        ) from None
