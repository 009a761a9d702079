"""The K/V append of `flashgen.kvappend.append_kv` as one small kernel: one launch per decode
step instead of the ~30 torch ops (~30 launches) of `kvappend._append_rows`, which on small
serving rows cost more than the decode kernel itself (~10 us).

What it does, exactly as `_append_rows`: sequence b's new rows k[b, t], v[b, t] (t < T_new) go
to position p = lens[b] + t of its cache, row (b, p) of a contiguous (B, T, H_kv, d) cache or
slot p % page_size of page table[b, p / page_size] of a paged (n_pages, page_size, H_kv, d)
one; the new length lens[b] + T_new, or -1 when the sequence does not fit (lens[b] < 0,
lens[b] + T_new past the capacity, or a page index it needs outside [0, n_pages)), and then
none of its rows is written.

The grid: one block per (sequence, block of `ROWS` new rows), a grid-stride loop past
`MAX_BLOCKS`; `THREADS` threads over the block's rows x heads x head-dim chunks, K's and then
V's. A decode step (T_new 1..16) gets B blocks or a few times that, a prefill-sized append
(T_new in the thousands) B x T_new / ROWS. Every block decides its sequence's validity itself,
from lens[b] and every page index the sequence's new rows touch (T_new / page_size + 1 at
most, read by the threads in parallel and combined by `__syncthreads_or`): the blocks of one
sequence read the same values, so they all decide alike -- all of its rows written or none --
with no communication between blocks. The first row block also writes the new length.

A refused sequence's blocks write nothing at all (no redirect onto a valid row is needed, unlike
the index_put_ of `_append_rows`, which must write every row it is given): the only writes of
a launch are valid sequences' rows, each to its own target, and the lengths output, one
element per sequence, so a refused sequence can clobber nothing -- not another sequence's rows,
not its own old rows. Two valid sequences whose rows map to the same page slot (a block table
that shares a page between sequences being appended to), or k_cache and v_cache overlapping,
are caller errors, as with `_append_rows`: which write lands is then unspecified.

The copy moves raw bytes (any element size) in the widest unit of 16, 8, 4, 2 or 1 bytes that
divides every address and stride involved (`unit`), so a row of a contiguous bf16 head of
d = 128 moves as sixteen 16-byte loads and stores. Strides are the tensors' own, in bytes
(int64): views such as k sliced from a (B, T, H, d) projection need no copy; only each head's
row must be contiguous (stride 1 in its last dim; the caller falls back otherwise).

No synchronization with the host: CUDA-graph capturable. The kernel is the same for every
problem: compiled once per arch through the cubin cache, loaded once per device
(runtime/small_kernel.py), launched with `launch`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

from flashgen.runtime import small_kernel

THREADS = 256
ROWS = 8
"""New rows per block: a decode step's T_new fits in one or two blocks per sequence."""
MAX_BLOCKS = 1 << 20
"""The grid's size at most; a larger problem's blocks loop (grid-stride) over the rest."""
UNITS = (16, 8, 4, 2, 1)
NAME = "flashgen_append_kv"
INT_MAX = 2**31 - 1

