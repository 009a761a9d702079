"""How a sequence is cut across the ranks of a ring, and which part of each ring step is real.

Two layouts, for a sequence of T tokens on n ranks:

- ``"zigzag"`` (the default; load-balanced for causal attention): the sequence is cut into 2n
  chunks of T / 2n tokens, and rank r holds chunks r and 2n - 1 - r, in that order. Under a
  causal mask the early chunk has little to attend to and the late one much, so every rank
  does the same work.
- ``"contiguous"``: rank r holds tokens [r T / n, (r + 1) T / n). Under a causal mask rank
  n - 1 does n times the work of rank 0; it is here for models that already shard this way.

A ring step pairs a rank's queries with one source rank's keys. `block_plan` says which rows
of the local queries and which rows of the visiting keys meet in that step, and whether the
causal mask is needed there (it is only on the rank's own keys, where query and key chunks
are the same chunks in the same order, so the kernels' plain causal mask is exact); `None`
when nothing is visible. Everything here is arithmetic on ints and slices: no tensors, no
communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout: object) -> str:
    """`layout`, or a ValueError naming the choices."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: must be one of {', '.join(map(repr, LAYOUTS))}")
    return str(layout)


def chunks_of(layout: str, world: int) -> int:
    """How many equal chunks the whole sequence is cut into (2n zigzag, n contiguous)."""
    return 2 * world if check_layout(layout) == "zigzag" else world


def check_length(t: int, layout: str, world: int, what: str = "T") -> None:
    """A ValueError unless a sequence of `t` tokens cuts into the layout's equal chunks."""
    n = chunks_of(layout, world)
    if t % n:
        raise ValueError(
            f"{what}={t}: layout {layout!r} on {world} ranks cuts the sequence into {n} equal "
            f"chunks, so {what} must be a multiple of {n}; pad the sequence to "
            f"{-(-t // n) * n} tokens"
        )


@dataclass(frozen=True)
class BlockPlan:
    """One ring step's work: local query rows `q_rows` against visiting key rows `kv_rows`
    (half-open ranges of the local sequence axis), with the causal mask or without."""

    q_rows: tuple[int, int]
    kv_rows: tuple[int, int]
    causal: bool

    def q_slice(self) -> slice:
        """The query rows as a slice."""
        return slice(*self.q_rows)

    def kv_slice(self) -> slice:
        """The key rows as a slice."""
        return slice(*self.kv_rows)


def block_plan(
    rank: int, source: int, world: int, t_local: int, causal: bool, layout: str
) -> BlockPlan | None:
    """What rank `rank`'s queries (`t_local` of them) see of rank `source`'s keys, or None.

    Non-causal: everything. Causal, `source == rank`: the local block with the causal mask
    (the rank's chunks are in sequence order on both sides). Causal, another source:
    contiguous -- all of it when the source's chunk comes first, else nothing; zigzag (chunks
    r and 2n-1-r against s and 2n-1-s) -- a source before the rank gives its early chunk to all
    local queries, a source after it gives both chunks to the local late chunk only. Each of
    the zigzag cases is half of the full block: equal work on every step of every rank.
    """
    full = (0, t_local)
    if not causal:
        return BlockPlan(full, full, False)
    if source == rank:
        return BlockPlan(full, full, True)
    if check_layout(layout) == "contiguous":
        return BlockPlan(full, full, False) if source < rank else None
    half = t_local // 2
    if source < rank:
        return BlockPlan(full, (0, half), False)
    return BlockPlan((half, t_local), full, False)


def positions(rank: int, world: int, t: int, layout: str) -> list[int]:
    """The global token positions rank `rank` holds, in local order (for position
    embeddings and labels of a sharded sequence of `t` tokens)."""
    check_length(t, layout, world)
    n = chunks_of(layout, world)
    c = t // n
    own = (rank, 2 * world - 1 - rank) if layout == "zigzag" else (rank,)
    return [p for i in own for p in range(i * c, (i + 1) * c)]


def shard(x: Any, rank: int, world: int, *, layout: str = "zigzag", dim: int = 2) -> Any:
    """Rank `rank`'s part of the whole-sequence tensor `x` (the sequence on axis `dim`; 2 for
    flashgen's (B, H, T, d) tensors, 1 for a (B, T, H, d) model layout). A new contiguous
    tensor for zigzag (two chunks joined), a view for contiguous."""
    check_rank(rank, world)
    t = int(x.shape[dim])
    check_length(t, layout, world, f"x.shape[{dim}]")
    parts = x.chunk(chunks_of(layout, world), dim)
    if layout == "contiguous":
        return parts[rank]
    return _cat([parts[rank], parts[2 * world - 1 - rank]], dim)


def unshard(shards: Sequence[Any], *, layout: str = "zigzag", dim: int = 2) -> Any:
    """The whole-sequence tensor from every rank's part, in rank order (`shard`'s inverse)."""
    world = len(shards)
    if world == 0:
        raise ValueError("shards: empty; pass one tensor per rank, in rank order")
    if check_layout(layout) == "contiguous":
        return _cat(list(shards), dim)
    halves = [s.chunk(2, dim) for s in shards]
    return _cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim)


def check_rank(rank: int, world: int) -> None:
    """A ValueError unless 0 <= rank < world."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank={rank}, world={world}: need world >= 1 and 0 <= rank < world")


def _cat(parts: list[Any], dim: int) -> Any:
    """torch.cat or numpy.concatenate, whichever the parts are."""
    first = parts[0]
    if hasattr(first, "new_empty"):  # torch
        import torch

        return torch.cat(parts, dim)
    import numpy as np

    return np.concatenate(parts, dim)
