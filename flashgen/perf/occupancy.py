"""Occupancy: how many blocks of a kernel fit on one SM, and which resource runs out first.

The arithmetic of NVIDIA's occupancy calculator for sm_80 / sm_90, from a kernel's threads,
registers per thread (ptxas) and shared memory per block. Pure: no GPU, no CUDA runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashgen.generator.arch import ArchInfo, arch_info

WARP_SIZE = 32
MAX_THREADS_PER_BLOCK = 1024
MAX_REGISTERS_PER_THREAD = 255
# The register file is split over 4 SM sub-partitions (one warp scheduler each); a warp lives
# in one of them and takes its registers in 256-register chunks, so a partition holds
# floor(partition registers / registers per warp) warps and the remainder is wasted.
SUBPARTITIONS = 4
REGISTER_ALLOC_UNIT = 256
# Shared memory is handed out in 128-byte units, and the system reserves 1 KiB per resident
# block on sm_80+ (that is why an A100 SM has 164 KiB but a block may use only 163 KiB).
SMEM_ALLOC_UNIT = 128
SMEM_RESERVED_PER_BLOCK = 1024


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM allowed by each resource, and what the tightest one gives."""

    arch: str
    threads: int  # per block
    registers: int  # per thread
    smem_bytes: int  # per block, static + dynamic
    max_warps_per_sm: int
    by_registers: int  # blocks per SM each resource allows on its own
    by_smem: int
    by_threads: int
    by_block_limit: int

    @property
    def warps_per_block(self) -> int:
        """Warps one block occupies (a partial warp still takes a whole warp slot)."""
        return -(-self.threads // WARP_SIZE)

    @property
    def blocks_per_sm(self) -> int:
        """Blocks resident on one SM at once: the tightest of the four limits."""
        return min(self.by_registers, self.by_smem, self.by_threads, self.by_block_limit)

    @property
    def warps_per_sm(self) -> int:
        """Warps resident on one SM at once."""
        return self.blocks_per_sm * self.warps_per_block

    @property
    def fraction(self) -> float:
        """Resident warps over the SM's maximum (the occupancy calculator's percentage / 100)."""
        return self.warps_per_sm / self.max_warps_per_sm

    @property
    def limiters(self) -> tuple[str, ...]:
        """The resources that set `blocks_per_sm` (several when they tie)."""
        limits = {
            "registers": self.by_registers,
            "shared memory": self.by_smem,
            "threads": self.by_threads,
            "blocks per SM": self.by_block_limit,
        }
        return tuple(k for k, v in limits.items() if v == self.blocks_per_sm)

    def to_dict(self) -> dict[str, object]:
        """Plain dict for JSON, derived values included."""
        return {
            "arch": self.arch,
            "threads": self.threads,
            "warps_per_block": self.warps_per_block,
            "registers": self.registers,
            "smem_bytes": self.smem_bytes,
            "blocks_per_sm": self.blocks_per_sm,
            "warps_per_sm": self.warps_per_sm,
            "max_warps_per_sm": self.max_warps_per_sm,
            "fraction": round(self.fraction, 4),
            "limited_by": list(self.limiters),
            "blocks_by": {
                "registers": self.by_registers,
                "smem": self.by_smem,
                "threads": self.by_threads,
                "block_limit": self.by_block_limit,
            },
        }


def blocks_by_registers(arch: ArchInfo, registers: int, warps_per_block: int) -> int:
    """Blocks per SM the register file allows (0 when one block cannot get its registers)."""
    if registers <= 0:  # a kernel that uses no registers is not limited by them
        return arch.max_threads_per_sm // (warps_per_block * WARP_SIZE)
    if registers > MAX_REGISTERS_PER_THREAD:
        return 0
    per_warp = _round_up(registers * WARP_SIZE, REGISTER_ALLOC_UNIT)
    warps = SUBPARTITIONS * ((arch.regs_per_sm // SUBPARTITIONS) // per_warp)
    return warps // warps_per_block


def blocks_by_smem(arch: ArchInfo, smem_bytes: int) -> int:
    """Blocks per SM the shared memory allows (0 when one block exceeds the per-block limit)."""
    if smem_bytes > arch.smem_per_block:
        return 0
    per_block = _round_up(smem_bytes, SMEM_ALLOC_UNIT) + SMEM_RESERVED_PER_BLOCK
    return arch.smem_per_sm // per_block


def occupancy(arch: str | ArchInfo, *, threads: int, registers: int, smem_bytes: int) -> Occupancy:
    """Occupancy of a kernel with `threads` per block, `registers` per thread and `smem_bytes`
    (static + dynamic) per block on `arch`; raise ValueError for an impossible block size."""
    info = arch if isinstance(arch, ArchInfo) else arch_info(arch)
    if not 1 <= threads <= MAX_THREADS_PER_BLOCK:
        raise ValueError(
            f"threads={threads}: a block has 1 to {MAX_THREADS_PER_BLOCK} threads; use fewer warps"
        )
    if smem_bytes < 0 or registers < 0:
        raise ValueError(
            f"registers={registers}, smem_bytes={smem_bytes}: must not be negative; "
            "pass ptxas' report"
        )
    warps = -(-threads // WARP_SIZE)
    max_warps = info.max_threads_per_sm // WARP_SIZE
    return Occupancy(
        arch=info.name,
        threads=threads,
        registers=registers,
        smem_bytes=smem_bytes,
        max_warps_per_sm=max_warps,
        by_registers=blocks_by_registers(info, registers, warps),
        by_smem=blocks_by_smem(info, smem_bytes),
        by_threads=max_warps // warps,
        by_block_limit=info.max_blocks_per_sm,
    )


# A warpgroup: 4 warps that issue one wgmma together and share one setmaxnreg.
WARPGROUP_THREADS = 128


@dataclass(frozen=True)
class RegisterSplit:
    """How a warp-specialized block redistributes its registers with `setmaxnreg`.

    The block is launched with ptxas' count for every thread; then the producer warpgroup
    gives registers back (`setmaxnreg.dec`) and each consumer warpgroup takes more
    (`setmaxnreg.inc`, which waits until the block's pool has them). The split can only work
    when it fits in what the launch allocated: `split_total <= launch_total`.
    """

    producer: int  # registers per thread after setmaxnreg.dec
    consumer: int  # registers per thread after setmaxnreg.inc
    consumers: int  # consumer warpgroups
    launch_registers: int  # ptxas' count: what every thread gets at launch

    @property
    def split_total(self) -> int:
        """Registers of the block after the split."""
        return WARPGROUP_THREADS * (self.producer + self.consumers * self.consumer)

    @property
    def launch_total(self) -> int:
        """Registers the launch allocates for the block (every thread at ptxas' count)."""
        return WARPGROUP_THREADS * (1 + self.consumers) * self.launch_registers

    @property
    def fits(self) -> bool:
        """Whether the consumers' setmaxnreg.inc can be granted from the block's pool."""
        return self.split_total <= self.launch_total

    def to_dict(self) -> dict[str, object]:
        """Plain dict for JSON, derived values included."""
        return {
            "producer": self.producer,
            "consumer": self.consumer,
            "consumers": self.consumers,
            "warpgroup_threads": WARPGROUP_THREADS,
            "launch_registers": self.launch_registers,
            "split_total": self.split_total,
            "launch_total": self.launch_total,
            "fits": self.fits,
        }


def register_split(
    *, producer: int, consumer: int, consumers: int, launch_registers: int
) -> RegisterSplit:
    """The setmaxnreg split of a block with one producer and `consumers` consumer warpgroups;
    raise ValueError for values setmaxnreg cannot take (24 to 256, multiples of 8)."""
    for label, regs in (("producer", producer), ("consumer", consumer)):
        if not 24 <= regs <= 256 or regs % 8:
            raise ValueError(
                f"{label} registers={regs}: setmaxnreg takes a multiple of 8 in [24, 256]"
            )
    if consumers < 1:
        raise ValueError(f"consumers={consumers}: a warp-specialized block has at least one")
    return RegisterSplit(producer, consumer, consumers, launch_registers)
