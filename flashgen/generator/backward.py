"""The backward pass's shape, shared by every family that has one: the three kernels' names,
the pre/post kernels' rows, the fp32 scratch a call allocates, and the `deterministic` token.

A backward variant is three kernels of one cubin, launched in order (flashgen.runtime.backward):
`<name>_pre` (D = rowsum(dO * O); zeroes the dQ accumulator), `<name>` (dK, dV, and dQ by fp32
atomics) and `<name>_post` (the accumulator in the storage dtype) -- or, deterministic (family
mma), `<name>_dq` (dQ by a block per query tile, no atomics) in place of `_post`. The family's
own rules are in its folder (families/mma/bwd.py, families/wgmma/bwd.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flashgen.generator.spec import KernelSpec

# The preprocess and postprocess kernels give each row this many threads (16-byte chunks of
# it in turn), so a block of THREADS handles THREADS / PRE_LANES_PER_ROW rows.
PRE_LANES_PER_ROW = 8
# The feature token that selects the deterministic mode (see the module docstring).
DETERMINISTIC = "deterministic"


def is_deterministic(spec: KernelSpec) -> bool:
    """True for the mode without atomics: dQ by its own kernel, bit-identical gradients."""
    return DETERMINISTIC in spec.features



def pre_rows(spec: KernelSpec) -> int:
    """Rows one block of the pre/post kernels handles."""
    return spec.threads // PRE_LANES_PER_ROW


def scratch_rows(spec: KernelSpec, tq: int) -> int:
    """Query rows per head of the fp32 scratch: tq, or for family wgmma tq rounded up to BR
    (its main kernel reads whole query tiles of LSE and D, and adds whole tiles into the dQ
    accumulator)."""
    return -(-tq // spec.br) * spec.br if spec.fam.bwd_whole_tiles else tq


def scratch_shapes(
    spec: KernelSpec, b: int, h: int, tq: int, d: int
) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Shapes of the two fp32 scratch arrays a backward call allocates: d_buf, and the dQ
    accumulator (None in deterministic mode). mma: (B, H, Tq) and (B, H, Tq, d). wgmma: D and
    LSE*log2(e) side by side, (B, H, 2, TQP), and (B, H, TQP, d), TQP = `scratch_rows`."""
    rows = scratch_rows(spec, tq)
    d_buf = (b, h, 2, rows) if spec.fam.bwd_whole_tiles else (b, h, tq)
    return d_buf, None if is_deterministic(spec) else (b, h, rows, d)



def kernel_names(spec: KernelSpec) -> tuple[str, str, str]:
    """The three kernel symbols of a backward variant, in launch order: (pre, main, post), or
    deterministic (pre, main, dq)."""
    last = "dq" if is_deterministic(spec) else "post"
    return (f"{spec.name}_pre", spec.name, f"{spec.name}_{last}")


def smems(spec: KernelSpec) -> tuple[int, int, int]:
    """Dynamic shared memory of the three kernels (the pre/post kernels use none)."""
    return (0, spec.smem_bytes, spec.fam.bwd_dq_smem_bytes(spec) if is_deterministic(spec) else 0)
