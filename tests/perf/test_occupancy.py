"""Occupancy arithmetic against values of NVIDIA's occupancy calculator (sm_80 / sm_90)."""

from __future__ import annotations

import pytest

from flashgen.generator.arch import ARCHS
from flashgen.perf.occupancy import occupancy


@pytest.mark.parametrize(
    ("arch", "threads", "registers", "smem", "blocks", "warps", "limiter"),
    [
        # 64 registers: 2048 per warp, 8 warps per sub-partition -> 32 warps = 50 %
        ("sm_80", 256, 64, 0, 4, 32, "registers"),
        # 255 registers round up to 8192 per warp: 2 warps per sub-partition
        ("sm_90", 32, 255, 0, 8, 8, "registers"),
        # 96 registers: 3072 per warp, 5 per sub-partition (not 21/4): 20 warps
        ("sm_90", 128, 96, 0, 5, 20, "registers"),
        # 48 KiB + 1 KiB reserved per block: 164 KiB hold 3 blocks, 228 KiB hold 4
        ("sm_80", 128, 32, 48 * 1024, 3, 12, "shared memory"),
        ("sm_90", 128, 32, 48 * 1024, 4, 16, "shared memory"),
        # 1 B of shared memory still takes a 128 B unit plus the reserve
        ("sm_90", 32, 16, 1, 32, 32, "blocks per SM"),
        # 1024-thread blocks: 2048 threads per SM allow 2
        ("sm_90", 1024, 32, 0, 2, 64, "threads"),
        # the per-block opt-in limit is exactly usable, one byte more is not
        ("sm_80", 128, 32, 163 * 1024, 1, 4, "shared memory"),
        ("sm_80", 128, 32, 163 * 1024 + 1, 0, 0, "shared memory"),
    ],
)
def test_occupancy_matches_the_calculator(
    arch: str, threads: int, registers: int, smem: int, blocks: int, warps: int, limiter: str
) -> None:
    occ = occupancy(arch, threads=threads, registers=registers, smem_bytes=smem)
    assert (occ.blocks_per_sm, occ.warps_per_sm) == (blocks, warps)
    assert limiter in occ.limiters
    assert occ.fraction == warps / (ARCHS[arch].max_threads_per_sm // 32)
    assert occ.to_dict()["blocks_per_sm"] == blocks


def test_partial_warp_occupies_a_whole_warp_slot() -> None:
    occ = occupancy("sm_90", threads=48, registers=32, smem_bytes=0)
    assert occ.warps_per_block == 2 and occ.by_threads == 32


@pytest.mark.parametrize("threads", [0, 1025])
def test_impossible_block_sizes_are_rejected(threads: int) -> None:
    with pytest.raises(ValueError, match=f"threads={threads}"):
        occupancy("sm_90", threads=threads, registers=32, smem_bytes=0)


def test_more_than_255_registers_cannot_launch() -> None:
    assert occupancy("sm_90", threads=32, registers=256, smem_bytes=0).blocks_per_sm == 0
