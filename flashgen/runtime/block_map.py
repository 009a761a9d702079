"""Block maps: a mask_mod's tile verdicts made once, before the attention kernel, by one small
generated kernel, and read by family wgmma's forward as bit words.

A hooked forward with a mask_mod skips the key tiles the mask drops whole and evaluates the
mask per element only on tiles it keeps in part (`{hook}_tile`, interval arithmetic over the
tile, templates/wgmma.cu.j2 `hook_tile_walk`). Made in the kernel, each verdict on a table-
reading mask (a document mask's `doc_ids`) waits for loads of the table's range summary, and
every warp of every item makes them again: on the H200 the hooked document mask ran 1.4-1.8x
the varlen kernel's time over the same documents (bench/NOTES.md, twenty-first session).

A block map holds the same verdicts, made by the same `{hook}_tile` function with the same
arguments, so it adds no soundness argument: per query tile of the kernel's BR rows, two bit
words per 32 key tiles of BC keys: `kept` (the mask keeps some key of the tile) and `whole`
(it keeps every key). Layout: uint32 [parts][query tiles][words][2], parts = (B if the mask
reads b else 1) x (H if it reads h else 1) (`Layout`). The forward reads one 8-byte word per
32 key tiles where it made 32 verdicts.

The builder kernel is generated per hook set (the hooks' C++ and their tile verdict, as the
attention kernel has them), compiled through the cubin cache, loaded once per device and
launched on the caller's stream with ctypes (`launch`), like runtime/summary_kernel.py. It takes
the hooked variant's aux block (`features.hook.HOOK_PARAMS`) as the attention kernel does, so
the verdicts read the same aux values and range summaries.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flashgen.generator.features.hook import HOOK_PARAMS, hooks_of, reads_input, template_context
from flashgen.runtime import small_kernel

NAME = "flashgen_block_map"
THREADS = 128


@dataclass(frozen=True)
class Layout:
    """A block map's shape for one call, one direction and one kernel tile (br x bc).

    Forward (`backward` False): a row per query tile (`rows` = ceil(tq / br)), `words` =
    ceil(key tiles / 32) words per row, each word `planes` = 2 uint32: kept, whole.
    Backward: a row per key block of bc keys (`rows` = ceil(tk / bc)), `words` = ceil(query
    tiles / 32), `planes` = 1 + bc / 64 uint32 per word: kept (any key of the block), then
    whole for each consumer warpgroup's 64 keys. Rows repeat per part: `batch_part` x
    `head_part` (B and H where the mask reads b and h, else 1). `grid` is the builder's
    (rows, heads part, batch part); `size` the map's length in uint32."""

    rows: int
    words: int
    planes: int
    batch_part: int
    head_part: int
    br: int
    bc: int
    backward: bool = False

    @property
    def parts(self) -> int:
        return self.batch_part * self.head_part

    @property
    def size(self) -> int:
        return self.parts * self.rows * self.words * self.planes

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.rows, self.head_part, self.batch_part)


