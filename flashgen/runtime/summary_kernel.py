"""Range summaries built on the GPU by one small kernel: a hooked call's tables summarized with
one launch each instead of ~levels + 15 torch ops.

A hooked variant whose mask reads an int32 table at ranges of indices (a document mask's
`doc_ids[q_idx]` over a tile) takes the table's range summary (hooks/summary.py's layout,
`summarize` on the host). The torch front door built it with torch ops on every call: on the
H200 those cost ~400 us of host time per call, more than the attention kernel on a 4k-token
document batch (bench/NOTES.md, twentieth session). Here one block of 1024 threads builds the
whole summary: chunk minima and maxima by warps, then each level from the one below in shared
memory, every level written out as it is made. Tables of up to `MAX_ELEMENTS` fit its shared
memory; `fits(n)` says whether one does (the caller summarizes longer ones another way).

The kernel is the same for every hook and arch: compiled once per arch through the cubin cache
(nvcc, like every kernel), loaded once per device, launched with `launch`.
"""

from __future__ import annotations

import ctypes

from flashgen.generator.hooks.summary import CHUNK
from flashgen.runtime import small_kernel

THREADS = 1024
MAX_CHUNKS = 4096
"""Chunks one block holds in shared memory (two int32 rows: 32 KiB, under the static limit)."""
MAX_ELEMENTS = MAX_CHUNKS * CHUNK
NAME = "flashgen_range_summary"

SOURCE = f"""// flashgen: the range summary of a rank-1 int32 table (generator/hooks/summary.py):
// out[(2k) nc + i] = min and out[(2k + 1) nc + i] = max of chunks i .. min(i + 2^k - 1, nc - 1)
// of {CHUNK} elements, nc = ceil(n / {CHUNK}) <= {MAX_CHUNKS}; one block of {THREADS} threads.
#include <climits>
constexpr int CHUNK = {CHUNK};
constexpr int MAX_CHUNKS = {MAX_CHUNKS};
constexpr int THREADS = {THREADS};
constexpr int PER_THREAD = MAX_CHUNKS / THREADS;

extern "C" __global__ void __launch_bounds__(THREADS)
{NAME}(const int* __restrict__ t, int n, int* __restrict__ out) {{
  __shared__ int lo_s[MAX_CHUNKS], hi_s[MAX_CHUNKS];
  const int nc = (n - 1) / CHUNK + 1;
  const int levels = 32 - __clz(nc);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // level 0: a warp per chunk (the last chunk's padding repeats its last element: no change)
  for (int c = warp; c < nc; c += THREADS / 32) {{
    const int end = min(n, (c + 1) * CHUNK);
    int mn = INT_MAX, mx = INT_MIN;
    for (int e = c * CHUNK + lane; e < end; e += 32) {{
      const int x = t[e];
      mn = min(mn, x);
      mx = max(mx, x);
    }}
    for (int o = 16; o > 0; o /= 2) {{
      mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
      mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }}
    if (lane == 0) {{
      lo_s[c] = mn;
      hi_s[c] = mx;
      out[c] = mn;
      out[nc + c] = mx;
    }}
  }}
  // level k at i: level k - 1 at i and at i + 2^(k-1) (past the end: i's run already ends there)
  for (int k = 1; k < levels; ++k) {{
    const int w = 1 << (k - 1);
    int lo[PER_THREAD], hi[PER_THREAD];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {{
      const int i = threadIdx.x + j * THREADS;
      if (i < nc) {{
        lo[j] = lo_s[i];
        hi[j] = hi_s[i];
        if (i + w < nc) {{
          lo[j] = min(lo[j], lo_s[i + w]);
          hi[j] = max(hi[j], hi_s[i + w]);
        }}
      }}
    }}
    __syncthreads();
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {{
      const int i = threadIdx.x + j * THREADS;
      if (i < nc) {{
        lo_s[i] = lo[j];
        hi_s[i] = hi[j];
        out[2LL * k * nc + i] = lo[j];
        out[(2LL * k + 1) * nc + i] = hi[j];
      }}
    }}
  }}
}}
"""


def fits(n: int) -> bool:
    """Whether the kernel summarizes a table of n elements (1 <= n <= MAX_ELEMENTS)."""
    return 1 <= n <= MAX_ELEMENTS


def cubin(arch: str) -> bytes:
    """The kernel's cubin for `arch` (an `ARCHS` name), from the cubin cache or nvcc."""
    return small_kernel.cubin(SOURCE, arch, NAME)


def launch(table: int, n: int, out: int, stream: int, device: int, arch: str) -> None:
    """Summarize the int32 table at device address `table` (n elements, `fits(n)`) into `out`
    (int32, levels(n) x 2 x chunks(n), contiguous) on CUstream `stream` of `device`: no
    synchronization. RuntimeError when the driver refuses the launch."""
    if not fits(n):
        raise ValueError(f"n={n}: the summary kernel takes 1 to {MAX_ELEMENTS} elements")
    args = (ctypes.c_void_p(table), ctypes.c_int(n), ctypes.c_void_p(out))
    small_kernel.launch(small_kernel.function(SOURCE, NAME, device, arch), (1, 1, 1), THREADS,
                        stream, args, f"{NAME} (n={n})")  # fmt: skip


__all__ = ["MAX_ELEMENTS", "NAME", "SOURCE", "cubin", "fits", "launch"]
