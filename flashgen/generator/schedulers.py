"""Tile schedulers: which work item (query tile, head, batch) each block of a forward kernel
takes, in what order, and the launch grid that goes with it.

A scheduler is one shared piece with three sides, kept together so that a new one is added in
one place:

- host (here): `grid(...)`, the launch grid for a problem, which the Python launcher
  (`runtime.launch.Plan.grid`) takes through `Family.scheduler(spec)`;
- device (`templates/_scheduler.cuh.j2`, the macro named `macro`): `struct Work {q0, head,
  batch}` and the way a block gets its next item; the render context passes the macro's name
  (`scheduler_macro`) and every forward template includes it;
- the bundle's C launcher (the macro named `launch_macro` in the same template file, which
  `templates/bundle/flashgen_launch.cu.j2` calls for each variant, with the constants from
  `launch_constants`): the same grid rule, in C.

The schedulers:

- `SINGLE_TILE`: a block per (query tile, head, batch), a 3-D grid (query tiles, heads,
  batch), query tiles last-first. GQAPACK variants take (packed-row tiles, K/V heads, batch).
  Families simt and mma (their kernels take one item per block: `block_work()`).
- `STATIC_PERSISTENT`: a one-dimensional grid over the (batch, head, query tile last-first)
  list; round r of block x takes item r * gridDim.x + x, odd rounds right to left (snaking).
  A block per item, or one block per SM when there are more items than SMs and each sees at
  most `PERSISTENT_MAX_KEY_TILES` key tiles on average. Family wgmma (its kernel loops over
  `WorkList::next`; the heads and batch are its kernel arguments).

- `VARLEN_PERSISTENT`: packed sequences (`varlen` variants of family wgmma): the (sequence,
  query tile last-first, head) list, longest sequences first; a block's first item is item
  blockIdx.x, then it takes the next item of the list from a global counter when it needs one
  (dynamic: the SMs that finish early take more). One thread per block draws and hands the
  item to the others through shared memory (templates/wgmma.cu.j2's work ring). The counter is
  the kernel's `work_counter` argument (abi.VARLEN_FWD): two int32 words zero at launch and
  used by no concurrent launch; the launch's last block puts them back to zero, so the hosts
  keep one pair per stream (flashgen.varlen, the NumPy/GPUArray path's runtime zeros) or take
  fresh zeroed words per call (under CUDA-graph capture; the bundle's launcher).

Adding one: a `Scheduler` subclass here with its `grid` (and `launch_constants`), the `<name>`
macro in `_scheduler.cuh.j2` defining `Work`, a `WorkList` whose constructor takes what it
needs and whose `next(round, w)` fills the block's next item, and `<name>_launch_grid` for the
bundle; then the family's `scheduler(spec)` names it. State the kernel does not take today is
an argument in the family's `fwd_prefix` or the ABI (as varlen's counter) that the launchers
allocate and pass, and the kernel hands to `WorkList`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flashgen.generator.spec import KernelSpec

PERSISTENT_MAX_KEY_TILES = 32
"""static_persistent: query tiles seeing at most this many key tiles on average take persistent
blocks. H200, bf16, B*T = 16k (bench/NOTES.md): persistent vs a block per tile was
+11/+7/+3/-1% at 4/8/32/128 key tiles (d = 128, full) and +15/+10/+5% at 2.5/4.5/16.5 (causal),
but slower at 33 (causal window 4096) and 64.5 (causal T = 16k). Read at each call, so an
experiment may set it (scripts/dev/power_probe.py does)."""


def key_tiles(spec: KernelSpec, tq: int, tk: int, window: tuple[int, int]) -> float:
    """Average key tiles of BC a query row sees (bottom-right causal, window sides)."""
    keys = float(tk)
    if spec.causal:  # row i sees i + tk - tq + 1 keys
        keys = max(0.0, tk - tq / 2) if tk >= tq else tk / 2
    left, right = window
    if left >= 0 or right >= 0:
        reach = (left if left >= 0 else tk) + 1
        reach += 0 if spec.causal else (right if right >= 0 else tk)
        keys = min(keys, float(reach))
    return keys / spec.bc


@dataclass(frozen=True)
class Scheduler:
    """A tile scheduler: its name (the device macro of templates/_scheduler.cuh.j2 too) and
    its host grid."""

    name: str
    # blocks may take more than one item (the kernel loops over `WorkList::next`); False:
    # one item a block, which kernels taking one item (`block_work()`) need
    persistent: bool

    @property
    def macro(self) -> str:
        """The macro of templates/_scheduler.cuh.j2 holding the device side."""
        return self.name

    @property
    def launch_macro(self) -> str:
        """The macro of templates/_scheduler.cuh.j2 computing the bundle launcher's grid."""
        return f"{self.name}_launch_grid"

    def launch_constants(self) -> tuple[tuple[str, str, str], ...]:
        """(C type, name, value) of each constant the bundle launcher's grid code reads."""
        return ()

    def grid(
        self, spec: KernelSpec, batch: int, heads: int, tq: int, tk: int, sms: int,
        window: tuple[int, int] = (-1, -1), kv_group: int = 1,
    ) -> tuple[int, int, int]:
        """Launch grid for a problem on a GPU with `sms` SMs (0: unknown); window: the
        kernel's sides (-1 unbounded), kv_group: query heads per K/V head."""
        raise NotImplementedError