SOURCE = f"""// flashgen: the K/V append (flashgen/runtime/append_kernel.py): sequence b's new rows
// go to positions lens[b] + [0, T_new) of its cache, contiguous or paged, all of them or none.
// One block per (sequence, {ROWS} new rows), grid-stride; {THREADS} threads over the pieces.
constexpr int THREADS = {THREADS};
constexpr int ROWS = {ROWS};
static_assert(ROWS <= THREADS, "one thread per row fills the row targets");

// One cache and its new rows. Strides in bytes: cache axis 0 (sequence, or page), 1 (row, or
// slot in the page), 2 (head); new rows axis 0 (sequence), 1 (new row), 2 (head). Each head's
// row (row_bytes = d x element size) is contiguous. `unit` (16, 8, 4, 2 or 1) divides both
// addresses, every stride and row_bytes: the copy moves that many bytes at a time.
struct Side {{
  char* cache;
  const char* src;
  long long cache_stride[3];
  long long src_stride[3];
  long long row_bytes;
  int unit;
}};

// Moves `unit` bytes (both addresses multiples of it).
__device__ __forceinline__ void copy_unit(char* to, const char* from, int unit) {{
  switch (unit) {{  // the same in every thread of a launch's side: no divergence
    case 16: *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from); break;
    case 8: *reinterpret_cast<uint2*>(to) = *reinterpret_cast<const uint2*>(from); break;
    case 4: *reinterpret_cast<unsigned*>(to) = *reinterpret_cast<const unsigned*>(from); break;
    case 2:
      *reinterpret_cast<unsigned short*>(to) = *reinterpret_cast<const unsigned short*>(from);
      break;
    default: *to = *from; break;
  }}
}}

// Piece e (row-major over rows x heads x per_head units) of rows t0 .. of sequence b, to its
// target (cache index i0[r], i1[r] of axes 0 and 1, from shared memory).
__device__ __forceinline__ void copy_piece(const Side& s, int e, int per_head, int b, int t0,
                                           int heads, const int* i0, const int* i1) {{
  const int per_row = heads * per_head;
  const int r = e / per_row;
  const int rem = e - r * per_row;
  const int h = rem / per_head;
  const int byte = (rem - h * per_head) * s.unit;
  const char* from = s.src + b * s.src_stride[0] + (t0 + r) * s.src_stride[1] +
                     h * s.src_stride[2] + byte;
  char* to = s.cache + i0[r] * s.cache_stride[0] + i1[r] * s.cache_stride[1] +
             h * s.cache_stride[2] + byte;
  copy_unit(to, from, s.unit);
}}

// lens: int32 (B,), element stride lens_stride. table: int32 (B, pages per sequence), element
// strides table_stride0/1, or null for a contiguous cache. new_lens: int32 (B,), contiguous.
// capacity: rows a sequence holds (T, or pages per sequence x page_size); page_size and
// n_pages: the paged cache's (unused without a table). row_blocks = ceil(T_new / ROWS).
extern "C" __global__ void __launch_bounds__(THREADS)
{NAME}(const Side k, const Side v, const int* __restrict__ lens, long long lens_stride,
    const int* __restrict__ table, long long table_stride0, long long table_stride1,
    int* __restrict__ new_lens, int batch, int t_new, int heads, long long capacity,
    int page_size, int n_pages, int row_blocks) {{
  __shared__ int i0_s[ROWS], i1_s[ROWS];
  const int tid = threadIdx.x;
  const long long blocks = (long long)batch * row_blocks;
  for (long long blk = blockIdx.x; blk < blocks; blk += gridDim.x) {{
    const int b = (int)(blk / row_blocks);
    const int t0 = (int)(blk - (long long)b * row_blocks) * ROWS;
    const int rows = min(ROWS, t_new - t0);
    const long long len = lens[b * lens_stride];
    // Validity from lens[b] and the table alone, which every block of sequence b reads
    // alike: they all decide the same, so its rows are written all or none.
    const bool fits = len >= 0 && len + t_new <= capacity;
    bool bad_page = false;
    if (fits && table != nullptr) {{  // fits is the same in every thread of the block
      const long long last = (len + t_new - 1) / page_size;
      for (long long p = len / page_size + tid; p <= last; p += THREADS) {{
        const int page = table[b * table_stride0 + p * table_stride1];
        bad_page |= page < 0 || page >= n_pages;
      }}
    }}
    // Every thread reaches this barrier; it also orders the previous iteration's reads of
    // i0_s/i1_s before this iteration's writes.
    const bool ok = !__syncthreads_or(bad_page) && fits;
    if (t0 == 0 && tid == 0) new_lens[b] = ok ? (int)(len + t_new) : -1;
    if (!ok) continue;  // the whole block: a refused sequence writes nothing
    if (tid < rows) {{
      const long long pos = len + t0 + tid;
      if (table == nullptr) {{
        i0_s[tid] = b;
        i1_s[tid] = (int)pos;
      }} else {{
        i0_s[tid] = table[b * table_stride0 + (pos / page_size) * table_stride1];
        i1_s[tid] = (int)(pos % page_size);
      }}
    }}
    __syncthreads();
    // K's pieces and then V's, as one range over the block's threads (a decode row of both
    // caches is often about one piece per thread)
    const int k_per_head = (int)(k.row_bytes / k.unit), v_per_head = (int)(v.row_bytes / v.unit);
    const int k_pieces = rows * heads * k_per_head;
    const int pieces = k_pieces + rows * heads * v_per_head;
    for (int e = tid; e < pieces; e += THREADS) {{
      if (e < k_pieces) {{
        copy_piece(k, e, k_per_head, b, t0, heads, i0_s, i1_s);
      }} else {{
        copy_piece(v, e - k_pieces, v_per_head, b, t0, heads, i0_s, i1_s);
      }}
    }}
  }}
}}
"""


