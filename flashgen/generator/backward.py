"""The backward pass's shape, shared by every family that has one: the three kernels' names,
the pre/post kernels' rows, the fp32 scratch a call allocates, and the `deterministic` token.

A backward variant is three kernels of one cubin, launched in order (flashgen.runtime.backward):
`<name>_pre` (D = rowsum(dO * O); zeroes the dQ accumulator), `<name>` (dK, dV, and dQ by fp32
atomics) and `<name>_post` (the accumulator in the storage dtype). Deterministic, the order of
dQ's sums is fixed one of two ways (`Family.bwd_ordered_dq`): family mma has `<name>_dq` (dQ by
a block per query tile, no atomics, no accumulator) in place of `_post`; family wgmma keeps the
three kernels, and its blocks add into the accumulator one after another per query tile,
ordered by an int32 semaphore per (batch, head, query tile) that the scratch holds after the
accumulator (`scratch_shapes`). The family's own rules are in its folder (families/mma/bwd.py,
families/wgmma/bwd.py).
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
    """True for the deterministic mode: dQ's sums in a fixed order, bit-identical gradients."""
    return DETERMINISTIC in spec.features


def has_dq_kernel(spec: KernelSpec) -> bool:
    """True when dQ has a kernel of its own (`<name>_dq`, family mma's deterministic mode) in
    place of `<name>_post`: no dQ accumulator then."""
    return is_deterministic(spec) and not spec.fam.bwd_ordered_dq


def semaphores(spec: KernelSpec, b: int, h: int, tq: int) -> int:
    """The int32 semaphores of a call with variant `spec` (family wgmma, deterministic): one per
    (batch, head, query tile of BR rows, `Family.bwd_dq_regions`); 0 for every other variant."""
    if not (is_deterministic(spec) and spec.fam.bwd_ordered_dq):
        return 0
    return b * h * -(-tq // spec.br) * spec.fam.bwd_dq_regions(spec)


def pre_rows(spec: KernelSpec) -> int:
    """Rows one block of the pre/post kernels handles."""
    return spec.threads // PRE_LANES_PER_ROW


VARLEN = "varlen"
VARLEN_PAD_ALIGN = 32  # rows: a varlen sequence's scratch starts on a 128-byte line (PAD_ALIGN)


def is_varlen(spec: KernelSpec) -> bool:
    """True for a backward over packed sequences (family wgmma): abi.VARLEN after the
    features, the scratch padded per sequence."""
    return VARLEN in spec.features


def varlen_pad_start(spec: KernelSpec, b: int, qs: int) -> int:
    """A varlen variant's first scratch row of sequence `b`, whose first row of q is `qs`
    (the template's pad_start): qs rounded up to VARLEN_PAD_ALIGN, plus BR + VARLEN_PAD_ALIGN
    rows per earlier sequence. Consecutive starts differ by at least the sequence's length +
    BR + 1, more than its whole tiles take."""
    a = VARLEN_PAD_ALIGN
    return -(-qs // a) * a + b * (spec.br + a)


def scratch_rows(spec: KernelSpec, tq: int, n_seqs: int = 0) -> int:
    """Query rows per head of the fp32 scratch: tq, or for family wgmma tq rounded up to BR
    (its main kernel reads whole query tiles of LSE and D, and adds whole tiles into the dQ
    accumulator). A varlen variant (tq the packed total) pads each of its `n_seqs` sequences
    to whole tiles without a prefix scan: sequence b's tiles start at row cu_seqlens_q[b]
    rounded up to VARLEN_PAD_ALIGN, plus b * (BR + VARLEN_PAD_ALIGN) (aligned: the main kernel
    reads D and LSE as float2), so align(tq) + n_seqs * (BR + VARLEN_PAD_ALIGN) rows bound
    them (the template's pad_rows; keep the two in step)."""
    if is_varlen(spec):
        return varlen_pad_start(spec, n_seqs, tq)
    return -(-tq // spec.br) * spec.br if spec.fam.bwd_whole_tiles else tq


def scratch_shapes(
    spec: KernelSpec, b: int, h: int, tq: int, d: int, n_seqs: int = 0
) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Shapes of the two fp32 scratch arrays a backward call allocates: d_buf, and the dQ
    accumulator (None with a dQ kernel: `has_dq_kernel`). mma: (B, H, Tq) and (B, H, Tq, d).
    wgmma: D and LSE*log2(e) side by side, (B, H, 2, TQP), and (B, H, TQP, d_pad), TQP =
    `scratch_rows` and d_pad = d rounded up to 64 (a varlen call: B = 1, tq the packed total
    and `n_seqs` its sequences); deterministic, the accumulator is (B*H*TQP + S, d_pad): S more
    rows of d_pad hold the `semaphores` (int32, after the B*H*TQP*d_pad floats; the pre kernel
    zeroes them)."""
    rows = scratch_rows(spec, tq, n_seqs)
    d_buf = (b, h, 2, rows) if spec.fam.bwd_whole_tiles else (b, h, tq)
    if has_dq_kernel(spec):
        return d_buf, None
    # wgmma's accumulator holds whole 64-column slabs (d_pad: its math runs there)
    cols = spec.fam.d_pad(spec) if spec.fam.bwd_whole_tiles else d
    sems = semaphores(spec, b, h, tq)
    if sems:
        return d_buf, (b * h * rows + -(-sems // cols), cols)
    return d_buf, (b, h, rows, cols)


def kernel_names(spec: KernelSpec) -> tuple[str, str, str]:
    """The three kernel symbols of a backward variant, in launch order: (pre, main, post), or
    with a dQ kernel (pre, main, dq)."""
    last = "dq" if has_dq_kernel(spec) else "post"
    return (f"{spec.name}_pre", spec.name, f"{spec.name}_{last}")


def smems(spec: KernelSpec) -> tuple[int, int, int]:
    """Dynamic shared memory of the three kernels (the pre/post kernels use none)."""
    return (0, spec.smem_bytes, spec.fam.bwd_dq_smem_bytes(spec) if has_dq_kernel(spec) else 0)
