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


def _arch(name: str, smem_per_sm_kib: int, max_threads: int, max_blocks: int) -> ArchInfo:
    # every arch here reserves 1 KiB of shared memory per block and has 64 Ki registers per SM
    major = int(name.removeprefix("sm_").rstrip("a")) // 10
    kib = 1024
    return ArchInfo(
        name, major, (smem_per_sm_kib - 1) * kib, smem_per_sm_kib * kib, 65536, max_threads,
        max_blocks,
    )  # fmt: skip


# Per-SM limits from the CUDA programming guide's "Technical Specifications per Compute
# Capability" (as tabulated in CCCL's cuda/__device/arch_traits.h). An `a` arch (sm_90a) is
# its base arch plus instructions that run only on that exact GPU (wgmma, setmaxnreg).
ARCHS: dict[str, ArchInfo] = {
    a.name: a
    for a in (
        _arch("sm_80", 164, 2048, 32),  # A100, A30
        _arch("sm_86", 100, 1536, 16),  # RTX 30xx, A10, A40, A6000
        _arch("sm_89", 100, 1536, 24),  # RTX 40xx, L4, L40
        _arch("sm_90", 228, 2048, 32),  # H100, H200, GH200
        _arch("sm_90a", 228, 2048, 32),
        _arch("sm_100", 228, 2048, 32),  # B200, GB200
        _arch("sm_100a", 228, 2048, 32),
        _arch("sm_103", 228, 2048, 32),  # B300, GB300
        _arch("sm_110", 228, 2048, 32),  # Jetson Thor
        _arch("sm_120", 100, 1536, 32),  # RTX 50xx, RTX PRO 6000 Blackwell
    )
}

DEFAULT_ARCH = "sm_90"
STATIC_SMEM_LIMIT = 48 * 1024  # above this a kernel must raise its dynamic smem attribute


class ArchError(ValueError):
    """An arch flashgen does not know, or one the kernel cannot run on (one-line message)."""


def arch_info(name: str) -> ArchInfo:
    """Return the limits of `name`; raise ArchError listing the supported archs otherwise."""
    try:
        return ARCHS[name]
    except KeyError:
        raise ArchError(
            f"arch={name!r}: not supported; choose one of {', '.join(ARCHS)}"
        ) from None


def arch_number(name: str) -> int:
    """`sm_90a` -> 90."""
    return int(name.removeprefix("sm_").rstrip("a"))


def smem_per_block(name: str) -> int:
    """Shared memory one block may use on GPU arch `name` (an `sm_XY[a]` name). An arch not in
    ARCHS (sm_101, sm_121, ...) takes the limit of the newest known arch of its generation at
    or below it, or the smallest limit of any known arch: never more than it may have."""
    if name in ARCHS:
        return ARCHS[name].smem_per_block
    try:
        num = arch_number(name)
    except ValueError:
        return min(a.smem_per_block for a in ARCHS.values())
    same = [a for a in ARCHS.values() if a.major == num // 10 and arch_number(a.name) <= num]
    if same:
        return max(same, key=lambda a: arch_number(a.name)).smem_per_block
    return min(a.smem_per_block for a in ARCHS.values())


def runs_on(family_archs: tuple[str, ...], target: str) -> bool:
    """Whether a family shipped for `family_archs` can be compiled for and run on `target`.

    A family shipped for plain archs (sm_80, sm_90) uses instructions every later GPU has, so
    it runs on any arch at least as new as its oldest one. A family shipped only for `a` archs
    (sm_90a: wgmma) runs on exactly those.
    """
    if target in family_archs:
        return True
    plain = [arch_number(a) for a in family_archs if not a.endswith("a")]
    return bool(plain) and arch_number(target) >= min(plain)


def check_target(
    name: str, family: str, family_archs: tuple[str, ...], smem_bytes: int, target: str
) -> ArchInfo:
    """The limits of `target`, after checking that kernel `name` can run there; else ArchError
    naming the arch, the rule and the fix."""
    info = arch_info(target)
    if not runs_on(family_archs, target):
        plain = [a for a in family_archs if not a.endswith("a")]
        where = f"{min(plain, key=arch_number)} or newer" if plain else " or ".join(family_archs)
        raise ArchError(
            f"arch={target}: family {family} runs on {where} only; choose another --arch or "
            "another --family"
        )
    if smem_bytes > info.smem_per_block:
        raise ArchError(
            f"{name}: needs {smem_bytes:,} B of shared memory per block, {target} allows "
            f"{info.smem_per_block:,} B; choose smaller tiles (--br/--bc) or fewer --stages"
        )
    return info