class _CSide(ctypes.Structure):
    """The kernel's `Side`, field for field (the host's C layout is the kernel parameter's)."""

    _fields_ = [
        ("cache", ctypes.c_void_p),
        ("src", ctypes.c_void_p),
        ("cache_stride", ctypes.c_longlong * 3),
        ("src_stride", ctypes.c_longlong * 3),
        ("row_bytes", ctypes.c_longlong),
        ("unit", ctypes.c_int),
    ]


@dataclass(frozen=True)
class Side:
    """One cache and its new rows: device addresses and strides in elements (axes 0-2; the last
    axis has stride 1), `d` that cache's head dim."""

    cache: int
    src: int
    cache_strides: tuple[int, int, int]
    src_strides: tuple[int, int, int]
    d: int

    def unit(self, element_size: int) -> int:
        """The widest copy (16, 8, 4, 2 or 1 bytes) that divides both addresses, every byte
        stride and the row: each copy is then an aligned access."""
        strides = (*self.cache_strides, *self.src_strides)
        values = (self.cache, self.src, self.d * element_size, *(s * element_size for s in strides))
        return next(u for u in UNITS if all(x % u == 0 for x in values))

    def c_side(self, element_size: int) -> _CSide:
        """The kernel parameter: strides in bytes."""
        return _CSide(
            self.cache, self.src,
            (ctypes.c_longlong * 3)(*(s * element_size for s in self.cache_strides)),
            (ctypes.c_longlong * 3)(*(s * element_size for s in self.src_strides)),
            self.d * element_size, self.unit(element_size),
        )  # fmt: skip


