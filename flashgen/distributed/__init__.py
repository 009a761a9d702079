"""`flashgen.distributed`: context parallelism -- one attention over a sequence longer than a
GPU holds, sharded across the ranks of a torch.distributed process group (ring attention).

    import torch.distributed as dist
    from flashgen.distributed import ring_attention, shard

    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard(x, rank, world) for x in (q_all, k_all, v_all))  # (B, H, T, d) -> T / world
    o = ring_attention(q, k, v, causal=True)  # this rank's shard of O; differentiable

`ring_attention` (module `attention`; the ring's two passes in `ring`; under torch.compile
the custom ops of module `op`), the
sharding layouts and per-step plans (`sharding`), the
LSE merge (`merge`), the point-to-point exchange (`exchange`) and the per-step engines
(`blocks`: flashgen's kernels on CUDA, plain torch arithmetic elsewhere). docs/distributed.md
has the walk-through and a torchrun example.
"""

from flashgen.distributed.attention import RingAttention, ring_attention
from flashgen.distributed.blocks import BlockEngine, FlashgenBlocks, MathBlocks
from flashgen.distributed.sharding import LAYOUTS, block_plan, positions, shard, unshard

__all__ = [
    "LAYOUTS",
    "BlockEngine",
    "FlashgenBlocks",
    "MathBlocks",
    "RingAttention",
    "block_plan",
    "positions",
    "ring_attention",
    "shard",
    "unshard",
]
