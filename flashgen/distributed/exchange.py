"""The ring's communication: each rank sends tensors to the next rank and receives the same
shapes from the previous one, asynchronously, through torch.distributed's point-to-point ops.

With NCCL the sends and receives of one exchange go out as one batch
(`dist.batch_isend_irecv`) and run on NCCL's own stream, so a ring step's kernels on the
compute stream overlap the next step's transfer; `Pending.wait()` makes the current stream
wait for the transfer (the host does not block). With gloo (CPU clusters, tests) each tensor is
an `isend`/`irecv` pair; CUDA tensors are staged through host memory there, since gloo's
point-to-point ops take CPU tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


class Pending:
    """An exchange in flight: `wait()` returns the received tensors (on the sent ones'
    devices), after which they are safe to read on the current stream."""

    def __init__(
        self, works: list[Any], received: list[Any], devices: list[Any], sent: list[Any]
    ) -> None:
        self._works = works
        self._sent = sent  # kept alive until the transfer is waited for
        self._received = received
        self._devices = devices

    def wait(self) -> list[Any]:
        """Wait for the transfer; the received tensors."""
        for w in self._works:
            w.wait()
        # the finished work and the sent copies are dropped now, not whenever this object
        # goes: a gloo work still alive after destroy_process_group can abort the process
        # at exit
        self._works, self._sent = [], []
        return [
            r if r.device == d else r.to(d, non_blocking=False)
            for r, d in zip(self._received, self._devices, strict=True)
        ]


class RingExchange:
    """Point-to-point exchanges around the ring of `group` (the default group when None):
    rank r sends to r + 1 and receives from r - 1 (mod the group's size)."""

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        nxt, prev = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        # point-to-point ops name peers by global rank
        self._next = dist.get_global_rank(group, nxt) if group is not None else nxt
        self._prev = dist.get_global_rank(group, prev) if group is not None else prev
        self._nccl = dist.get_backend(group) == "nccl"

    def start(self, tensors: Sequence[Any]) -> Pending:
        """Send `tensors` to the next rank and start receiving the previous rank's (same
        shapes and dtypes); returns at once."""
        devices = [t.device for t in tensors]
        if self._nccl:
            sends = [t.contiguous() for t in tensors]
            received = [torch.empty_like(t) for t in sends]
            ops = [dist.P2POp(dist.isend, t, self._next, self.group) for t in sends]
            ops += [dist.P2POp(dist.irecv, r, self._prev, self.group) for r in received]
            return Pending(dist.batch_isend_irecv(ops), received, devices, sends)
        sends = [t.detach().to("cpu").contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in sends]
        works = []
        # the even ranks send first, the odd ones receive first: no reliance on buffering
        for t, r in zip(sends, received, strict=True):
            pair = [
                lambda t=t: dist.isend(t, self._next, self.group),
                lambda r=r: dist.irecv(r, self._prev, self.group),
            ]
            for op in pair if self.rank % 2 == 0 else reversed(pair):
                works.append(op())
        return Pending(works, received, devices, sends)