@dataclass(frozen=True)
class Append:
    """One append's launch arguments (validated by the caller: `flashgen.kvappend.append_kv`).

    `lens`/`lens_stride`: cache_seqlens, int32 (B,); `table`/`table_strides`: the block table,
    int32 (B, pages per sequence), `table` 0 for a contiguous cache; `new_lens`: the output,
    int32 (B,) contiguous; `capacity`: rows per sequence (T, or pages per sequence x page_size);
    `page_size`, `n_pages`: the paged cache's shape (1 and 0 for a contiguous one)."""

    k: Side
    v: Side
    lens: int
    lens_stride: int
    table: int
    table_strides: tuple[int, int]
    new_lens: int
    batch: int
    t_new: int
    heads: int
    capacity: int
    page_size: int
    n_pages: int
    element_size: int

    @property
    def row_blocks(self) -> int:
        """Blocks of `ROWS` new rows per sequence."""
        return -(-self.t_new // ROWS)

    @property
    def grid(self) -> int:
        """Blocks launched: one per (sequence, row block), at most `MAX_BLOCKS`."""
        return min(self.batch * self.row_blocks, MAX_BLOCKS)

    def fits(self) -> bool:
        """Whether the kernel's int32 arithmetic holds for this problem (a block's rows x heads
        x chunks, positions, page indices, lengths); the caller appends another way if not.
        Sizes no real cache reaches: past 2^31 - 1 rows per sequence or pages, a row of all
        heads past 128 MiB."""
        widest = max(self.k.d, self.v.d) * self.element_size
        return (
            self.batch >= 1 and self.t_new >= 1 and self.element_size >= 1
            and self.capacity <= INT_MAX and self.t_new <= INT_MAX - ROWS
            and self.n_pages <= INT_MAX and 2 * ROWS * self.heads * widest <= INT_MAX
        )  # fmt: skip

    def params(self) -> tuple[object, ...]:
        """The kernel's parameters as ctypes values, in its order."""
        es = self.element_size
        return (
            self.k.c_side(es), self.v.c_side(es),
            ctypes.c_void_p(self.lens), ctypes.c_longlong(self.lens_stride),
            ctypes.c_void_p(self.table or None), ctypes.c_longlong(self.table_strides[0]),
            ctypes.c_longlong(self.table_strides[1]), ctypes.c_void_p(self.new_lens),
            ctypes.c_int(self.batch), ctypes.c_int(self.t_new), ctypes.c_int(self.heads),
            ctypes.c_longlong(self.capacity), ctypes.c_int(self.page_size),
            ctypes.c_int(self.n_pages), ctypes.c_int(self.row_blocks),
        )  # fmt: skip


def _widest_unit(stride_unit: int, addresses: int) -> int:
    """The copy unit of a side: `stride_unit` (the widest dividing its strides and row) narrowed
    to the lowest set bit of its two addresses OR-ed (0: no narrowing). All are powers of two."""
    low = addresses & -addresses
    return min(stride_unit, low) if low else stride_unit


class Bound:
    """One append signature's launch: `Append`'s sizes and strides, whose pointers change from
    call to call. The kernel parameters are built once; a call writes the seven pointers and the
    two copy units (they depend on the pointers' alignment too) into them and launches, so a
    decode step's append costs a few attribute stores and one driver call rather than building
    ~15 ctypes objects (~28 us of host time). `flashgen.kvappend` keeps one per signature."""

    def __init__(self, args: Append) -> None:
        if not args.fits():
            raise ValueError(f"{args}: outside what the append kernel's int32 indices hold")
        self.args = args
        es = args.element_size
        self._stride_units = tuple(
            Side(0, 0, s.cache_strides, s.src_strides, s.d).unit(es) for s in (args.k, args.v)
        )
        values = args.params()
        # the objects a call rewrites: the two sides, the lengths, the table, the output
        self._k: Any = values[0]
        self._v: Any = values[1]
        self._lens: Any = values[2]
        self._table: Any = values[4]
        self._new: Any = values[7]
        self._params = small_kernel.param_array(values)  # points at `values`' objects
        self._values = values  # (kept alive with the array)
        self.grid = (args.grid, 1, 1)
        self._what = f"{NAME} (B={args.batch}, T_new={args.t_new})"
        self._lock = threading.Lock()  # a call's stores and its launch, together

    def pointers(self, k_cache: int, k_src: int, v_cache: int, v_src: int, lens: int, table: int,
                 new_lens: int) -> Append:  # fmt: skip
        """The `Append` of a call with these pointers (what `launch` passes the kernel)."""
        a = self.args
        return dataclasses.replace(
            a, k=dataclasses.replace(a.k, cache=k_cache, src=k_src),
            v=dataclasses.replace(a.v, cache=v_cache, src=v_src), lens=lens, table=table,
            new_lens=new_lens,
        )  # fmt: skip

    def launch(self, k_cache: int, k_src: int, v_cache: int, v_src: int, lens: int, table: int,
               new_lens: int, stream: int, device: int, arch: str) -> None:  # fmt: skip
        """Append with these device pointers (`table` 0: a contiguous cache) on CUstream
        `stream` of `device` (its arch `arch`): one launch, no synchronization. RuntimeError
        when the driver refuses it."""
        function_ = small_kernel.function(SOURCE, NAME, device, arch)
        with self._lock:
            k, v, (ku, vu) = self._k, self._v, self._stride_units
            k.cache, k.src, k.unit = k_cache, k_src, _widest_unit(ku, k_cache | k_src)
            v.cache, v.src, v.unit = v_cache, v_src, _widest_unit(vu, v_cache | v_src)
            self._lens.value, self._table.value, self._new.value = lens, table or None, new_lens
            small_kernel.launch_params(function_, self.grid, THREADS, stream, self._params,
                                       self._what)  # fmt: skip


def cubin(arch: str) -> bytes:
    """The kernel's cubin for `arch` (an `ARCHS` name), from the cubin cache or nvcc."""
    return small_kernel.cubin(SOURCE, arch, NAME)


def launch(args: Append, stream: int, device: int, arch: str) -> None:
    """Append as `args` says on CUstream `stream` of `device` (its arch `arch`): one launch, no
    synchronization (a one-off `Bound`). ValueError when `args.fits()` is false (nothing
    launched); RuntimeError when the driver refuses the launch."""
    Bound(args).launch(args.k.cache, args.k.src, args.v.cache, args.v.src, args.lens, args.table,
                       args.new_lens, stream, device, arch)  # fmt: skip


__all__ = ["MAX_BLOCKS", "NAME", "ROWS", "SOURCE", "THREADS", "Append", "Bound", "Side", "cubin",
           "launch"]  # fmt: skip