def layout(tokens: Sequence[str], batch: int, heads: int, tq: int, tk: int, br: int,
           bc: int, backward: bool = False) -> Layout:  # fmt: skip
    """The map's layout for the mask_mod among `tokens` on a (batch, heads, tq) x tk call and
    a kernel tile of br x bc (the backward's: br query rows, bc keys, a multiple of 64).
    ValueError without a mask_mod or with an empty problem."""
    masks = [h for h in hooks_of(tokens) if h.kind == "mask_mod"]
    if not masks:
        raise ValueError(f"features {list(tokens)}: a block map needs a mask_mod hook")
    if min(batch, heads, tq, tk, br, bc) < 1 or (backward and bc % 64):
        raise ValueError(
            f"a block map over batch={batch}, heads={heads}, tq={tq}, tk={tk} with a {br} x "
            f"{bc} tile: every size must be at least 1"
            + (" and a backward tile's keys a multiple of 64" if backward else "")
        )
    mask = masks[0]
    q_tiles, key_tiles = -(-tq // br), -(-tk // bc)
    return Layout(
        rows=key_tiles if backward else q_tiles,
        words=-(-(q_tiles if backward else key_tiles) // 32),
        planes=1 + bc // 64 if backward else 2,
        batch_part=batch if reads_input(mask, "b") else 1,
        head_part=heads if reads_input(mask, "h") else 1,
        br=br,
        bc=bc,
        backward=backward,
    )


def source(tokens: Sequence[str]) -> str:
    """The builder kernel's CUDA source for the hooks among `tokens` (which hold a mask_mod).
    Memoized: every launch looks its kernel up by it."""
    return _source(tuple(tokens))


@functools.lru_cache(maxsize=64)
def _source(tokens: tuple[str, ...]) -> str:
    ctx = template_context(tokens)
    mask = ctx["hook_mask"]
    if mask is None:
        raise ValueError(f"features {list(tokens)}: a block map needs a mask_mod hook")
    params = ",\n    ".join(p.declaration("float", restrict=False) for p in HOOK_PARAMS)
    name = mask["name"]
    return f"""// flashgen: a block map (runtime/block_map.py) for mask_mod {name}: per query
// tile of br rows, bit words (kept, whole) over key tiles of bc keys, 32 tiles a word,
// made with the tile verdict the attention kernel uses, with the same arguments.
#include <cstdint>
{ctx["hook_source"]}
{ctx["hook_tile_source"]}

extern "C" __global__ void __launch_bounds__({THREADS})
{NAME}(unsigned* __restrict__ out, int words, int br, int bc, int tq, int tk,
    {params}) {{
  const int qt = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int q0 = qt * br, q_hi = min(q0 + br, tq) - 1, key_tiles = (tk + bc - 1) / bc;
  const int lane = threadIdx.x % 32;
  unsigned* row = out + (((long long)batch * gridDim.y + head) * gridDim.x + qt) * words * 2;
  for (int w = threadIdx.x / 32; w < words; w += {THREADS // 32}) {{
    const int t = w * 32 + lane;
    const int v = t < key_tiles ? {mask["tile"]}(batch, head, q0, q_hi, t * bc,
        min(t * bc + bc, tk) - 1, tq, tk{mask["tile_aux"]}) : FG_TILE_NONE;
    const unsigned kept = __ballot_sync(0xffffffffu, v != FG_TILE_NONE);
    const unsigned whole = __ballot_sync(0xffffffffu, v == FG_TILE_ALL);
    if (lane == 0) {{
      row[2 * w] = kept;
      row[2 * w + 1] = whole;
    }}
  }}
}}

// The backward's: a row per key block of bc keys, words over query tiles of br rows, per word
// kept (any key of the block) then whole for each 64 keys (a consumer warpgroup's), as the
// backward's step walk asks them (whole only where kept).
extern "C" __global__ void __launch_bounds__({THREADS})
{NAME}_bwd(unsigned* __restrict__ out, int words, int br, int bc, int tq, int tk,
    {params}) {{
  const int kb = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int kv0 = kb * bc, kv_hi = min(kv0 + bc - 1, tk - 1), q_tiles = (tq + br - 1) / br;
  const int lane = threadIdx.x % 32, planes = 1 + bc / 64;
  unsigned* row = out + (((long long)batch * gridDim.y + head) * gridDim.x + kb) * words * planes;
  for (int w = threadIdx.x / 32; w < words; w += {THREADS // 32}) {{
    const int j = w * 32 + lane, q0 = j * br, q_hi = min(q0 + br, tq) - 1;
    const bool kept = j < q_tiles && {mask["tile"]}(batch, head, q0, q_hi, kv0, kv_hi, tq,
        tk{mask["tile_aux"]}) != FG_TILE_NONE;
    const unsigned kept_bits = __ballot_sync(0xffffffffu, kept);
    if (lane == 0) row[w * planes] = kept_bits;
    for (int g = 0; g < bc / 64; ++g) {{
      const int kc0 = kv0 + 64 * g;
      const bool whole = kept && {mask["tile"]}(batch, head, q0, q_hi, min(kc0, tk - 1),
          min(kc0 + 63, tk - 1), tq, tk{mask["tile_aux"]}) == FG_TILE_ALL;
      const unsigned whole_bits = __ballot_sync(0xffffffffu, whole);
      if (lane == 0) row[w * planes + 1 + g] = whole_bits;
    }}
  }}
}}
"""


def cubin(tokens: Sequence[str], arch: str) -> bytes:
    """The builder's cubin for the hooks among `tokens` on `arch`, from the cubin cache or nvcc."""
    return small_kernel.cubin(source(tokens), arch, NAME)


_C_TYPES: dict[str, Any] = {"P": ctypes.c_void_p, "i": ctypes.c_int}


def launch(tokens: Sequence[str], lay: Layout, tq: int, tk: int, hook_args: Sequence[float],
           out: int, stream: int, device: int, arch: str) -> None:  # fmt: skip
    """Build the block map of the hooks among `tokens` into `out` (device address of
    `lay.size` uint32) on CUstream `stream` of `device`, the verdicts reading `hook_args` (the
    aux block's values, `HookArgs.kernel_args()`): no synchronization. RuntimeError when the
    driver refuses the launch."""
    if len(hook_args) != len(HOOK_PARAMS):
        raise ValueError(
            f"hook_args: {len(hook_args)} values; the aux block has {len(HOOK_PARAMS)}"
        )
    name = f"{NAME}_bwd" if lay.backward else NAME
    function = small_kernel.function(source(tokens), name, device, arch)
    args: list[Any] = [
        ctypes.c_void_p(out), ctypes.c_int(lay.words), ctypes.c_int(lay.br),
        ctypes.c_int(lay.bc), ctypes.c_int(tq), ctypes.c_int(tk),
    ]  # fmt: skip
    for p, v in zip(HOOK_PARAMS, hook_args, strict=True):
        args.append(ctypes.c_float(v) if p.code == "f" else _C_TYPES[p.code](int(v)))
    small_kernel.launch(function, lay.grid, THREADS, stream, args, f"{name} ({lay})")


__all__ = ["NAME", "Layout", "cubin", "launch", "layout", "source"]