@dataclass(frozen=True)
class SingleTile(Scheduler):
    """A block per (query tile, head, batch): (query tiles, heads, batch); GQAPACK variants
    (packed-row tiles, K/V heads, batch), a block per tile of packed rows of one K/V head."""

    def grid(
        self, spec: KernelSpec, batch: int, heads: int, tq: int, tk: int, sms: int,
        window: tuple[int, int] = (-1, -1), kv_group: int = 1,
    ) -> tuple[int, int, int]:
        if "gqapack" in spec.features:
            return (-(-tq * kv_group // spec.br), heads // kv_group, batch)
        return (-(-tq // spec.br), heads, batch)


@dataclass(frozen=True)
class StaticPersistent(Scheduler):
    """One-dimensional (the kernel decodes the work): persistent blocks, one per SM, when
    there are more query tiles than SMs and each sees few key tiles (its load latency and
    epilogue then weigh: measured on the H200, bench/NOTES.md), else a block per query tile."""

    @property
    def max_key_tiles(self) -> int:
        """PERSISTENT_MAX_KEY_TILES, as it is now."""
        return PERSISTENT_MAX_KEY_TILES

    def launch_constants(self) -> tuple[tuple[str, str, str], ...]:
        return (("double", "kPersistentMaxKeyTiles", str(self.max_key_tiles)),)

    def grid(
        self, spec: KernelSpec, batch: int, heads: int, tq: int, tk: int, sms: int,
        window: tuple[int, int] = (-1, -1), kv_group: int = 1,
    ) -> tuple[int, int, int]:
        tiles = -(-tq // spec.br) * heads * batch
        if 0 < sms < tiles and key_tiles(spec, tq, tk, window) <= self.max_key_tiles:
            return (sms, 1, 1)
        return (tiles, 1, 1)


@dataclass(frozen=True)
class VarlenPersistent(StaticPersistent):
    """Packed sequences of different lengths (`varlen` variants): the (sequence, head, query
    tile) items of each sequence's own length, which the kernel reads from `cu_seqlens_q` on
    the device (the host knows only the totals and the longest sequences). The grid is sized
    from an upper bound of the items, ceil(total_q / BR) + n_seqs query tiles per head (each
    sequence wastes at most one partial tile): persistent blocks, one per SM, when that is
    more than the SMs and the longest sequences see few key tiles; else a block per item of
    the bound (blocks past the last item end at once). Persistent blocks take their items
    from a global counter (dynamic; module docstring), a block per item its own."""

    def grid(
        self, spec: KernelSpec, batch: int, heads: int, tq: int, tk: int, sms: int,
        window: tuple[int, int] = (-1, -1), kv_group: int = 1,
    ) -> tuple[int, int, int]:
        raise TypeError("a varlen variant's grid comes from varlen_grid (it needs n_seqs)")

    def varlen_grid(
        self, spec: KernelSpec, n_seqs: int, heads: int, total_q: int, max_q: int, max_k: int,
        sms: int, window: tuple[int, int] = (-1, -1),
    ) -> tuple[int, int, int]:
        """The grid for `n_seqs` packed sequences of `total_q` query tokens in all, the
        longest `max_q` query and `max_k` key tokens."""
        # not n_seqs * ceil(max_q / BR): a max_q below the truth must not drop items
        # + 1: the rows after the last sequence, if any, are one more (keyless) sequence
        tiles = max((-(-total_q // spec.br) + n_seqs + 1) * heads, 1)
        if 0 < sms < tiles and key_tiles(spec, max_q, max_k, window) <= self.max_key_tiles:
            return (sms, 1, 1)
        return (tiles, 1, 1)


SINGLE_TILE = SingleTile(name="single_tile", persistent=False)
STATIC_PERSISTENT = StaticPersistent(name="static_persistent", persistent=True)
VARLEN_PERSISTENT = VarlenPersistent(name="varlen_persistent", persistent=True)

SCHEDULERS: dict[str, Scheduler] = {
    s.name: s for s in (SINGLE_TILE, STATIC_PERSISTENT, VARLEN_PERSISTENT)
}
"""Every scheduler by name."""
