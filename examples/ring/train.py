"""Train a small causal language model on one long sequence sharded across ranks (ring attention).

    torchrun --nproc-per-node 2 examples/ring/train.py                  # CPU, gloo
    torchrun --nproc-per-node 8 examples/ring/train.py --device cuda --seq 262144 --dim 1024

Every rank holds its zigzag shard of the sequence (`flashgen.distributed.shard`): its tokens,
their global positions (for the position embedding) and their next-token labels. Attention is
`flashgen.distributed.ring_attention(causal=True)`: each rank's queries see every earlier
token of the whole sequence, wherever it lives. The loss is the mean over the whole sequence
(each rank's sum over its tokens, divided by the global count), so summing the gradients over
the ranks (`all_reduce`) gives the whole sequence's gradient; parameters start equal on every
rank (one seed) and stay equal.

The task has a short-range part and a long-range one: the first half of each sequence counts
up with random jumps (the next token is mostly this one plus one), and the second half repeats
the first, so its jumps can be predicted only by attending back half a sequence, across shards.
`--check` also runs the first step's model on the whole sequence in one process (plain
attention) and requires the same loss and gradients.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from flashgen.distributed import positions, ring_attention, shard


class Block(nn.Module):
    """Pre-norm transformer block whose causal attention is ring attention (or plain
    attention on a whole sequence, for --check)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, ring: bool) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        q, k, v = (a.transpose(1, 2) for a in (q, k, v))  # (B, H, T, d) views
        if ring:
            y = ring_attention(q, k, v, causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class Model(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, ring: bool) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x, ring)
        return self.head(self.ln(x))


def batch(step: int, seq: int, vocab: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, labels) of one step's sequence, the same on every rank: a first half that
    counts up (mod vocab) from a random start and jumps to a random token at one position in
    ten, then the first half again; labels are the next tokens (the last one's is dropped)."""
    g = torch.Generator().manual_seed(1000 + step)
    jump = torch.rand(1, seq // 2, generator=g) < 0.1
    steps = torch.where(jump, torch.randint(0, vocab, (1, seq // 2), generator=g), 1)
    steps[:, 0] = torch.randint(0, vocab, (1,), generator=g)
    half = torch.cumsum(steps, 1) % vocab
    tokens = torch.cat([half, half], 1)
    labels = torch.roll(tokens, -1, 1)
    return tokens.to(device), labels.to(device)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seq", type=int, default=256, help="tokens in the whole sequence")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--check", action="store_true", help="compare step 0 with one process")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if cuda else torch.float32
    if a.seq % (2 * world) or (a.dim // a.heads) % 8:
        print(f"--seq {a.seq} must be a multiple of 2 x {world} ranks and --dim / --heads a "
              "multiple of 8", file=sys.stderr)  # fmt: skip
        return 2
    torch.manual_seed(0)  # equal parameters on every rank
    model = Model(a.vocab, a.dim, a.heads, a.layers, a.seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    pos = torch.tensor(positions(rank, world, a.seq, "zigzag"), device=device).unsqueeze(0)
    first = last = math.nan
    for step in range(a.steps):
        tokens, labels = batch(step, a.seq, a.vocab, device)
        mine, my_labels = shard(tokens, rank, world, dim=1), shard(labels, rank, world, dim=1)
        weight = (pos != a.seq - 1).float()  # the last token has no next token
        with torch.autocast(device.split(":")[0], dtype=dtype, enabled=cuda):
            logits = model(mine, pos, ring=True)
        ce = F.cross_entropy(logits.float().transpose(1, 2), my_labels, reduction="none")
        loss = (ce * weight).sum() / (a.seq - 1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
        total = loss.detach().clone()
        dist.all_reduce(total)
        if a.check and step == 0:
            check(model, tokens, labels, float(total), device)
        opt.step()
        first = float(total) if step == 0 else first
        last = float(total)
        if rank == 0 and (step % 10 == 0 or step == a.steps - 1):
            print(f"step {step:4d} loss {last:.4f}", flush=True)
    if rank == 0:
        print(f"done: {world} ranks, {a.seq} tokens, loss {first:.4f} -> {last:.4f} "
              f"(uniform guess {math.log(a.vocab):.4f})", flush=True)  # fmt: skip
    # What the run still holds (the model, the optimizer, garbage cycles that keep finished
    # gloo work alive) goes while the process group exists: collected only at interpreter exit,
    # after destroy_process_group, it aborted about one run in ten ("terminate called without an
    # active exception" after main returned; none in 30 runs with this). Then every rank
    # reaches the teardown before any tears down: with gloo, a rank that exits first closes its
    # sockets under the others' background threads.
    del model, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def check(model: Model, tokens: torch.Tensor, labels: torch.Tensor, ring_loss: float,
          device: str) -> None:  # fmt: skip
    """The whole sequence in one process with plain attention: the same loss and gradients
    (float32 CPU runs; the summed ring gradients are in the parameters' .grad)."""
    ring_grads = [p.grad.detach().clone() for p in model.parameters()]
    seq = tokens.shape[1]
    pos = torch.arange(seq, device=device).unsqueeze(0)
    model.zero_grad(set_to_none=True)
    logits = model(tokens, pos, ring=False)
    loss = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels[:, :-1])
    loss.backward()
    whole = float(loss.detach())
    params = list(model.parameters())
    worst = max(float((g - p.grad).abs().max()) for g, p in zip(ring_grads, params, strict=True))
    assert abs(whole - ring_loss) < 1e-4, (whole, ring_loss)
    assert worst < 1e-4, worst
    for g, p in zip(ring_grads, params, strict=True):  # the step goes on with the ring's
        p.grad = g
    if dist.get_rank() == 0:
        print(f"check: one process's loss {whole:.6f} = the ring's {ring_loss:.6f}; "
              f"gradients differ by at most {worst:.2e}", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
